"""Pure parsers of what the Slurm commands print. No I/O; tested on recorded real output.

Small values inside them (GRES, TRES, hostlists, times) are read by ``values.py``.

Two JSON dialects exist:

* 21.08-22.05, ``openapi/v0.0.3x`` (``sinfo --json``, ``squeue --json``): a node's
  ``state`` is a lower-case string (``"mixed"``) with a separate ``state_flags`` list
  (``["DRAIN"]``); numbers and times are plain integers.
* 23.02+, ``data_parser/v0.0.39+`` (``scontrol --json show node``, ``squeue --json``):
  ``state`` and ``job_state`` are lists of upper-case words (``["IDLE", "DRAIN"]``), and
  numbers and times are ``{"set": bool, "infinite": bool, "number": int}`` objects.

The text forms are ``scontrol -o show node|job`` (``Key=Value`` pairs, one record per
line; values may hold spaces) and ``sacct -P -n`` (``|``-separated, a fixed field list).

Every parser ignores fields it does not know, treats missing optional fields as empty,
and raises ``ValueError`` saying what was wrong for anything it cannot read.
``SlurmReportedError`` (a ``ValueError``) is a JSON answer whose ``errors`` list is not
empty: Slurm said the call failed, even if the command exited 0.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.core.autoscale import PendingWork
from gpufleet.schedulers.base import SchedJob, SchedNode, SchedNodeState
from gpufleet.schedulers.slurm.values import (
    count_array_tasks,
    expand_hostlist,
    is_empty,
    parse_exit_code,
    parse_gres_gpus,
    parse_number,
    parse_time,
    parse_tres_gpus,
)

# ------------------------------------------------------------------------ node states

_BASE_STATES = {"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"}
# Short and old spellings seen in sinfo and older scontrol output → (base, flags).
_ALIASES: dict[str, tuple[str | None, tuple[str, ...]]] = {
    "ALLOC": ("ALLOCATED", ()),
    "MIX": ("MIXED", ()),
    "UNK": ("UNKNOWN", ()),
    "DRAINED": ("IDLE", ("DRAIN",)),
    "DRAINING": ("ALLOCATED", ("DRAIN",)),
    "DRNG": ("ALLOCATED", ("DRAIN",)),
    "COMP": (None, ("COMPLETING",)),
    "INVAL": (None, ("INVALID_REG",)),
    "NO_RESPOND": (None, ("NOT_RESPONDING",)),
}
# sinfo's state suffixes (man sinfo, NODE STATE CODES).
_SUFFIXES = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "%": "POWERING_DOWN",
    "!": "POWER_DOWN",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "$": "MAINTENANCE",
    "-": "PLANNED",
}


def split_node_state(state: object, flags: object = None) -> tuple[str, frozenset[str]]:
    """A node state in any dialect → (base, flags), upper case.

    ``"mixed"`` + ``["DRAIN"]`` (22.05 JSON), ``["IDLE", "DRAIN"]`` (23.02+ JSON),
    ``"MIXED+DRAIN+NOT_RESPONDING"`` (scontrol), ``"idle*"`` (sinfo). A state with no
    base word (only flags) has base UNKNOWN.
    """
    if isinstance(state, str):
        tokens = state.split("+")
    elif isinstance(state, list) and all(isinstance(s, str) for s in state):
        tokens = list(state)
    else:
        raise ValueError(f"node state must be a string or a list of strings, got {state!r}")
    if flags is not None:
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise ValueError(f"node state flags must be a list of strings, got {flags!r}")
        tokens.extend(flags)
    base: str | None = None
    found: set[str] = set()
    for raw in tokens:
        token = raw.strip().upper()
        while token and token[-1] in _SUFFIXES and len(token) > 1:
            found.add(_SUFFIXES[token[-1]])
            token = token[:-1]
        if not token:
            continue
        alias_base, alias_flags = _ALIASES.get(token, (None, ()))
        found.update(alias_flags)
        word = alias_base or (token if token in _BASE_STATES else None)
        if word is not None and base is None:
            base = word
        elif word is None and token not in _ALIASES:
            found.add(token)
    if base is None and not found:
        raise ValueError(f"empty node state: {state!r}")
    return base or "UNKNOWN", frozenset(found)


def map_node_state(base: str, flags: frozenset[str]) -> SchedNodeState:
    """Slurm's base state and flags → one ``SchedNodeState``, in the sim's order:
    down > drain (draining while a job runs or completes, else drained) > not responding
    or not yet known (unknown) > busy > idle."""
    if base in {"DOWN", "ERROR"} or flags & {"INVALID_REG", "INVALID"}:
        return SchedNodeState.DOWN
    if flags & {"DRAIN", "FAIL"}:
        busy = base in {"ALLOCATED", "MIXED"} or "COMPLETING" in flags
        return SchedNodeState.DRAINING if busy else SchedNodeState.DRAINED
    if base in {"FUTURE", "UNKNOWN"} or "NOT_RESPONDING" in flags:
        return SchedNodeState.UNKNOWN
    if base == "ALLOCATED":
        return SchedNodeState.ALLOCATED
    if base == "MIXED":
        return SchedNodeState.MIXED
    # IDLE+COMPLETING: a job's epilog still runs there; it is not free yet.
    return SchedNodeState.ALLOCATED if "COMPLETING" in flags else SchedNodeState.IDLE


@dataclass(frozen=True, slots=True)
class SlurmNodeInfo:
    """One node as Slurm reports it. ``state`` maps it to gpufleet's words."""

    name: str
    base_state: str  # IDLE, ALLOCATED, MIXED, DOWN, ...
    flags: frozenset[str]  # DRAIN, NOT_RESPONDING, COMPLETING, CLOUD, ...
    reason: str | None
    gpus: int
    gpus_allocated: int
    partitions: tuple[str, ...] = ()

    @property
    def state(self) -> SchedNodeState:
        return map_node_state(self.base_state, self.flags)

    @property
    def drain(self) -> bool:
        """The drain flag is set (DRAINING or DRAINED, possibly also DOWN)."""
        return bool(self.flags & {"DRAIN", "FAIL"})

    @property
    def down(self) -> bool:
        return self.base_state in {"DOWN", "ERROR"}

    @property
    def powered_down(self) -> bool:
        """Power saving: powered down or powering up, no slurmd registered since."""
        return bool(self.flags & {"POWERED_DOWN", "POWERING_UP"})

    def to_sched_node(self, job_ids: Iterable[str] = ()) -> SchedNode:
        return SchedNode(
            name=self.name,
            state=self.state,
            reason=self.reason,
            gpus=self.gpus,
            gpus_allocated=self.gpus_allocated,
            job_ids=tuple(job_ids),
            powered_down=self.powered_down,
        )


def _reason(value: object) -> str | None:
    if isinstance(value, Mapping):  # some data_parser versions: {"description", ...}
        value = value.get("description")
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"node reason must be a string, got {value!r}")
    return value.strip() or None


def _str(obj: Mapping[str, Any], key: str, *, what: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if isinstance(value, list):  # 23.02+ lists some string fields (features, flags)
        return ",".join(str(v) for v in value)
    if not isinstance(value, str | int):
        raise ValueError(f"{what}: field {key!r} must be a string, got {value!r}")
    return str(value)


# ---------------------------------------------------------------------- JSON answers


class SlurmReportedError(ValueError):
    """A JSON answer with a non-empty ``errors`` list: Slurm says the call failed."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("; ".join(errors))
        self.errors = tuple(errors)


def load_json(text: str, *, what: str) -> dict[str, Any]:
    """Parse a Slurm JSON answer; raises ``SlurmReportedError`` if its ``errors`` is not
    empty (slurmrestd and the CLI both report failures there, even with exit code 0)."""
    try:
        # A file saved by a Windows editor starts with a byte-order mark; json refuses it.
        doc = json.loads(text.removeprefix("\ufeff"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{what}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{what}: expected a JSON object, got {type(doc).__name__}")
    errors = json_errors(doc)
    if errors:
        raise SlurmReportedError(errors)
    return doc


def json_errors(doc: Mapping[str, Any]) -> list[str]:
    """The messages in a JSON answer's ``errors``: v0.0.38 ``{"error", "errno"}``,
    v0.0.39+ ``{"description", "error", "error_number", "source"}``."""
    errors = doc.get("errors") or []
    if not isinstance(errors, list):
        return [str(errors)]
    messages: list[str] = []
    for error in errors:
        if not isinstance(error, Mapping):
            messages.append(str(error))
            continue
        parts = [str(error[k]) for k in ("source", "description", "error") if error.get(k)]
        message = ": ".join(dict.fromkeys(parts)) or json.dumps(error)
        number = error.get("error_number", error.get("errno"))
        messages.append(f"{message} (error {number})" if number else message)
    return messages


def error_body_text(text: str, *, limit: int = 2000) -> str:
    """What a failed slurmrestd answer says, for a message: the ``errors`` of a JSON body
    (``Invalid node name specified (error 2018)``), else its text (``Authentication
    failure``, the 401 body), else ``(empty body)``."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict):
        errors = json_errors(doc)
        if errors:
            return "; ".join(errors)[:limit]
    return text.strip()[:limit] or "(empty body)"


def _list_of_objects(doc: Mapping[str, Any], key: str, *, what: str) -> list[Mapping[str, Any]]:
    items = doc.get(key)
    if not isinstance(items, list) or not all(isinstance(i, Mapping) for i in items):
        raise ValueError(f"{what}: expected a list of objects under {key!r}")
    return items


def parse_nodes_json(text: str) -> list[SlurmNodeInfo]:
    """``sinfo --json`` (21.08-23.11: ``nodes``; 24.05+: ``sinfo`` rows) or
    ``scontrol --json show node`` (23.02+: ``nodes``) → nodes, in Slurm's order."""
    what = "nodes JSON"
    doc = load_json(text, what=what)
    if "nodes" in doc:
        return [_node_from_json(n) for n in _list_of_objects(doc, "nodes", what=what)]
    if "sinfo" in doc:
        return _nodes_from_sinfo_rows(_list_of_objects(doc, "sinfo", what=what))
    raise ValueError(f"{what}: no 'nodes' (or 'sinfo') list; keys are {sorted(doc)}")


def _node_from_json(node: Mapping[str, Any]) -> SlurmNodeInfo:
    name = node.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"node without a name: {dict(node)!r:.200}")
    what = f"node {name}"
    try:
        base, flags = split_node_state(node.get("state"), node.get("state_flags"))
        gpus = parse_gres_gpus(_str(node, "gres", what=what)) or parse_tres_gpus(
            _str(node, "tres", what=what)
        )
        used = _str(node, "gres_used", what=what)
        allocated = (
            parse_gres_gpus(used) if used else parse_tres_gpus(_str(node, "tres_used", what=what))
        )
        partitions = node.get("partitions") or []
        if not isinstance(partitions, list):
            raise ValueError(f"partitions must be a list, got {partitions!r}")
        return SlurmNodeInfo(
            name=name,
            base_state=base,
            flags=flags,
            reason=_reason(node.get("reason")),
            gpus=gpus,
            gpus_allocated=allocated,
            partitions=tuple(str(p) for p in partitions),
        )
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _nodes_from_sinfo_rows(rows: list[Mapping[str, Any]]) -> list[SlurmNodeInfo]:
    """24.05+ ``sinfo --json``: one row per (partition, group of alike nodes)."""
    by_name: dict[str, SlurmNodeInfo] = {}
    for row in rows:
        names = (row.get("nodes") or {}).get("nodes") or []
        gres = row.get("gres") or {}
        partition = (row.get("partition") or {}).get("name")
        for name in names:
            flat = {
                "name": name,
                "state": (row.get("node") or {}).get("state"),
                "reason": row.get("reason"),
                "gres": gres.get("total"),
                "gres_used": gres.get("used"),
                "partitions": [partition] if partition else [],
            }
            node = _node_from_json(flat)
            seen = by_name.get(name)
            if seen is not None:
                node = dataclasses.replace(seen, partitions=seen.partitions + node.partitions)
            by_name[name] = node
    return list(by_name.values())


# ------------------------------------------------------------------------------ jobs

# Job states in which a job holds its nodes (what a drain waits for).
ACTIVE_JOB_STATES = frozenset(
    {"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED", "SIGNALING", "RESIZING"}
)
# Pending reasons (Slurm's Reason, its first word: scontrol prints
# "ReqNodeNotAvail,_UnavailableNodes:lab-003") that more nodes would cure:
# - None: just submitted, the scheduler has not looked at it yet;
# - Resources: no nodes free for it now;
# - Priority: jobs ahead of it take the free nodes;
# - ReqNodeNotAvail: nodes it could use are down, drained or reserved (a job that names
#   its nodes, or waits in a reservation, is left out below).
# Every other reason is one more nodes would not cure, among them: JobHeldUser,
# JobHeldAdmin, "launch failed requeued held" (held); Dependency,
# DependencyNeverSatisfied; BeginTime (a requeued job waits here too for a while);
# QOS*/Assoc*/AccountingPolicy/Max*Per* (QOS and account limits), Licenses,
# JobArrayTaskLimit (an array's % throttle); Reservation; PartitionDown,
# PartitionInactive, PartitionNodeLimit, PartitionTimeLimit, BadConstraints,
# InvalidAccount, InvalidQOS (configuration); Cleaning, Prolog, PowerUpNode (already
# being placed or nodes already on their way).
WAITING_FOR_NODES = frozenset({"None", "Resources", "Priority", "ReqNodeNotAvail"})
# A pending array stands for this many pending work items at most (one per task that
# could start at once); past it the autoscaler is at its maximum anyway.
MAX_ARRAY_ITEMS = 10_000


@dataclass(frozen=True, slots=True)
class SlurmJobInfo:
    """One job in the queue (squeue / scontrol show job)."""

    job_id: str
    name: str
    user: str
    account: str
    state: str  # RUNNING, PENDING, COMPLETING, ...
    state_reason: str  # None, Resources, Priority, ...
    nodes: tuple[str, ...]
    gpus: int  # allocated when it runs; asked for (per array task) while pending
    partition: str = ""
    submitted_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    requeueable: bool = True
    batch: bool = True
    array_tasks: int = 1  # tasks this pending record stands for
    array_throttle: int | None = None  # at most this many of them run at once
    restarts: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    eligible_at: dt.datetime | None = None  # when it could first start (after a hold...)
    required_nodes: tuple[str, ...] = ()  # --nodelist: it runs there or nowhere
    reservation: str = ""  # it waits for (or runs in) this reservation's nodes
    array_spec: str = ""  # a pending array's task ids: "0-9%2"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_JOB_STATES

    @property
    def waits_for_nodes(self) -> bool:
        """PENDING for a reason more nodes would cure (``WAITING_FOR_NODES``), asking for
        GPUs, and free to run on any node of its partition: a job pinned to nodes
        (``--nodelist``) or in a reservation waits for those nodes, not for new ones."""
        return (
            self.state == "PENDING"
            and reason_word(self.state_reason) in WAITING_FOR_NODES
            and self.gpus > 0
            and not self.required_nodes
            and not self.reservation
        )

    @property
    def runnable_tasks(self) -> int:
        """Tasks of this record that could start at once: 1 for a plain job; an array's
        pending tasks, at most its ``%`` throttle."""
        tasks = self.array_tasks
        if self.array_throttle:
            tasks = min(tasks, self.array_throttle)
        return tasks

    @property
    def pending_gpus(self) -> int:
        """GPUs this record waits for: 0 unless it ``waits_for_nodes``."""
        return self.gpus * self.runnable_tasks if self.waits_for_nodes else 0

    def to_sched_job(self) -> SchedJob:
        extra = {
            "partition": self.partition,
            "reason": self.state_reason,
            "restarts": str(self.restarts),
        }
        return SchedJob(
            job_id=self.job_id,
            name=self.name,
            user=self.user,
            account=self.account,
            state=self.state,
            nodes=self.nodes,
            gpus=self.gpus,
            submitted_at=self.submitted_at,
            started_at=self.started_at,
            extra={**extra, **self.extra},
        )


def pending_gpu_demand(jobs: Iterable[SlurmJobInfo]) -> int:
    """GPUs asked for by PENDING jobs that wait for nodes (``pending_work``'s total)."""
    return sum(job.pending_gpus for job in jobs)


def pending_work(jobs: Iterable[SlurmJobInfo], *, now: dt.datetime) -> list[PendingWork]:
    """The jobs that wait for nodes (``SlurmJobInfo.waits_for_nodes``), in Slurm's order:
    id, GPUs in all (over its nodes) and since when it waits: its eligible time (the end
    of a hold, a dependency or a begin time; a requeue sets it again), else its submit
    time, else ``now``. A pending array gives one item per task that could start at once
    (``123_4``: its own id once it runs), at most ``MAX_ARRAY_ITEMS``."""
    out: list[PendingWork] = []
    for job in jobs:
        if not job.waits_for_nodes:
            continue
        since = job.eligible_at or job.submitted_at or now
        if not job.array_spec:
            out.append(PendingWork(id=job.job_id, gpus=job.gpus, since=since))
            continue
        ids = array_task_ids(job.array_spec, limit=min(job.runnable_tasks, MAX_ARRAY_ITEMS))
        out.extend(PendingWork(id=f"{job.job_id}_{t}", gpus=job.gpus, since=since) for t in ids)
    return out


def reason_word(reason: str) -> str:
    """A pending reason's first word: scontrol's ``ReqNodeNotAvail,_UnavailableNodes:x``
    and squeue's ``ReqNodeNotAvail, UnavailableNodes:x`` → ``ReqNodeNotAvail``."""
    return reason.split(",", 1)[0].strip() or "None"


def array_task_ids(spec: str, *, limit: int) -> list[str]:
    """The first ``limit`` task ids of an array's task string: ``0-9%2`` → 0, 1, ...;
    ``1,3,5-7`` → 1, 3, 5, 6, 7; ``0-15:4`` → 0, 4, 8, 12."""
    body = spec.partition("%")[0]
    ids: list[str] = []
    for part in body.split(","):
        span, colon, step_text = part.strip().partition(":")
        low, dash, high = span.partition("-")
        if (
            not low.isdigit()
            or (dash and not high.isdigit())
            or (colon and not step_text.isdigit())
        ):
            raise ValueError(f"array {spec!r}: bad range {part!r}")
        step = int(step_text) if colon else 1
        last = int(high) if dash else int(low)
        if step < 1 or last < int(low):
            raise ValueError(f"array {spec!r}: bad range {part!r}")
        for task in range(int(low), last + 1, step):
            if len(ids) >= limit:
                return ids
            ids.append(str(task))
    return ids


def _job_state(value: object) -> str:
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return str(value[0]).upper()  # 23.02+: ["PENDING", "REQUEUED"]: the first is the state
    if isinstance(value, str) and value.strip():
        return value.strip().upper()
    raise ValueError(f"job_state must be a word or a list of words, got {value!r}")


def _asked_gpus(
    *,
    tres_req: str,
    per_job: str,
    per_node: str,
    per_task: str,
    node_count: int | None,
    tasks: int | None,
) -> int:
    """GPUs a job asks for: its TRES request when that names gres/gpu, else its
    --gpus / --gres per job, per node × nodes or per task × tasks."""
    from_req = parse_tres_gpus(tres_req)
    if from_req:
        return from_req
    if per_job_gpus := parse_gres_gpus(per_job):
        return per_job_gpus
    if per_node_gpus := parse_gres_gpus(per_node):
        return per_node_gpus * max(node_count or 1, 1)
    return parse_gres_gpus(per_task) * max(tasks or 1, 1)


def parse_jobs_json(text: str) -> list[SlurmJobInfo]:
    """``squeue --json`` (22.05 v0.0.38 and 23.02+ data_parser) → jobs, in Slurm's order."""
    doc = load_json(text, what="squeue JSON")
    return [_job_from_json(job) for job in _list_of_objects(doc, "jobs", what="squeue JSON")]


def _job_from_json(job: Mapping[str, Any]) -> SlurmJobInfo:
    job_number = parse_number(job.get("job_id"))
    if job_number is None:
        raise ValueError(f"job without a job_id: {dict(job)!r:.200}")
    what = f"job {job_number}"
    try:
        state = _job_state(job.get("job_state"))
        alloc = _str(job, "tres_alloc_str", what=what)
        asked = _asked_gpus(
            tres_req=_str(job, "tres_req_str", what=what),
            per_job=_str(job, "tres_per_job", what=what),
            per_node=_str(job, "tres_per_node", what=what),
            per_task=_str(job, "tres_per_task", what=what),
            node_count=parse_number(job.get("node_count")),
            tasks=parse_number(job.get("tasks")),
        )
        gpus = asked if state == "PENDING" or not alloc else parse_tres_gpus(alloc)
        tasks, throttle, array_spec = (1, None, "")
        if state == "PENDING":
            array_spec = _str(job, "array_task_string", what=what)
            tasks, throttle = count_array_tasks(array_spec)
        user = _str(job, "user_name", what=what) or _str(job, "user_id", what=what)
        return SlurmJobInfo(
            job_id=str(job_number),
            name=_str(job, "name", what=what),
            user=user,
            account=_str(job, "account", what=what),
            state=state,
            state_reason=_str(job, "state_reason", what=what) or "None",
            nodes=expand_hostlist(_str(job, "nodes", what=what)),
            gpus=gpus,
            partition=_str(job, "partition", what=what),
            submitted_at=parse_time(job.get("submit_time")),
            started_at=parse_time(job.get("start_time")) if state != "PENDING" else None,
            requeueable=bool(job.get("requeue", True)),
            batch=bool(job.get("batch_flag", True)),
            array_tasks=tasks,
            array_throttle=throttle,
            restarts=parse_number(job.get("restart_cnt")) or 0,
            eligible_at=parse_time(job.get("eligible_time")),
            required_nodes=expand_hostlist(_str(job, "required_nodes", what=what)),
            reservation=_str(job, "resv_name", what=what),
            array_spec="" if is_empty(array_spec) else array_spec,
        )
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


# ----------------------------------------------------------- scontrol -o show (text)

_KEY_RE = re.compile(r"[A-Za-z][A-Za-z0-9_:/]*=")
# "Reason=<text> [user@time]": the text may hold spaces and even "x=y".
_REASON_RE = re.compile(r"(?:^|\s)Reason=(.*?)\s\[([^\]\s@]*)@([^\]\s]*)\](?=\s|$)")
_NOTHING = {"No nodes in the system", "No jobs in the system"}
# Characters a web page or an editor slips into copied text that print as nothing (BOM,
# zero-width space/joiners, word joiner); they would hide a ``Key=`` from the parser.
_INVISIBLE = dict.fromkeys(map(ord, "\ufeff\u200b\u200c\u200d\u2060"))


def _records(text: str, first_key: str, *, split_run_together: bool = False) -> list[str]:
    """One string per record: ``-o`` prints one line each; without ``-o`` a record's
    further lines are indented. Text pasted through a web page or a chat often loses
    that indentation: a line that starts with another ``Key=`` continues the record.

    ``split_run_together``: a page that lost the line breaks too runs the records into
    one line; a second ``<first_key>=`` word starts the next record when every part so
    cut holds a ``State=`` (a node's ``Reason=`` may say ``NodeName=x``; a job's
    ``Comment=`` may say ``JobId=5``: jobs are never cut).
    """
    records: list[str] = []
    for line in text.translate(_INVISIBLE).splitlines():
        if not line.strip() or line.strip() in _NOTHING:
            continue
        if line.lstrip().startswith(f"{first_key}="):
            records.append(line.strip())
        elif records and (line[:1].isspace() or _KEY_RE.match(line)):
            records[-1] += " " + line
        else:
            raise ValueError(f"expected a line starting with {first_key}=, got {line[:80]!r}")
    if not split_run_together:
        return records
    out: list[str] = []
    for record in records:
        parts = re.split(rf"\s+(?={first_key}=)", record)
        # Only when every part is a whole record: a free-text field (an admin's or a
        # health checker's Reason=) may itself say "NodeName=".
        whole = all(re.search(r"(?:^|\s)State=", part) for part in parts)
        out += parts if whole else [record]
    return out


def parse_key_values(record: str) -> dict[str, str]:
    """``Key=Value Key=Value ...`` → dict. A word that is not ``Key=`` continues the value
    before it (``OS=Linux 6.1 #1 SMP``); ``Reason=`` runs up to its ``[user@time]``."""
    pairs: dict[str, str] = {}
    reason = _REASON_RE.search(record)
    if reason is not None:
        pairs["Reason"] = reason.group(1).strip()
        pairs["ReasonUser"] = reason.group(2)
        pairs["ReasonTime"] = reason.group(3)
        record = record[: reason.start()] + " " + record[reason.end() :]
    key: str | None = None
    for word in record.split():
        match = _KEY_RE.match(word)
        if match is not None:
            key = match.group(0)[:-1]
            pairs[key] = word[match.end() :]
        elif key is None:
            raise ValueError(f"expected Key=Value, got {word!r} in {record[:80]!r}")
        else:
            pairs[key] = f"{pairs[key]} {word}" if pairs[key] else word
    return pairs


def parse_scontrol_nodes(text: str) -> list[SlurmNodeInfo]:
    """``scontrol -o show node`` (any version; also without ``-o``) → nodes."""
    nodes: list[SlurmNodeInfo] = []
    for record in _records(text, "NodeName", split_run_together=True):
        kv = parse_key_values(record)
        name = kv["NodeName"]
        try:
            if "State" not in kv:
                raise ValueError("no State=")
            base, flags = split_node_state(kv["State"])
            gpus = parse_gres_gpus(kv.get("Gres")) or parse_tres_gpus(kv.get("CfgTRES"))
            used = kv.get("GresUsed")
            allocated = parse_gres_gpus(used) if used else parse_tres_gpus(kv.get("AllocTRES"))
            reason = kv.get("Reason")
            nodes.append(
                SlurmNodeInfo(
                    name=name,
                    base_state=base,
                    flags=flags,
                    reason=None if is_empty(reason) else reason,
                    gpus=gpus,
                    gpus_allocated=allocated,
                    partitions=tuple(p for p in kv.get("Partitions", "").split(",") if p),
                )
            )
        except ValueError as exc:
            raise ValueError(f"node {name}: {exc}") from None
    return nodes


# scontrol prints a pending job's description in place of its reason where Slurm set
# one, with "_" for " "; squeue --json keeps the reason (Resources) and the description.
_DESCRIBED_REASONS = {
    "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher priority "
    "partitions": "Resources",
}


def _text_reason(reason: str) -> str:
    return _DESCRIBED_REASONS.get(reason.replace("_", " "), reason)


def parse_scontrol_jobs(text: str) -> list[SlurmJobInfo]:
    """``scontrol -o show job`` (any version) → jobs."""
    jobs: list[SlurmJobInfo] = []
    for record in _records(text, "JobId"):
        kv = parse_key_values(record)
        job_id = kv["JobId"]
        try:
            state = _job_state(kv.get("JobState"))
            num_nodes = kv.get("NumNodes", "1").split("-")[0]
            asked = _asked_gpus(
                tres_req=kv.get("ReqTRES", ""),
                per_job=kv.get("TresPerJob", ""),
                per_node=kv.get("TresPerNode", ""),
                per_task=kv.get("TresPerTask", ""),
                node_count=int(num_nodes) if num_nodes.isdigit() else None,
                tasks=int(kv["NumTasks"]) if kv.get("NumTasks", "").isdigit() else None,
            )
            alloc = kv.get("AllocTRES", kv.get("TRES", ""))
            gpus = asked if state == "PENDING" or is_empty(alloc) else parse_tres_gpus(alloc)
            tasks, throttle, array_spec = (1, None, "")
            if state == "PENDING" and "ArrayTaskId" in kv:
                array_spec = kv["ArrayTaskId"]
                tasks, throttle = count_array_tasks(array_spec)
            reservation = kv.get("Reservation")
            jobs.append(
                SlurmJobInfo(
                    job_id=job_id,
                    name=kv.get("JobName", ""),
                    user=kv.get("UserId", "").split("(")[0],
                    account=kv.get("Account", "") if not is_empty(kv.get("Account")) else "",
                    state=state,
                    state_reason=_text_reason(kv.get("Reason", "None")),
                    nodes=expand_hostlist(kv.get("NodeList")),
                    gpus=gpus,
                    partition=kv.get("Partition", ""),
                    submitted_at=parse_time(kv.get("SubmitTime")),
                    started_at=parse_time(kv.get("StartTime")) if state != "PENDING" else None,
                    requeueable=kv.get("Requeue", "1") != "0",
                    batch=kv.get("BatchFlag", "1") != "0",
                    array_tasks=tasks,
                    array_throttle=throttle,
                    restarts=int(kv["Restarts"]) if kv.get("Restarts", "").isdigit() else 0,
                    eligible_at=parse_time(kv.get("EligibleTime")),
                    required_nodes=expand_hostlist(kv.get("ReqNodeList")),
                    reservation="" if is_empty(reservation) else str(reservation),
                    array_spec="" if is_empty(array_spec) else array_spec,
                )
            )
        except ValueError as exc:
            raise ValueError(f"job {job_id}: {exc}") from None
    return jobs


# ------------------------------------------------------------------------ sacct -P

# The fields ``accounting_since`` asks sacct for, in this order. JobName is last: it is
# the one free-text field, so a "|" in a job name cannot shift the others.
SACCT_FIELDS = (
    "JobID",
    "User",
    "Account",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "NodeList",
    "AllocTRES",
    "Partition",
    "JobName",
)


def parse_sacct(text: str, *, fields: Sequence[str] = SACCT_FIELDS) -> list[SchedJob]:
    """``sacct -P -n --format=<fields>`` → one ``SchedJob`` per job allocation, in sacct's
    order. Step lines (``123.batch``, ``123.0``, ``123.extern``) are folded into the job
    line above them (their names go in ``extra["steps"]``). With ``-D`` a requeued job has
    one line per run, each its own ``SchedJob`` with the same ``job_id``. A header line
    is skipped. ``fields`` must end with JobName when names may hold ``|``."""
    required = {"JobID", "State"}
    if not required <= set(fields):
        raise ValueError(f"sacct fields must include {sorted(required)}")
    jobs: list[SchedJob] = []
    steps: dict[int, list[str]] = {}
    last_by_id: dict[str, int] = {}
    # A leading byte-order mark would become part of the first job's id.
    for lineno, line in enumerate(text.removeprefix("\ufeff").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|", len(fields) - 1)
        if len(parts) != len(fields):
            raise ValueError(
                f"sacct line {lineno}: {len(parts)} fields, expected {len(fields)} "
                f"({'|'.join(fields)}): {line[:120]!r}"
            )
        row = dict(zip(fields, parts, strict=True))
        if row["JobID"] == "JobID":
            continue
        base, dot, step = row["JobID"].partition(".")
        if dot:
            owner = last_by_id.get(base)
            if owner is not None:
                steps[owner].append(step)
            continue
        try:
            jobs.append(_sacct_job(row))
        except ValueError as exc:
            raise ValueError(f"sacct line {lineno} (job {row['JobID']}): {exc}") from None
        last_by_id[base] = len(jobs) - 1
        steps[len(jobs) - 1] = []
    for index, names in steps.items():
        if names:
            job = jobs[index]
            jobs[index] = dataclasses.replace(job, extra={**job.extra, "steps": ",".join(names)})
    return jobs


def _sacct_job(row: Mapping[str, str]) -> SchedJob:
    words = row["State"].split()
    if not words:
        raise ValueError("empty State")
    state = words[0].upper()
    exit_code, signal = parse_exit_code(row.get("ExitCode", ""))
    extra = {"partition": row.get("Partition", "")}
    if signal:
        extra["signal"] = str(signal)
    if len(words) >= 3 and words[1] == "by":  # "CANCELLED by 1000"
        extra["cancelled_by"] = words[2]
    return SchedJob(
        job_id=row["JobID"],
        name=row.get("JobName", ""),
        user=row.get("User", ""),
        account=row.get("Account", ""),
        state=state,
        nodes=expand_hostlist(row.get("NodeList")),
        gpus=parse_tres_gpus(row.get("AllocTRES")),
        submitted_at=parse_time(row.get("Submit")),
        started_at=parse_time(row.get("Start")),
        ended_at=parse_time(row.get("End")),
        exit_code=exit_code,
        extra=extra,
    )
