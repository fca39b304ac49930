"""Checks as a Slurm job in a reservation on the nodes, on Slurm clusters.

``start``: reserve the nodes (``gpufleet-check-<run id>``, ``Flags=MAINT``: no other job
lands there, and without ``IGNORE_JOBS`` Slurm refuses nodes a job took since the idle
check, so no running job is ever disturbed; a forced run adds ``IGNORE_JOBS`` and its job
waits for, or shares, the nodes), write the batch script next to its outputs, and
``sbatch`` it into the reservation (or find the job a crashed server submitted before).
The script starts every invocation with ``srun`` on its node (a multi-node NCCL run with
one srun across the nodes), each under ``timeout``, its stdout, stderr and exit status in
``<output dir>/<invocation>.{out,err,rc}``.

``poll``: the job's state (``scontrol show job``, then ``sacct``); once it ended, the
output files are read and the reservation is deleted. Restarted servers find stale
``gpufleet-check-*`` reservations of runs that ended and delete them
(``cleanup_stale``).

The output directory must be one the job's nodes write and this server reads. The lab
runs both on one host; in production it is shared storage (``checks_output_dir`` on NFS
or Lustre). Reading the outputs back through ``sacct`` is no option (Slurm keeps no job
output), nor through the agent without a round trip per file; docs/checks.md says more.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpufleet.checks.aggregate import RAW_LIMIT, InvocationOutput
from gpufleet.checks.runners import CheckPlan, Invocation, Launcher
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import BatchJobSpec, SupportsJobs, SupportsReservations
from gpufleet.server.services.check_backends.base import BackendJob, Polled, StartRefused

RESERVATION_PREFIX = "gpufleet-check-"
RESERVATION_MARGIN_S = 600.0  # the reservation outlives the job's own time limit
JOB_MARGIN_S = 300.0  # the job's time limit over the invocations' timeouts
CLIENT_DELAY_S = 2  # ib_write_bw clients start after their servers
TIMEOUT_EXIT = 124  # coreutils `timeout`: the command ran out of time
_BUSY = ("busy", "Requested nodes are busy")


def reservation_name(run_id: str) -> str:
    return RESERVATION_PREFIX + run_id


def render_script(plan: CheckPlan, *, run_id: str, output_dir: Path) -> str:
    """The batch script: every invocation in the background, ``after`` ones a moment
    later, each under ``timeout`` with its output and exit status in files; then wait."""
    q = shlex.quote
    nodes = ",".join(dict.fromkeys(n for i in plan.invocations for n in i.nodes))
    lines = [
        "#!/bin/bash",
        f"# gpufleet check run {run_id}: {plan.kind.value} on {nodes}",
        "# Written by gpufleet (docs/checks.md); each invocation's stdout, stderr and exit",
        "# status go to <id>.out, <id>.err and <id>.rc next to this file.",
        f"out={q(str(output_dir))}",
        "run() {",
        '  local id="$1" limit="$2"; shift 2',
        '  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$out/$id.out" 2>"$out/$id.err"',
        '  echo $? >"$out/$id.rc"',
        "}",
    ]

    def line(inv: Invocation) -> str:
        env = [f"{k}={v}" for k, v in sorted(inv.env.items())]
        argv = (["env", *env] if env else []) + list(inv.argv)
        return f"run {q(inv.id)} {int(inv.timeout_s)} {shlex.join(argv)} &"

    lines += [line(i) for i in plan.invocations if i.after is None]
    later = [line(i) for i in plan.invocations if i.after is not None]
    if later:
        lines += [f"sleep {CLIENT_DELAY_S}", *later]
    lines += ["wait", ""]
    return "\n".join(lines)


def read_outputs(
    plan: CheckPlan, output_dir: Path, *, job_state: str
) -> dict[str, InvocationOutput]:
    """Each invocation's files; one with no ``.rc`` did not finish (the job was killed)."""
    outputs: dict[str, InvocationOutput] = {}
    for inv in plan.invocations:
        stdout = _tail(output_dir / f"{inv.id}.out")
        stderr = _tail(output_dir / f"{inv.id}.err", limit=RAW_LIMIT // 4)
        rc_text = _tail(output_dir / f"{inv.id}.rc").strip()
        if not rc_text.lstrip("-").isdigit():
            outputs[inv.id] = InvocationOutput(
                id=inv.id,
                stdout=stdout,
                stderr=stderr,
                error=f"no exit status: the Slurm job ended ({job_state}) before it did",
            )
            continue
        rc = int(rc_text)
        outputs[inv.id] = InvocationOutput(
            id=inv.id,
            stdout=stdout,
            stderr=stderr,
            exit_code=None if rc == TIMEOUT_EXIT else rc,
            timed_out=rc == TIMEOUT_EXIT,
        )
    return outputs


def _tail(path: Path, *, limit: int = RAW_LIMIT) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit * 4))
            data = f.read()
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", errors="replace")[-limit:]


class SlurmBackend:
    name = "slurm"
    launcher = Launcher.SRUN

    def __init__(
        self,
        scheduler: SupportsJobs,
        *,
        output_root: Path,
        users: tuple[str, ...],
    ) -> None:
        if not isinstance(scheduler, SupportsReservations):
            raise TypeError("the Slurm backend needs a scheduler with reservations")
        self.scheduler = scheduler
        self.reservations: SupportsReservations = scheduler
        self.output_root = output_root
        self.users = users

    async def start(self, job: BackendJob) -> dict[str, Any]:
        name = reservation_name(job.run_id)
        nodes = tuple(dict.fromkeys(n for i in job.plan.invocations for n in i.nodes))
        out_dir = self.output_root / job.run_id
        script = out_dir / "job.sh"
        text = render_script(job.plan, run_id=job.run_id, output_dir=out_dir)
        await asyncio.to_thread(_write_script, out_dir, script, text)
        existing = {r.name for r in await self.reservations.list_reservations()}
        if name not in existing:
            try:
                await self.reservations.create_reservation(
                    name,
                    nodes=nodes,
                    duration_s=job.plan.timeout_s + JOB_MARGIN_S + RESERVATION_MARGIN_S,
                    users=self.users,
                    ignore_jobs=job.forced,
                )
            except DriverError as exc:
                if any(word in exc.message for word in _BUSY):
                    raise StartRefused(
                        f"Slurm would not reserve {', '.join(nodes)}: a job took one of "
                        f"them since the idle check ({exc.message})"
                    ) from exc
                raise
        found = [j for j in await self.scheduler.find_jobs(name) if not j.ended]
        if found:
            job_id = found[0].job_id
        else:
            job_id = await self.scheduler.submit_job(
                BatchJobSpec(
                    name=name,
                    script=str(script),
                    nodes=nodes,
                    output=str(out_dir / "job.log"),
                    time_limit_s=job.plan.timeout_s + JOB_MARGIN_S,
                    reservation=name,
                    exclusive=not job.forced,
                    workdir=str(out_dir),
                )
            )
        return {"job_id": job_id, "reservation": name, "output_dir": str(out_dir)}

    async def poll(self, job: BackendJob, handles: Mapping[str, Any]) -> Polled:
        state = await self.scheduler.job_state(str(handles["job_id"]))
        if not state.ended:
            why = f" ({state.reason})" if state.reason else ""
            return Polled(
                done=False,
                handles=dict(handles),
                note=f"Slurm job {state.job_id} {state.state.lower()}{why}",
            )
        outputs = await asyncio.to_thread(
            read_outputs, job.plan, Path(str(handles["output_dir"])), job_state=state.state
        )
        await self.reservations.delete_reservation(str(handles["reservation"]))
        return Polled(
            done=True,
            outputs=outputs,
            handles={**handles, "job_state": state.state, "job_exit_code": state.exit_code},
            note=f"Slurm job {state.job_id} {state.state.lower()}",
        )

    async def cancel(
        self, job: BackendJob, handles: Mapping[str, Any]
    ) -> dict[str, InvocationOutput]:
        outputs: dict[str, InvocationOutput] = {}
        if handles.get("job_id"):
            await self.scheduler.cancel_job(str(handles["job_id"]))
            outputs = await asyncio.to_thread(
                read_outputs, job.plan, Path(str(handles["output_dir"])), job_state="CANCELLED"
            )
        await self.reservations.delete_reservation(
            str(handles.get("reservation") or reservation_name(job.run_id))
        )
        return outputs

    async def cleanup_stale(self, live_run_ids: set[str]) -> list[str]:
        """Delete ``gpufleet-check-*`` reservations whose run is not pending or running
        (a server that died between a job's end and the deletion). Returns their names."""
        gone = []
        for r in await self.reservations.list_reservations():
            if r.name.startswith(RESERVATION_PREFIX):
                run_id = r.name.removeprefix(RESERVATION_PREFIX)
                if run_id not in live_run_ids:
                    await self.reservations.delete_reservation(r.name)
                    gone.append(r.name)
        return gone


def _write_script(out_dir: Path, script: Path, text: str) -> None:
    # The job writes here as the check user: group-writable, readable by this server.
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o775)
    script.write_text(text)
    script.chmod(0o755)
