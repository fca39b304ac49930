"""This node's Slurm state, from ``scontrol show node <host>`` (JSON, else text).

Reports the ``slurm_node_reason`` condition every sample it can read: active when the
node is drained or down, with the state and reason for the catalog's rules to test.
Reasons that start with ``gpufleet:`` are gpufleet's own drains; the rules exclude
them, so the agent never reports its own repair as a foreign drain. Without
``scontrol`` the collector turns itself off and says so once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import re
import shutil
import socket
from dataclasses import dataclass, field

from gpufleet.agent.collectors.base import CollectorResult, Condition

log = logging.getLogger(__name__)

_STATE = re.compile(r"\bState=(\S+)")
_GRES = re.compile(r"\bGres=(\S*)")
_FEATURES = re.compile(r"\bAvailableFeatures=(\S*)")
_REASON = re.compile(r"\bReason=(.*?)(?:\s+\[[^\]]*@[^\]]*\])?\s*$", re.M)


@dataclass(frozen=True, slots=True)
class SlurmNode:
    states: frozenset[str]  # upper case: IDLE, DRAIN, DOWN, NOT_RESPONDING, ...
    reason: str
    gres: str = ""  # as Slurm prints it: "gpu:h100:8(S:0-1),nic:2"
    features: tuple[str, ...] = ()

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.states

    @property
    def state(self) -> str:
        """``down`` / ``drain`` / ``up``: what the catalog's rules test."""
        if "DOWN" in self.states:
            return "down"
        if self.states & {"DRAIN", "DRAINED", "DRAINING"}:
            return "drain"
        return "up"


def parse_json(text: str) -> SlurmNode | None:
    data = json.loads(text)
    nodes = data.get("nodes") or []
    if not nodes:
        return None
    node = nodes[0]
    state = node.get("state", [])
    states = [state] if isinstance(state, str) else list(state)
    states += list(node.get("state_flags") or [])  # 22.05's sinfo form: flags apart
    features = node.get("features") or []
    if isinstance(features, str):
        features = features.split(",")
    return SlurmNode(
        frozenset(str(s).upper() for s in states),
        str(node.get("reason") or ""),
        gres=str(node.get("gres") or ""),
        features=tuple(str(f) for f in features if f),
    )


def parse_text(text: str) -> SlurmNode | None:
    m = _STATE.search(text)
    if m is None:
        return None
    parts = m[1].split("+")
    states = {p.rstrip("*~#@!%$^-").upper() for p in parts}
    if any(p.endswith("*") for p in parts):
        states.add("NOT_RESPONDING")  # the text form's "*" suffix
    r = _REASON.search(text)
    reason = r[1].strip() if r else ""
    g = _GRES.search(text)
    gres = g[1] if g and g[1] not in ("(null)", "N/A") else ""
    f = _FEATURES.search(text)
    features = () if f is None or f[1] in ("(null)", "") else tuple(f[1].split(","))
    return SlurmNode(
        frozenset(states),
        "" if reason in ("(null)", "None") else reason,
        gres=gres,
        features=features,
    )


@dataclass
class SlurmCollector:
    hostname: str = field(default_factory=socket.gethostname)
    scontrol: str = "scontrol"
    timeout_s: float = 10.0
    name: str = "slurm"
    _disabled: bool = False
    _json: bool = True
    # the node as last read (None before the first read, or when unreadable): the
    # daemon supervisor and the GPU-state check use it without asking Slurm again
    last: SlurmNode | None = None

    async def collect(self, now: dt.datetime) -> CollectorResult:
        del now
        result = CollectorResult()
        if self._disabled:
            return result
        if shutil.which(self.scontrol) is None:
            log.info("scontrol not found: the Slurm collector is off on this node")
            self._disabled = True
            return result
        node = await self._read()
        self.last = node
        if node is not None:
            active = node.state in ("down", "drain")
            result.conditions.append(
                Condition(
                    "slurm_node_reason",
                    active,
                    f"State={'+'.join(sorted(node.states))} Reason={node.reason}",
                    attrs={"state": node.state, "reason": node.reason},
                )
            )
        return result

    async def _read(self) -> SlurmNode | None:
        args = [self.scontrol, "show", "node", self.hostname]
        if self._json:
            args.append("--json")
        proc = await asyncio.create_subprocess_exec(
            *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            log.warning("scontrol show node %s timed out", self.hostname)
            return None
        if proc.returncode != 0:
            if self._json:
                self._json = False  # old Slurm without --json: use the text form
                return await self._read()
            log.warning("scontrol show node %s: %s", self.hostname, err.decode().strip())
            return None
        text = out.decode(errors="replace")
        try:
            return parse_json(text) if self._json else parse_text(text)
        except ValueError:
            self._json = False
            return await self._read()

    async def close(self) -> None:
        return None
