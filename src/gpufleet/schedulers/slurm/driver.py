"""``SlurmScheduler``: the ``Scheduler`` driver over a real Slurm cluster's CLI, and over
slurmrestd for its reads where ``SlurmConfig.rest_url`` is set.

Reads of nodes and jobs go to slurmrestd when configured (``rest.py``: ``GET
/slurm/<v>/nodes``, ``node/<name>``, ``jobs``); else they use JSON where the installed
Slurm has it (``sinfo --json``/``squeue --json`` on 21.08-22.05, ``scontrol --json`` on
23.02+) and ``scontrol -o show`` text otherwise. Accounting always comes from ``sacct -P``
text, because 22.05's ``sacct --json`` (and slurmrestd's ``slurmdb`` jobs, the same
plugin) reports wrong exit codes. Writes always go through ``scontrol update``/``scontrol
requeue``: 22.05's REST API (v0.0.38) cannot update a node, and the node update of
v0.0.39+ (``POST /slurm/<v>/node/<name>``) cannot be tested here, so the CLI stays the
one write path on every version.

Rules: gpufleet holds a node with DRAIN, never DOWN alone, because
``ReturnToService=2`` puts a DOWN node back into service as soon as its slurmd answers.
It only ever clears a drain whose reason starts with ``DRAIN_REASON_PREFIX``, and it never
overwrites a reason someone else set (that would make their drain look like ours).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable, Sequence
from typing import TypeVar
from urllib.parse import quote

from gpufleet.core.autoscale import PendingWork
from gpufleet.core.clock import as_utc
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import (
    DRAIN_REASON_PREFIX,
    BatchJobSpec,
    BatchJobState,
    ReservationInfo,
    SchedJob,
    SchedNode,
    both,
)
from gpufleet.schedulers.slurm.client import CommandResult, SlurmCli, describe_failure
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.parsing import (
    SACCT_FIELDS,
    SlurmJobInfo,
    SlurmNodeInfo,
    SlurmReportedError,
    parse_jobs_json,
    parse_key_values,
    parse_nodes_json,
    parse_sacct,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    pending_gpu_demand,
    pending_work,
)
from gpufleet.schedulers.slurm.rest import RestAnswer, SlurmRest
from gpufleet.schedulers.slurm.values import (
    SlurmVersion,
    expand_hostlist,
    format_time,
    is_empty,
    parse_exit_code,
    parse_time,
    parse_version,
)

T = TypeVar("T")

# Job states that mean "ended", for ``sacct --state``. REQUEUED is a run that was stopped
# and queued again (``-D`` lists each run); the sim reports those too.
ENDED_STATES = (
    "BOOT_FAIL",
    "CANCELLED",
    "COMPLETED",
    "DEADLINE",
    "FAILED",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "REQUEUED",
    "TIMEOUT",
)
# A batch job in one of these has not ended yet.
_LIVE_JOB_STATES = frozenset(
    {
        "PENDING",
        "CONFIGURING",
        "RUNNING",
        "COMPLETING",
        "SUSPENDED",
        "REQUEUED",
        "RESIZING",
        "STOPPED",
        "SIGNALING",
        "STAGE_OUT",
        "REQUEUE_HOLD",
        "REQUEUE_FED",
        "RESV_DEL_HOLD",
    }
)
# Job states ``scontrol requeue`` acts on (a COMPLETING job is already ending).
_REQUEUEABLE_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING", "STOPPED"})


class SlurmScheduler:
    """A Slurm cluster, through its CLI (and slurmrestd for reads, when configured).
    Implements Scheduler, SupportsDrain, SupportsDown, SupportsRequeue, SupportsJobs,
    SupportsReservations, SupportsPendingWork and SupportsJobsOnNodes.

    Every method raises ``DriverError`` naming the node, the command (or the slurmrestd
    request) and its stderr (or error body) when a call fails, times out, or answers a
    JSON ``errors`` list; none returns an empty list in place of an error.
    """

    kind = "slurm"

    def __init__(
        self,
        config: SlurmConfig | None = None,
        *,
        cli: SlurmCli | None = None,
        rest: SlurmRest | None = None,
    ) -> None:
        self._config = config or SlurmConfig()
        self._cli = cli or SlurmCli(self._config)
        if rest is None and self._config.rest_url is not None:
            rest = SlurmRest(self._config)
        self._rest = rest
        self._version: SlurmVersion | None = None
        self._version_lock = asyncio.Lock()

    @property
    def config(self) -> SlurmConfig:
        return self._config

    async def version(self) -> SlurmVersion:
        """The installed Slurm (``sinfo --version``), asked once per scheduler."""
        async with self._version_lock:
            if self._version is None:
                result = await self._cli.run("sinfo", "--version")
                self._version = _parse(parse_version, result, node=None)
            return self._version

    async def aclose(self) -> None:
        """Close the slurmrestd connections (nothing to do on the CLI path)."""
        if self._rest is not None:
            await self._rest.aclose()

    # ------------------------------------------------------------------------ reads

    async def list_nodes(self) -> list[SchedNode]:
        """Every node Slurm knows, with state, reason, GPUs (GRES) and the jobs on it.
        Touches nothing."""
        nodes, jobs = await both(self._nodes(), self._jobs())
        on_node: dict[str, list[str]] = {}
        for job in jobs:
            if job.active:
                for name in job.nodes:
                    on_node.setdefault(name, []).append(job.job_id)
        return [n.to_sched_node(on_node.get(n.name, ())) for n in nodes]

    async def jobs_on_node(self, node: str) -> list[SchedJob]:
        """Jobs holding ``node`` now (running, suspended or completing). Raises
        ``DriverError`` for a node Slurm does not know."""
        _, jobs = await both(self._node(node), self._jobs())
        return [j.to_sched_job() for j in jobs if j.active and node in j.nodes]

    async def jobs_on_nodes(self, nodes: Sequence[str]) -> dict[str, list[SchedJob] | None]:
        """``jobs_on_node`` of each of ``nodes`` from one node list and one job list
        (two commands, not two a node); ``None`` for a node Slurm does not know."""
        known, jobs = await both(self._nodes(), self._jobs())
        wanted = set(nodes)
        on_node: dict[str, list[SchedJob]] = {n.name: [] for n in known if n.name in wanted}
        for job in jobs:
            if job.active and (held := [n for n in job.nodes if n in on_node]):
                sched_job = job.to_sched_job()
                for name in held:
                    on_node[name].append(sched_job)
        return {node: on_node.get(node) for node in nodes}

    async def pending_gpu_demand(self) -> int:
        """GPUs asked for by the jobs ``pending_work`` lists, in all."""
        return pending_gpu_demand(await self._jobs())

    async def pending_work(self) -> list[PendingWork]:
        """Each PENDING job that more nodes would start, from ``squeue --all --json
        --states=PENDING`` (slurmrestd's jobs, or ``scontrol show job`` text, where those
        are the read path): id, GPUs in all (its TRES ask, or ``--gres``/``--gpus*`` per
        node × nodes, per job, or per task × tasks) and since when it waits (eligible
        time, else submit time). Touches nothing.

        Counted: reasons None (just queued), Resources, Priority and ReqNodeNotAvail
        (nodes it could use are down or drained). Not counted, because more nodes would
        not start them: held jobs (JobHeldUser, JobHeldAdmin, requeued held),
        Dependency, BeginTime (requeued jobs wait there first), QOS, association and
        accounting limits, licenses, an array's throttle (JobArrayTaskLimit), partition
        limits or a partition down, reservations; a job pinned to nodes (``--nodelist``)
        or in a reservation whatever its reason; a job that asks for no GPU. A pending
        array gives one item per task that could start now (``123_4``), up to its ``%``
        throttle. ``parsing.WAITING_FOR_NODES`` holds the list.

        Raises:
            DriverError: squeue (or slurmrestd) fails, times out or reports errors.
        """
        return pending_work(await self._pending_jobs(), now=dt.datetime.now(dt.UTC))

    async def accounting_since(self, since: dt.datetime) -> list[SchedJob]:
        """Jobs that ended at or after ``since`` (to the second), oldest end first, from
        slurmdbd (``sacct``): user, account, nodes, GPUs (AllocTRES ``gres/gpu``), times,
        exit code (128 + signal for a job killed by one). Each run of a requeued job is
        its own record (REQUEUED, then its final state), under the same job id. Steps are
        folded into their job. sacct learns of a job a few seconds after it ends."""
        start = as_utc(since).replace(microsecond=0)
        result = await self._cli.run(
            "sacct",
            "--allusers",
            "--parsable2",
            "--noheader",
            "--duplicates",
            "--noconvert",
            f"--format={','.join(SACCT_FIELDS)}",
            f"--starttime={format_time(start)}",
            "--endtime=now",
            f"--state={','.join(ENDED_STATES)}",
        )
        jobs = _parse(parse_sacct, result, node=None)
        ended = [j for j in jobs if j.ended_at is not None and j.ended_at >= start]
        return sorted(ended, key=lambda j: j.ended_at or start)

    # ----------------------------------------------------------------------- writes

    async def drain(self, node: str, *, reason: str) -> None:
        """Drain ``node``: no new jobs start there; running jobs finish (DRAINING, then
        DRAINED). Idempotent: a node that already has the drain flag is left as it is,
        with its reason; a DOWN node keeps its reason too (ours would hide theirs)."""
        if not reason.strip():
            raise DriverError(f"slurm: node {node}: a drain needs a reason (Slurm refuses none)")
        info = await self._node(node)
        if info.drain:
            return
        kept = info.reason if info.down and info.reason else reason
        await self._update(node, "state=drain", f"reason={kept}")

    async def resume(self, node: str) -> None:
        """Undo gpufleet's drain or down (``scontrol update state=resume``); running jobs
        are untouched. A node that is neither drained nor down resumes trivially.

        Raises:
            DriverError: the node's reason does not start with ``DRAIN_REASON_PREFIX``
                (someone else's drain, or Slurm's own, e.g. "Not responding"), or the
                command fails.
        """
        info = await self._node(node)
        if not (info.drain or info.down):
            return
        reason = info.reason or ""
        if not reason.startswith(DRAIN_REASON_PREFIX):
            raise DriverError(
                f"slurm: refusing to resume node {node}: its reason {reason!r} was not set "
                f"by gpufleet (no {DRAIN_REASON_PREFIX!r} prefix); clear it by hand with "
                f"`scontrol update nodename={node} state=resume` if it is safe"
            )
        result = await self._update(node, "state=resume", check=False)
        if result.returncode != 0:
            # "Invalid node state specified": someone resumed it between our read and
            # now. That is the state we wanted; anything else is a failure.
            again = await self._node(node)
            if again.drain or again.down:
                raise DriverError(describe_failure(result, node=node))

    async def down(self, node: str, *, reason: str) -> None:
        """Mark ``node`` DOWN now: Slurm kills its running jobs (requeued where the job
        allows it, else NODE_FAIL). The node is drained first, so that when
        ``ReturnToService=2`` brings it back it stays out of service until ``resume``.
        An existing reason is kept, as in ``drain``."""
        if not reason.strip():
            raise DriverError(f"slurm: node {node}: down needs a reason (Slurm refuses none)")
        info = await self._node(node)
        kept = info.reason if (info.drain or info.down) and info.reason else reason
        if not info.drain:
            await self._update(node, "state=drain", f"reason={kept}")
        await self._update(node, "state=down", f"reason={kept}")

    async def requeue_jobs(self, node: str) -> list[str]:
        """Requeue the jobs running on ``node`` (``scontrol requeue``): each stops on all
        its nodes and goes back to the queue under the same id (Slurm holds it until its
        BeginTime, about two minutes). Returns the job ids, empty when none ran.

        Raises:
            DriverError: the node is unknown, a job cannot be requeued (``--no-requeue``,
                or not a batch job: srun/salloc); then no job is requeued.
        """
        jobs = [j for j in await self._active_jobs(node) if j.state in _REQUEUEABLE_STATES]
        for job in jobs:
            why = (
                "it was submitted with --no-requeue"
                if not job.requeueable
                else "it is not a batch job (srun/salloc); Slurm requeues batch jobs only"
                if not job.batch
                else None
            )
            if why is not None:
                raise DriverError(
                    f"slurm: node {node}: cannot requeue job {job.job_id}: {why}; "
                    "no job was requeued"
                )
        if not jobs:
            return []
        ids = [job.job_id for job in jobs]
        await self._cli.run("scontrol", "requeue", ",".join(ids), node=node)
        return ids

    # ------------------------------------------------------------ jobs (active checks)

    async def submit_job(self, spec: BatchJobSpec) -> str:
        """``sbatch --parsable`` the script on exactly ``spec.nodes`` (in its reservation).
        Returns the job id."""
        minutes = max(1, -(-int(spec.time_limit_s) // 60))
        argv = [
            "sbatch",
            "--parsable",
            f"--job-name={spec.name}",
            f"--nodes={len(spec.nodes)}",
            f"--nodelist={','.join(spec.nodes)}",
            f"--output={spec.output}",
            f"--time={minutes}",
        ]
        if spec.reservation:
            argv.append(f"--reservation={spec.reservation}")
        if spec.exclusive:
            argv.append("--exclusive")
        if spec.gpus_per_node:
            argv.append(f"--gpus-per-node={spec.gpus_per_node}")
        if spec.workdir:
            argv.append(f"--chdir={spec.workdir}")
        result = await self._cli.run(*argv, spec.script)
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise DriverError(
                f"slurm: `{result.command}` printed no job id: {result.stdout.strip()[:200]!r}"
            )
        return job_id

    async def job_state(self, job_id: str) -> BatchJobState:
        """From ``scontrol show job`` while Slurm holds the job (MinJobAge after it
        ends), from ``sacct`` after that."""
        result = await self._cli.run("scontrol", "--oneliner", "show", "job", job_id, check=False)
        if result.returncode == 0 and result.stdout.strip():
            kv = parse_key_values(result.stdout.strip().splitlines()[0])
            state = kv.get("JobState", "UNKNOWN").upper()
            exit_code, _signal = parse_exit_code(kv.get("ExitCode", ""))
            reason = kv.get("Reason")
            return BatchJobState(
                job_id=job_id,
                name=kv.get("JobName", ""),
                state=state,
                ended=state not in _LIVE_JOB_STATES,
                exit_code=exit_code,
                reason=None if is_empty(reason) else reason,
            )
        if "Invalid job id" not in result.stderr + result.stdout:
            raise DriverError(describe_failure(result, node=None))
        acct = await self._cli.run(
            "sacct",
            "-j",
            job_id,
            "-X",
            "--parsable2",
            "--noheader",
            "--format=JobID,JobName,State,ExitCode",
        )
        for line in acct.stdout.splitlines():
            fields = line.split("|")
            if len(fields) == 4 and fields[0] == job_id:
                state = (fields[2].split() or ["UNKNOWN"])[0].upper()
                exit_code, _signal = parse_exit_code(fields[3])
                return BatchJobState(
                    job_id=job_id,
                    name=fields[1],
                    state=state,
                    ended=state not in _LIVE_JOB_STATES,
                    exit_code=exit_code,
                )
        raise DriverError(f"slurm: job {job_id}: neither scontrol nor sacct knows it")

    async def find_jobs(self, name: str) -> list[BatchJobState]:
        result = await self._cli.run(
            "squeue", "--noheader", f"--name={name}", "--format=%i|%j|%T|%r"
        )
        jobs = []
        for line in result.stdout.splitlines():
            fields = line.strip().split("|")
            if len(fields) == 4 and fields[1] == name:
                state = fields[2].upper()
                jobs.append(
                    BatchJobState(
                        job_id=fields[0],
                        name=fields[1],
                        state=state,
                        ended=state not in _LIVE_JOB_STATES,
                        reason=None if is_empty(fields[3]) else fields[3],
                    )
                )
        return jobs

    async def cancel_job(self, job_id: str) -> None:
        result = await self._cli.run("scancel", job_id, check=False)
        if result.returncode != 0 and "Invalid job id" not in result.stderr:
            raise DriverError(describe_failure(result, node=None))

    # ---------------------------------------------------------------- reservations

    async def create_reservation(
        self,
        name: str,
        *,
        nodes: tuple[str, ...],
        duration_s: float,
        users: tuple[str, ...],
        ignore_jobs: bool = False,
        start: dt.datetime | None = None,
    ) -> None:
        """``scontrol create reservation`` from ``start`` (None: ``StartTime=now``),
        ``Flags=MAINT`` (maintenance: the time is accounted as such, and no job but the
        users' starts on the nodes; a job whose time limit reaches into a future window
        does not start on them either). Without ``ignore_jobs`` Slurm refuses nodes a job
        runs on ("Requested nodes are busy"): that refusal is how a job that started since
        the idle check is never disturbed.

        ``start`` goes as ``StartTime=YYYY-MM-DDTHH:MM:SS`` in UTC. That is zone-safe:
        scontrol itself turns the text into epoch seconds in its own zone, and the driver
        runs every Slurm command with ``TZ=UTC`` (``client.py``), whatever slurmctld's zone.
        Slurm refuses a start more than ten minutes past. The duration is whole minutes,
        rounded up.

        A retry is safe: when Slurm refuses the name as taken and the reservation of that
        name holds the same nodes (and starts at ``start``, when given), it returns; any
        other clash raises ``DriverError`` naming what differs."""
        if not nodes or not users:
            raise DriverError(f"slurm: reservation {name}: needs nodes and users")
        if start is not None and start.tzinfo is None:
            raise ValueError(f"slurm: reservation {name}: start must be aware, got {start}")
        minutes = max(1, -(-int(duration_s) // 60))
        flags = "MAINT,IGNORE_JOBS" if ignore_jobs else "MAINT"
        result = await self._cli.run(
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={name}",
            f"Nodes={','.join(nodes)}",
            f"StartTime={'now' if start is None else format_time(start)}",
            f"Duration={minutes}",
            f"Users={','.join(users)}",
            f"Flags={flags}",
            check=False,
        )
        if result.returncode == 0:
            return
        if "Duplicate" in result.stderr:
            await self._check_same_reservation(name, nodes=nodes, start=start, failed=result)
            return
        raise DriverError(describe_failure(result, node=None))

    async def _check_same_reservation(
        self,
        name: str,
        *,
        nodes: tuple[str, ...],
        start: dt.datetime | None,
        failed: CommandResult,
    ) -> None:
        """After "Duplicate reservation name": return when the existing one is what was
        asked (a retry), else raise naming the difference."""
        found = next((r for r in await self.list_reservations() if r.name == name), None)
        if found is None:  # gone since (ended or deleted): let the caller try again
            raise DriverError(describe_failure(failed, node=None))
        wanted = expand_hostlist(",".join(nodes))
        if set(found.nodes) != set(wanted):
            raise DriverError(
                f"slurm: reservation {name} exists on {','.join(found.nodes)}, "
                f"not {','.join(wanted)}: delete it or choose another name"
            )
        if start is not None and found.start_time != start.replace(microsecond=0):
            raise DriverError(
                f"slurm: reservation {name} exists from {found.start_time}, not {start}: "
                "delete it or choose another name"
            )

    async def delete_reservation(self, name: str) -> None:
        result = await self._cli.run("scontrol", "delete", f"ReservationName={name}", check=False)
        if result.returncode != 0 and "reservation is invalid" not in result.stderr:
            raise DriverError(describe_failure(result, node=None))

    async def list_reservations(self) -> list[ReservationInfo]:
        result = await self._cli.run("scontrol", "--oneliner", "show", "reservation")
        out: list[ReservationInfo] = []
        for line in result.stdout.splitlines():
            if not line.startswith("ReservationName="):
                continue  # "No reservations in the system"
            kv = parse_key_values(line)
            out.append(
                ReservationInfo(
                    name=kv["ReservationName"],
                    nodes=expand_hostlist(kv.get("Nodes")),
                    state=kv.get("State", "").upper(),
                    flags=tuple(f for f in kv.get("Flags", "").split(",") if f),
                    users=tuple(u for u in kv.get("Users", "").split(",") if not is_empty(u)),
                    end_time=parse_time(kv.get("EndTime")),
                    start_time=parse_time(kv.get("StartTime")),
                )
            )
        return out

    # ---------------------------------------------------------------------- helpers

    async def _use_json(self) -> bool:
        if self._config.use_json is not None:
            return self._config.use_json
        return (await self.version()).has_json

    async def _nodes(self) -> list[SlurmNodeInfo]:
        if self._rest is not None:
            return _parse_rest(parse_nodes_json, await self._rest.get("nodes"), node=None)
        if not await self._use_json():
            result = await self._cli.run("scontrol", "--oneliner", "show", "node")
            return _parse(parse_scontrol_nodes, result, node=None)
        if (await self.version()).has_data_parser:
            result = await self._cli.run("scontrol", "--json", "show", "node")
        else:
            # --all: nodes of hidden partitions too, as scontrol would list them.
            result = await self._cli.run("sinfo", "--all", "--json")
        return _parse(parse_nodes_json, result, node=None)

    async def _node(self, node: str) -> SlurmNodeInfo:
        """One node's state, read fresh. Unknown nodes make scontrol exit 1 (and
        slurmrestd answer an ``errors`` list)."""
        if self._rest is not None:
            answer = await self._rest.get(f"node/{quote(node, safe='')}", node=node)
            for info in _parse_rest(parse_nodes_json, answer, node=node):
                if info.name == node:
                    return info
            raise DriverError(f"slurm: node {node}: {answer.request} did not list it")
        if await self._use_json() and (await self.version()).has_data_parser:
            result = await self._cli.run("scontrol", "--json", "show", "node", node, node=node)
            nodes = _parse(parse_nodes_json, result, node=node)
        else:
            # 22.05 has no scontrol --json, and sinfo --json lists every node.
            result = await self._cli.run("scontrol", "--oneliner", "show", "node", node, node=node)
            nodes = _parse(parse_scontrol_nodes, result, node=node)
        for info in nodes:
            if info.name == node:
                return info
        raise DriverError(f"slurm: node {node}: `{result.command}` did not list it")

    async def _jobs(self) -> list[SlurmJobInfo]:
        if self._rest is not None:
            return _parse_rest(parse_jobs_json, await self._rest.get("jobs"), node=None)
        if await self._use_json():
            result = await self._cli.run("squeue", "--all", "--json")
            return _parse(parse_jobs_json, result, node=None)
        result = await self._cli.run("scontrol", "--oneliner", "show", "job")
        return _parse(parse_scontrol_jobs, result, node=None)

    async def _pending_jobs(self) -> list[SlurmJobInfo]:
        # 22.05's squeue --json ignores --states (it lists every job); 23.02+ honours it.
        # Either way only PENDING records are kept.
        if self._rest is not None:
            jobs = _parse_rest(parse_jobs_json, await self._rest.get("jobs"), node=None)
        elif await self._use_json():
            result = await self._cli.run("squeue", "--all", "--json", "--states=PENDING")
            jobs = _parse(parse_jobs_json, result, node=None)
        else:
            result = await self._cli.run("scontrol", "--oneliner", "show", "job")
            jobs = _parse(parse_scontrol_jobs, result, node=None)
        return [j for j in jobs if j.state == "PENDING"]

    async def _active_jobs(self, node: str) -> list[SlurmJobInfo]:
        _, jobs = await both(self._node(node), self._jobs())
        return [j for j in jobs if j.active and node in j.nodes]

    async def _update(self, node: str, *settings: str, check: bool = True) -> CommandResult:
        return await self._cli.run(
            "scontrol", "update", f"nodename={node}", *settings, node=node, check=check
        )


def _parse(parser: Callable[[str], T], result: CommandResult, *, node: str | None) -> T:
    """Run a pure parser on a command's output; its ValueError becomes a DriverError."""
    stderr = result.stderr.strip()
    tail = f"; stderr: {stderr[:500]}" if stderr else ""
    return _parse_text(parser, result.stdout, source=f"`{result.command}`", tail=tail, node=node)


def _parse_rest(parser: Callable[[str], T], answer: RestAnswer, *, node: str | None) -> T:
    """Run a pure parser on a slurmrestd answer's body, as ``_parse`` does."""
    return _parse_text(parser, answer.text, source=answer.request, tail="", node=node)


def _parse_text(
    parser: Callable[[str], T], text: str, *, source: str, tail: str, node: str | None
) -> T:
    where = f"node {node}: " if node else ""
    try:
        return parser(text)
    except SlurmReportedError as exc:
        raise DriverError(f"slurm: {where}{source} reported errors: {exc}{tail}") from exc
    except ValueError as exc:
        raise DriverError(f"slurm: {where}{source}: could not read its output: {exc}") from exc
