"""GPU state refresh: does Slurm's idea of this node's GPUs match the hardware?

After every sample the agent holds both views: the GPUs its collectors saw (count,
UUIDs, model) and the node as the Slurm collector last read it (``Gres=gpu:h100:8``,
features, state flags, reason). They are compared every cycle — cheaply, Slurm is not
asked again — and three conditions are reported (each a finding while it holds):

* ``count_high`` — Slurm offers more GPUs than the node has: jobs would be placed on
  GPUs that are not there (``slurm-gres-more-than-hardware``, critical, reboot);
* ``count_low`` — the node has more GPUs than Slurm counts: capacity lost
  (``slurm-gres-fewer-than-hardware``, warning);
* ``type`` — the GRES type or a GPU-model feature names another GPU than the hardware's
  (``slurm-gres-type-mismatch``, warning): a configuration error.

What Slurm 22.05 does (tried on the lab): ``Gres=`` always shows the *configured* count.
A slurmd that finds fewer GPUs than configured is refused: the node turns
``DRAIN+INVALID_REG`` with Slurm's reason ``gres/gpu count reported lower than configured
(6 < 8)``, so "Slurm's count" is the registered 6 while ``INVALID_REG`` is set. Once the
GPUs are back, a slurmd restart registers them and clears ``INVALID_REG`` — but the DRAIN
and its reason stay (not ours to clear: its reason does not start with ``gpufleet:``).
A slurmd finding *more* than configured is accepted silently; Slurm keeps offering the
configured count, and no restart changes that. ``scontrol update nodename=X gres=gpu:h100:6``
is refused with File-based GRES ("Invalid generic resource specification"); ``scontrol
reconfigure`` also makes slurmd register again, but for the whole cluster — not an agent's
call.

So ``count_low`` is the one thing the agent tries to fix: when it first appears for a GPU
set (agent start, a GPU set change), the configured command (default: slurmd's restart)
runs once in the background — sampling goes on — and the condition is held back until
Slurm agrees (a "fixed" event) or ``verify_s`` passed (a "did not take" event, and the
condition is raised). ``count_high`` and ``type`` are never the agent's to fix. Each new
mismatch, each fix and each return to agreement is a ``node.gpu_state`` event.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.agent.collectors.base import CollectorResult, Condition, Sample
from gpufleet.agent.collectors.slurm import SlurmCollector, SlurmNode
from gpufleet.agent.outbox import queue_event
from gpufleet.core.agent_protocol import AgentEventKind

log = logging.getLogger(__name__)

CONDITION = "slurm_gres_mismatch"
KINDS = ("count_high", "count_low", "type")
# a GPU family as GRES types, features and NVML model names spell it: h100, a100, l40...
_FAMILY = r"(?:gb|gh|[abhlvtk])\d{2,3}"
_GPU_FEATURE = re.compile(rf"(?i)^(?:gpu[_-]?|nvidia[_-]?)?({_FAMILY}[a-z]*)$")
_TYPE_FAMILY = re.compile(rf"(?i)^({_FAMILY})")
# slurmctld's reason when it refused a registration (src/common/gres.c, 22.05)
_REPORTED_LOWER = re.compile(r"gres/gpu count reported lower than configured \((\d+) < (\d+)\)")
_COUNT = re.compile(r"(\d+)([kKmMgG]?)")
_MULTIPLIER = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}


@dataclass(frozen=True, slots=True)
class SlurmGpus:
    count: int  # as configured (what ``Gres=`` shows)
    types: frozenset[str]  # lower case, from GRES types and GPU-model features
    registered: int | None = None  # slurmd's count when slurmctld refused it (INVALID_REG)

    @property
    def offered(self) -> int:
        """The GPUs Slurm counts for this node now."""
        return self.count if self.registered is None else self.registered


def parse_gres(gres: str, features: Sequence[str] = ()) -> SlurmGpus:
    """``gpu:h100:8(S:0-1),gpu:a100:2,nic:1`` → 10 GPUs of types {h100, a100}.

    ``gpu:8`` has no type; a count with a suffix (``8(S:0)``) or a ``K`` multiplier
    is read as Slurm prints it. Non-GPU GRES are ignored; so is a feature that names
    no GPU family (``ib``, ``gpu``).
    """
    count = 0
    types: set[str] = set()
    for entry in re.split(r",(?![^(]*\))", gres):
        fields = entry.split("(", 1)[0].strip().split(":")
        if fields[0] != "gpu":
            continue
        m = _COUNT.fullmatch(fields[-1]) if len(fields) >= 2 else None
        if m is None:
            continue  # gpu or gpu:h100 with no count: Slurm would say 1, but do not guess
        count += int(m[1]) * _MULTIPLIER[m[2].lower()]
        if len(fields) == 3:
            types.add(fields[1].lower())
    for feature in features:
        f = _GPU_FEATURE.match(feature.strip())
        if f:
            types.add(f[1].lower())
    return SlurmGpus(count=count, types=frozenset(types))


def slurm_gpus(node: SlurmNode) -> SlurmGpus:
    """Slurm's GPUs for ``node``: the configured GRES, and while the registration is
    refused (``INVALID_REG``), the count slurmd reported, from Slurm's reason."""
    gpus = parse_gres(node.gres, node.features)
    m = _REPORTED_LOWER.search(node.reason)
    if "INVALID_REG" in node.states and m is not None:
        return SlurmGpus(gpus.count, gpus.types, registered=int(m[1]))
    return gpus


def model_matches(slurm_type: str, model: str) -> bool:
    """``h100`` and ``h100_80gb`` name ``NVIDIA H100 80GB HBM3``; ``a10`` names not
    ``NVIDIA A100``. A type naming no GPU family (``tesla``, MIG-only names) matches."""
    family = _TYPE_FAMILY.match(slurm_type)
    if family is None:
        return True  # nothing to judge it by
    want = family[1].lower()
    words = re.findall(r"[a-z0-9]+", model.lower())
    return any(w == want or (w.startswith(want) and not w[len(want)].isdigit()) for w in words)


@dataclass(frozen=True, slots=True)
class Comparison:
    slurm: SlurmGpus
    hw_count: int
    hw_models: frozenset[str]

    @property
    def slurm_says(self) -> str:
        if self.slurm.registered is not None:
            return (
                f"Slurm offers {self.slurm.registered} GPU(s) (slurmd registered "
                f"{self.slurm.registered} of the {self.slurm.count} configured)"
            )
        return f"Slurm offers {self.slurm.count} GPU(s)"

    @property
    def mismatches(self) -> dict[str, str]:
        """kind → what disagrees, in words."""
        out: dict[str, str] = {}
        offered = self.slurm.offered
        if offered > self.hw_count:
            out["count_high"] = f"{self.slurm_says}; the node has {self.hw_count}"
        elif offered < self.hw_count:
            out["count_low"] = f"{self.slurm_says}; the node has {self.hw_count}"
        wrong = sorted(
            t for t in self.slurm.types if not any(model_matches(t, m) for m in self.hw_models)
        )
        if wrong and self.hw_models:
            out["type"] = (
                f"Slurm says {', '.join(wrong)}; the node has {', '.join(sorted(self.hw_models))}"
            )
        return out


def compare(node: SlurmNode, gpus: Sequence[Sample]) -> Comparison:
    models = frozenset(s.model for s in gpus if s.model)
    return Comparison(slurm_gpus(node), len(gpus), models)


@dataclass(frozen=True, slots=True)
class FixRun:
    ok: bool
    output: str  # the command's output tail, or why it could not run


@dataclass(slots=True)
class _Fix:
    task: asyncio.Task[FixRun]
    deadline: float | None = None  # set when the command is done: Slurm must agree by then
    outcome: FixRun | None = None


@dataclass(slots=True)
class GresCheck:
    """Called by the agent after each sample with what the collectors returned.

    ``fix_command`` (argv; empty: never fix) runs at most once per GPU set, with
    ``fix_timeout_s``; Slurm must then agree within ``verify_s``. ``monotonic`` is the
    clock those two are measured on (tests pass a fake one).
    """

    slurm: SlurmCollector
    state_dir: Path
    fix_command: Sequence[str] = ()
    fix_timeout_s: float = 60.0
    verify_s: float = 30.0
    monotonic: Callable[[], float] = time.monotonic
    _gpu_set: tuple[str, ...] | None = field(default=None, init=False)
    _tried: tuple[str, ...] | None = field(default=None, init=False)  # the set a fix ran for
    _fix: _Fix | None = field(default=None, init=False)
    _reported: frozenset[str] = field(default=frozenset(), init=False)

    async def observe(self, result: CollectorResult) -> list[Condition]:
        node = self.slurm.last
        gpus = [s for s in result.samples if s.scope == "gpu"]
        if node is None or (not gpus and self._gpu_set is None):
            # no Slurm view (not a Slurm node, scontrol failing): nothing to compare;
            # no GPU seen yet: an agent without a GPU collector must not claim 0 GPUs
            return []
        comparison = compare(node, gpus)
        found = comparison.mismatches
        self._gpu_set = tuple(sorted(s.gpu_uuid or str(s.gpu_index) for s in gpus))
        if self._fixing(found, comparison):
            found.pop("count_low", None)  # held back while the fix may still take
        self._report_changes(found, node, comparison)
        evidence = (
            f"Slurm Gres={node.gres or '(none)'} State={'+'.join(sorted(node.states))} "
            f"features={','.join(node.features) or '(none)'}; hardware {comparison.hw_count} "
            f"GPU(s): {', '.join(sorted(comparison.hw_models)) or 'model unknown'}"
        )
        return [
            Condition(
                CONDITION,
                kind in found,
                f"{found[kind]} ({evidence})" if kind in found else evidence,
                component=f"slurm-gres-{kind.replace('_', '-')}",
                attrs={
                    "mismatch": kind,
                    "slurm_count": str(comparison.slurm.offered),
                    "hw_count": str(comparison.hw_count),
                    "slurm_type": ",".join(sorted(comparison.slurm.types)),
                    "hw_model": ",".join(sorted(comparison.hw_models)),
                },
            )
            for kind in KINDS
        ]

    def _fixing(self, found: dict[str, str], comparison: Comparison) -> bool:
        """Start, follow and judge the fix for ``count_low``: True while it is pending."""
        fix = self._fix
        if fix is None:
            if "count_low" not in found or not self.fix_command or self._tried == self._gpu_set:
                return False
            self._tried = self._gpu_set
            self._fix = _Fix(asyncio.create_task(self._run_fix(comparison)))
            return True
        if not fix.task.done():
            return True
        if fix.outcome is None:
            crashed = fix.task.cancelled() or fix.task.exception() is not None
            fix.outcome = FixRun(False, "the fix crashed") if crashed else fix.task.result()
            fix.deadline = self.monotonic() + self.verify_s
        assert fix.deadline is not None
        if "count_low" not in found:
            self._fix = None
            self._queue(
                f"GPU state fixed: Slurm counts all {comparison.hw_count} GPUs again",
                self._data(comparison) | {"fixed": True},
            )
            return False
        if fix.outcome.ok and self.monotonic() < fix.deadline:
            return True
        self._fix = None  # raised now, with the first-seen event saying what was tried
        found["count_low"] += (
            f"; `{' '.join(self.fix_command)}` did not fix it"
            + (f" ({fix.outcome.output})" if not fix.outcome.ok else "")
            + ": slurm.conf/gres.conf may configure fewer GPUs than the node has"
        )
        return False

    async def _run_fix(self, comparison: Comparison) -> FixRun:
        command = " ".join(self.fix_command)
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.fix_command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,  # a slurmd it starts must not die with the agent
            )
        except OSError as exc:
            run = FixRun(False, f"cannot run {command}: {exc}")
        else:
            try:
                out, _ = await asyncio.wait_for(proc.communicate(), self.fix_timeout_s)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                run = FixRun(False, f"{command} took over {self.fix_timeout_s:g} s")
            else:
                text = out.decode(errors="replace").strip()[-300:]
                run = FixRun(proc.returncode == 0, text or f"exit {proc.returncode}")
        message = (
            f"{comparison.slurm_says} but the node has {comparison.hw_count}: ran `{command}` "
            "so slurmd registers them again" + ("" if run.ok else f"; it failed: {run.output}")
        )
        log.warning(message)
        self._queue(message, {"command": command, "ok": run.ok, "output": run.output})
        return run

    def _report_changes(
        self, found: dict[str, str], node: SlurmNode, comparison: Comparison
    ) -> None:
        """An event for each mismatch first seen, and one when the views agree again."""
        new = [kind for kind in KINDS if kind in found and kind not in self._reported]
        if new:
            self._queue(
                "GPU state: " + "; ".join(found[kind] for kind in new),
                self._data(comparison) | {"slurm_gres": node.gres},
            )
        elif self._reported and not found:
            self._queue("GPU state: Slurm and the hardware agree again", self._data(comparison))
        self._reported = frozenset(found)

    def _queue(self, message: str, data: dict[str, str | int | float | bool]) -> None:
        try:
            queue_event(self.state_dir, AgentEventKind.GPU_STATE, message, data)
        except OSError:
            log.exception("could not queue the GPU state event %r", message)

    @staticmethod
    def _data(comparison: Comparison) -> dict[str, str | int | float | bool]:
        return {
            "slurm_gpus": comparison.slurm.offered,
            "slurm_configured_gpus": comparison.slurm.count,
            "hardware_gpus": comparison.hw_count,
            "hardware_models": ", ".join(sorted(comparison.hw_models)),
        }
