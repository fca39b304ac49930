"""Slurm node hooks: the Epilog that kills what a finished job left behind, and a fast
HealthCheckProgram.

Both run on the node as root, started by slurmd: ``gpufleet slurm epilog`` /
``gpufleet slurm healthcheck``, or ``python -m gpufleet.agent.slurm_hooks epilog`` for
the quickest start (only the standard library is imported until there is something to
report).

**Epilog.** slurmd runs it after every job with ``SLURM_JOB_ID``, ``SLURM_JOB_UID`` and
``SLURMD_NODENAME`` set. The job's processes are found three ways, and all are killed:

* the job's cgroup (cgroup v1 ``/sys/fs/cgroup/<controller>/slurm*/uid_*/job_<id>``,
  cgroup v2 ``.../slurmstepd.scope/job_<id>``), where proctrack/cgroup keeps them;
* every process whose environment has ``SLURM_JOB_ID=<id>`` (and this node's
  ``SLURMD_NODENAME`` when set: nodes may share a kernel) — a ``setsid`` double fork
  escapes proctrack/linuxproc's process tree but keeps its environment;
* their descendants, whatever their environment.

Never itself, its ancestors, slurmd or slurmstepd. SIGTERM first, SIGKILL after
``grace_s``. What was killed goes to the agent's outbox as a ``node.cleanup`` event
(the running agent sends it). It exits 0 whatever happens: a non-zero Epilog drains the
node, and a cleanup hiccup must never take a node out of service.

**Healthcheck.** slurmd runs it every ``HealthCheckInterval`` on every node, with an
empty environment except ``SLURMD_NODENAME``. It reads the agent's open findings
(``<state_dir>/open-findings.json``, local, no network) and, when one is fatal or
critical hardware trouble, drains the node with reason ``gpufleet: healthcheck
<signature>``, so no new job lands there before the control plane acts. It never
touches a node drained or down for anyone else's reason, and it resumes only its own
drain once the finding has cleared.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.core.holds import HoldKind, healthcheck_hold, parse_hold_reason

DEFAULT_STATE_DIR = Path("/var/lib/gpufleet-agent")
_NEVER_KILL = frozenset({"slurmd", "slurmstepd", "slurmctld", "munged"})
_BAD_SEVERITIES = frozenset({"fatal", "critical"})
# Findings that are about Slurm's own view (a foreign drain) never make a drain here.
_NOT_HARDWARE_SOURCES = frozenset({"scheduler"})
CGROUP_ROOT = Path("/sys/fs/cgroup")


def state_dir_from(env: Mapping[str, str], given: Path | None) -> Path:
    if given is not None:
        return given
    configured = env.get("GPUFLEET_AGENT_STATE_DIR")
    return Path(configured) if configured else DEFAULT_STATE_DIR


# -- processes ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Proc:
    pid: int
    ppid: int
    comm: str
    uid: int
    state: str  # R, S, Z, T ...


def read_proc(pid: int, proc_root: Path = Path("/proc")) -> Proc | None:
    try:
        stat = (proc_root / str(pid) / "stat").read_text()
        status = (proc_root / str(pid) / "status").read_text()
    except OSError:
        return None
    # comm may hold spaces and parentheses: it is everything between the first "(" and
    # the last ")".
    comm = stat[stat.find("(") + 1 : stat.rfind(")")]
    rest = stat[stat.rfind(")") + 2 :].split()
    uids = [line.split()[1] for line in status.splitlines() if line.startswith("Uid:")]
    uid = int(uids[0]) if uids else -1
    return Proc(pid=pid, ppid=int(rest[1]), comm=comm, uid=uid, state=rest[0])


def all_pids(proc_root: Path = Path("/proc")) -> list[int]:
    return [int(p.name) for p in proc_root.iterdir() if p.name.isdigit()]


def environ_has(pid: int, wanted: Sequence[bytes], proc_root: Path = Path("/proc")) -> bool:
    try:
        entries = set((proc_root / str(pid) / "environ").read_bytes().split(b"\0"))
    except OSError:
        return False
    return all(w in entries for w in wanted)


def ancestors(pid: int, procs: Mapping[int, Proc]) -> set[int]:
    seen: set[int] = set()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        parent = procs.get(pid)
        if parent is None:
            break
        pid = parent.ppid
    return seen


def cgroup_pids(job_id: str, root: Path = CGROUP_ROOT) -> tuple[set[int], list[str]]:
    """Pids in the job's cgroups (v1 any controller, and v2), and the cgroups read."""
    patterns = [
        f"{root}/*/slurm*/uid_*/job_{job_id}",  # v1: slurm/ or slurm_<node>/ roots
        f"{root}/slurm*/uid_*/job_{job_id}",  # v2 with a slurm/ root
        f"{root}/**/slurmstepd.scope/job_{job_id}",  # v2 under systemd
    ]
    pids: set[int] = set()
    used: list[str] = []
    for pattern in patterns:
        for job_dir in glob.glob(pattern, recursive=True):
            used.append(job_dir)
            for procs_file in glob.glob(f"{job_dir}/**/cgroup.procs", recursive=True):
                try:
                    text = Path(procs_file).read_text()
                except OSError:
                    continue
                pids.update(int(p) for p in text.split() if p.isdigit())
    return pids, sorted(set(used))


@dataclass
class Cleanup:
    job_id: str
    node: str | None
    found_by: dict[int, str] = field(default_factory=dict)  # pid → cgroup | environ | tree
    killed: list[Proc] = field(default_factory=list)
    survivors: list[int] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)


def find_leftovers(
    job_id: str,
    node: str | None,
    *,
    me: int | None = None,
    proc_root: Path = Path("/proc"),
    cgroup_root: Path = CGROUP_ROOT,
) -> tuple[Cleanup, dict[int, Proc]]:
    me = os.getpid() if me is None else me
    procs = {p.pid: p for pid in all_pids(proc_root) if (p := read_proc(pid, proc_root))}
    spared = ancestors(me, procs)
    result = Cleanup(job_id=job_id, node=node)
    in_cgroup, result.cgroups = cgroup_pids(job_id, cgroup_root)
    for pid in in_cgroup:
        result.found_by.setdefault(pid, "cgroup")
    wanted = [f"SLURM_JOB_ID={job_id}".encode()]
    if node:
        wanted.append(f"SLURMD_NODENAME={node}".encode())
    for pid in procs:
        if pid not in result.found_by and environ_has(pid, wanted, proc_root):
            result.found_by[pid] = "environ"
    # descendants of what was found, whatever their environment
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    queue = list(result.found_by)
    while queue:
        for child in children.get(queue.pop(), []):
            if child not in result.found_by:
                result.found_by[child] = "tree"
                queue.append(child)
    for pid in list(result.found_by):
        p = procs.get(pid)
        if pid in spared or p is None or p.comm in _NEVER_KILL or p.state == "Z" or pid == 1:
            del result.found_by[pid]
    return result, procs


def _alive(pid: int, proc_root: Path = Path("/proc")) -> bool:
    p = read_proc(pid, proc_root)
    return p is not None and p.state not in ("Z", "X")


def kill_all(pids: Iterable[int], *, grace_s: float) -> tuple[list[int], list[int]]:
    """SIGTERM, wait up to ``grace_s``, SIGKILL the rest. Returns (signalled, survivors)."""
    signalled = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            signalled.append(pid)
        except ProcessLookupError:
            continue
        except PermissionError:
            continue
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in signalled):
        time.sleep(0.05)
    for pid in signalled:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline and any(_alive(p) for p in signalled):
        time.sleep(0.05)
    return signalled, [p for p in signalled if _alive(p)]


def epilog(
    env: Mapping[str, str], *, state_dir: Path | None = None, grace_s: float = 2.0
) -> Cleanup | None:
    """Kill the finished job's leftovers and report them. Never raises for a bad node."""
    job_id = env.get("SLURM_JOB_ID", "").strip()
    if not job_id.isdigit():
        print("gpufleet epilog: no SLURM_JOB_ID; nothing to clean", file=sys.stderr)
        return None
    node = env.get("SLURMD_NODENAME") or None
    result, procs = find_leftovers(job_id, node)
    if not result.found_by:
        return result
    signalled, result.survivors = kill_all(sorted(result.found_by), grace_s=grace_s)
    result.killed = [procs[p] for p in signalled if p in procs]
    summary = ", ".join(f"{p.pid}({p.comm})" for p in result.killed[:20])
    message = (
        f"killed {len(result.killed)} process(es) left behind by Slurm job {job_id}"
        f"{' on ' + node if node else ''}: {summary}"
        + (f"; {len(result.survivors)} survived SIGKILL" if result.survivors else "")
    )
    print(f"gpufleet epilog: {message}", file=sys.stderr)
    try:
        from gpufleet.agent.outbox import queue_event
        from gpufleet.core.agent_protocol import AgentEventKind

        queue_event(
            state_dir_from(env, state_dir),
            AgentEventKind.CLEANUP,
            message,
            {
                "job_id": job_id,
                "node": node or "",
                "pids": " ".join(str(p.pid) for p in result.killed),
                "commands": " ".join(sorted({p.comm for p in result.killed})),
                "found_by": " ".join(sorted(set(result.found_by.values()))),
                "survivors": len(result.survivors),
            },
        )
    except Exception as exc:  # noqa: BLE001 - report, never fail the epilog
        print(f"gpufleet epilog: could not queue the event: {exc!r}", file=sys.stderr)
    return result


# -- healthcheck ----------------------------------------------------------------------


def bad_findings(state_dir: Path) -> list[dict[str, object]]:
    """Open fatal/critical hardware findings in the agent's snapshot (none if unreadable)."""
    try:
        data = json.loads((state_dir / "open-findings.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    items = data.get("open", []) if isinstance(data, dict) else data
    return [
        f
        for f in items
        if isinstance(f, dict)
        and f.get("severity") in _BAD_SEVERITIES
        and f.get("source") not in _NOT_HARDWARE_SOURCES
    ]


def _scontrol(*args: str, timeout_s: float = 10.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - fixed argv, no shell
        ["scontrol", *args],  # noqa: S607 - Slurm's client from PATH
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def node_state(node: str) -> tuple[set[str], str]:
    """(state flags, reason) from ``scontrol -o show node``; raises on failure."""
    out = _scontrol("-o", "show", "node", node)
    if out.returncode != 0:
        raise RuntimeError(f"scontrol show node {node}: {out.stderr.strip()}")
    line = out.stdout
    state = line.split(" State=", 1)[1].split()[0] if " State=" in line else ""
    flags = {s.rstrip("*~#!%$@^-").upper() for s in state.split("+") if s}
    reason = ""
    if " Reason=" in line:
        reason = line.split(" Reason=", 1)[1]
        reason = reason.rsplit(" [", 1)[0].strip() if reason.rstrip().endswith("]") else reason
    return flags, reason.strip()


def healthcheck(env: Mapping[str, str], *, state_dir: Path | None = None) -> str:
    """Drain for a bad finding, resume our own drain when it cleared; say what was done."""
    node = env.get("SLURMD_NODENAME", "").strip()
    if not node:
        return "no SLURMD_NODENAME; nothing checked"
    bad = bad_findings(state_dir_from(env, state_dir))
    flags, reason = node_state(node)
    held = bool(flags & {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL"})
    parsed = parse_hold_reason(reason)
    ours = parsed is not None and parsed.kind is HoldKind.HEALTHCHECK
    if bad and not held:
        signatures = sorted({str(f.get("signature_id", "?")) for f in bad})
        new_reason = healthcheck_hold(signatures).text
        out = _scontrol("update", f"nodename={node}", "state=drain", f"reason={new_reason}")
        if out.returncode != 0:
            raise RuntimeError(f"scontrol update {node} drain: {out.stderr.strip()}")
        return f"drained {node}: {new_reason}"
    if not bad and held and ours and "DOWN" not in flags:
        out = _scontrol("update", f"nodename={node}", "state=resume")
        if out.returncode != 0:
            raise RuntimeError(f"scontrol update {node} resume: {out.stderr.strip()}")
        return f"resumed {node}: its findings cleared"
    return f"{node}: {'held' if held else 'ok'} ({len(bad)} bad finding(s); reason {reason!r})"


# -- entry point ----------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpufleet-slurm-hooks", description=__doc__)
    parser.add_argument("hook", choices=["epilog", "healthcheck"])
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--grace-s", type=float, default=2.0)
    args = parser.parse_args(argv)
    return run(args.hook, state_dir=args.state_dir, grace_s=args.grace_s)


def run(hook: str, *, state_dir: Path | None, grace_s: float = 2.0) -> int:
    """Run one hook. The epilog always returns 0; the healthcheck returns 0 unless it
    could not read or change the node (slurmd logs a failing HealthCheckProgram)."""
    started = time.monotonic()
    if hook == "epilog":
        try:
            epilog(os.environ, state_dir=state_dir, grace_s=grace_s)
        except Exception as exc:  # noqa: BLE001 - a cleanup hiccup never drains the node
            print(f"gpufleet epilog: failed: {exc!r}", file=sys.stderr)
        return 0
    try:
        said = healthcheck(os.environ, state_dir=state_dir)
    except Exception as exc:  # noqa: BLE001 - say it; the node is left as it was
        print(f"gpufleet healthcheck: {exc}", file=sys.stderr)
        return 1
    elapsed_ms = (time.monotonic() - started) * 1000
    print(f"gpufleet healthcheck: {said} ({elapsed_ms:.0f} ms)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
