"""What Slurm's power saving hands its ResumeProgram and SuspendProgram: pure parsers.

slurmctld runs both as SlurmUser with one argument, a hostlist (``cloud[1-3,5]``), and
gives ResumeProgram ``SLURM_RESUME_FILE``: a temporary JSON file of which job waits for
which nodes (it vanishes when slurmctld stops, so it is read at once). Two formats exist:

* 22.05 (recorded in the lab, ``tests/fixtures/slurm/resume-file-22.05.json``)::

    {"jobs":[{"job_id":1,"nodes":"cloud1"},{"job_id":2,"nodes":"cloud[2-3]"}],
     "all_nodes":"cloud[1-3]"}

  where a job's ``nodes`` are all its nodes (``all_nodes``: those resumed now).
* 23.02+ (``power_save.shtml``)::

    {"all_nodes_resume":"cloud[1-3]","jobs":[{"extra":null,"features":"h100",
     "job_id":2,"nodes_alloc":"cloud[2-3]","nodes_resume":"cloud[2-3]",
     "oversubscribe":"OK","partition":"cloud","reservation":null}]}

Both read into ``ResumeFile``. Keys may be missing or null (an empty string, no jobs);
``job_id`` may be a number or a string; a node list may be a hostlist or a list of
names. Anything else raises ``ResumeFileError``, and a hostlist that is not one raises
``HostlistError`` (both ``ValueError``s), each saying what was wrong and what is accepted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpufleet.schedulers.slurm.values import expand_hostlist

# At most this many nodes in one call: the server takes as many per request (its
# largest cluster), and a range like cloud[1-999999999] must fail fast, not fill memory.
MAX_NODES = 4096
# A Slurm node name as gpufleet takes it (the server checks the same).
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
# A job id as the resume file gives it: 7, "7", an array task "7_3", a het job "7+1".
JOB_ID = re.compile(r"^[0-9]+([_+][0-9]+)?$")
MAX_RESUME_FILE_BYTES = 16 * 1024 * 1024  # a resume file for 4096 nodes is far smaller


class HostlistError(ValueError):
    """The hostlist argument is not one Slurm would write."""


class ResumeFileError(ValueError):
    """``SLURM_RESUME_FILE`` holds something that is not a resume file."""


@dataclass(frozen=True)
class ResumeJob:
    """One job that waits for nodes being resumed.

    ``nodes_alloc``: all the job's nodes; ``nodes_resume``: those of them resumed by this
    call (22.05 names only the first: here they are the job's nodes among ``all_nodes``).
    ``features`` (the job's ``--constraint``), ``extra``, ``partition``, ``reservation``
    and ``oversubscribe`` are empty when the file has none (22.05 has none of them).
    """

    job_id: str
    nodes_alloc: tuple[str, ...]
    nodes_resume: tuple[str, ...]
    features: str = ""
    partition: str = ""
    reservation: str = ""
    extra: str = ""
    oversubscribe: str = ""


@dataclass(frozen=True)
class ResumeFile:
    nodes: tuple[str, ...]  # every node resumed by this call, in Slurm's order
    jobs: tuple[ResumeJob, ...]


# ------------------------------------------------------------------------ hostlists


def expand_nodes(hostlist: str, *, what: str = "hostlist") -> tuple[str, ...]:
    """A hostlist → node names, checked: ``cloud[1-3,5],gpu-[01-02],node7`` →
    ``cloud1 cloud2 cloud3 cloud5 gpu-01 gpu-02 node7`` (zero padding kept, duplicates
    dropped). Raises ``HostlistError`` for an empty or malformed one, a name gpufleet
    would refuse, or more than ``MAX_NODES`` names."""
    text = hostlist.strip()
    example = "give one like cloud[1-3,5],gpu-[01-02],node7"
    if not text:
        raise HostlistError(f"the {what} is empty; {example}")
    count = _count_names(text)
    if count is None:
        raise HostlistError(f"{what} {_short(text)}: not a hostlist; {example}")
    if count > MAX_NODES:
        raise HostlistError(
            f"{what} {_short(text)} names {count} nodes; at most {MAX_NODES} in one call"
        )
    try:
        names = expand_hostlist(text)
    except ValueError as exc:
        raise HostlistError(f"{exc}; {example}") from None
    bad = [n for n in names if not NODE_NAME.match(n)]
    if bad:
        raise HostlistError(
            f"{what} {_short(text)}: {_short(bad[0])} is not a node name (letters, digits, "
            "'.', '_', '-', starting with a letter or digit, at most 63); " + example
        )
    if not names:
        raise HostlistError(f"the {what} {_short(text)} names no node; {example}")
    return names


def _count_names(text: str) -> int | None:
    """How many names ``text`` expands to, without expanding it (None: not a hostlist)."""
    items = _split_outside_brackets(text)
    if items is None:
        return None
    total = 0
    for item in items:
        sizes: list[int] = []
        for group in re.findall(r"\[([^\[\]]*)\]", item):
            size = 0
            for part in group.split(","):
                match = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
                if match is None:
                    return None
                low, high = int(match.group(1)), int(match.group(2) or match.group(1))
                size += max(high - low + 1, 0)
            sizes.append(size)
        total += math.prod(sizes)
        if total > MAX_NODES:
            return total
    return total


def _split_outside_brackets(text: str) -> list[str] | None:
    """Split on commas outside ``[...]``; None for unbalanced or nested brackets."""
    items: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                return None
        elif ch == "]":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        return None
    items.append(text[start:])
    return [item for item in items if item.strip()]


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 4] + "...'"


# ------------------------------------------------------------------------ resume file


def parse_resume_file(data: str | bytes) -> ResumeFile:
    """The content of ``SLURM_RESUME_FILE``, in either format, → ``ResumeFile``.

    Without ``all_nodes``/``all_nodes_resume`` the nodes are the jobs' nodes together.
    Raises ``ResumeFileError`` for anything that is not such a JSON object."""
    if len(data) > MAX_RESUME_FILE_BYTES:
        raise ResumeFileError(
            f"resume file of {len(data)} bytes; a real one is far under "
            f"{MAX_RESUME_FILE_BYTES // (1024 * 1024)} MiB"
        )
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ResumeFileError(
            f"resume file is not JSON ({exc}); expected an object like "
            '{"all_nodes": "cloud[1-2]", "jobs": [{"job_id": 7, "nodes": "cloud[1-2]"}]}'
        ) from None
    if not isinstance(doc, Mapping):
        raise ResumeFileError(
            f"resume file holds a JSON {type(doc).__name__}, expected an object with "
            "all_nodes (or all_nodes_resume) and jobs"
        )
    key = "all_nodes_resume" if doc.get("all_nodes_resume") is not None else "all_nodes"
    listed = _nodes(doc.get(key), what=key)
    raw_jobs = doc.get("jobs")
    if raw_jobs is None:
        raw_jobs = []
    if not isinstance(raw_jobs, list):
        raise ResumeFileError(f"resume file: jobs is {_short(raw_jobs)}, expected a list")
    resumed = set(listed)
    jobs = tuple(_job(item, index=i, resumed=resumed) for i, item in enumerate(raw_jobs))
    if not listed:  # no all_nodes: what the jobs wait for
        listed = tuple(dict.fromkeys(n for job in jobs for n in job.nodes_resume))
    return ResumeFile(nodes=listed, jobs=jobs)


def _job(item: object, *, index: int, resumed: set[str]) -> ResumeJob:
    where = f"resume file: jobs[{index}]"
    if not isinstance(item, Mapping):
        raise ResumeFileError(f"{where} is {_short(item)}, expected an object")
    job_id = _job_id(item.get("job_id"), where=where)
    where = f"resume file: job {job_id}"
    if "nodes_alloc" in item or "nodes_resume" in item:  # 23.02+
        alloc = _nodes(item.get("nodes_alloc"), what=f"{where} nodes_alloc")
        resume = _nodes(item.get("nodes_resume"), what=f"{where} nodes_resume")
        alloc = alloc or resume
        if not resume:
            resume = tuple(n for n in alloc if n in resumed) if resumed else alloc
    else:  # 22.05: "nodes" is the job's allocation
        alloc = _nodes(item.get("nodes"), what=f"{where} nodes")
        resume = tuple(n for n in alloc if n in resumed) if resumed else alloc
    return ResumeJob(
        job_id=job_id,
        nodes_alloc=alloc,
        nodes_resume=resume,
        features=_text(item, "features", where=where),
        partition=_text(item, "partition", where=where),
        reservation=_text(item, "reservation", where=where),
        extra=_text(item, "extra", where=where),
        oversubscribe=_text(item, "oversubscribe", where=where),
    )


def _job_id(value: object, *, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ResumeFileError(
            f"{where}: job_id is {_short(value)}, expected a number (7) or its text ('7')"
        )
    text = str(value).strip()
    if not JOB_ID.match(text):
        raise ResumeFileError(f"{where}: job_id {_short(value)} is not a Slurm job id")
    return text


def _nodes(value: object, *, what: str) -> tuple[str, ...]:
    if value is None or value == "":
        return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        value = ",".join(value)
    if not isinstance(value, str):
        raise ResumeFileError(f"{what} is {_short(value)}, expected a hostlist like 'cloud[1-2]'")
    try:
        return expand_nodes(value, what=what)
    except HostlistError as exc:
        raise ResumeFileError(f"resume file: {exc}") from None


def _text(item: Mapping[str, object], key: str, *, where: str) -> str:
    value = item.get(key)
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    raise ResumeFileError(f"{where}: {key} is {_short(value)}, expected text or null")
