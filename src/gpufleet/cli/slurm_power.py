"""``gpufleet slurm resume|suspend HOSTLIST``: Slurm's ResumeProgram and SuspendProgram
for ``State=CLOUD`` nodes (autoscaling mode ``slurm``).

slurmctld runs them as SlurmUser, on its own host, with the hostlist as the only argument
and an environment of its own (``SLURM_CONF``, and ``SLURM_RESUME_FILE`` for resume):
nothing of the caller's shell, so a one-line wrapper names the cluster::

    #!/bin/sh
    # /etc/slurm/gpufleet-resume (and the same with suspend): slurm.conf
    # ResumeProgram=/etc/slurm/gpufleet-resume, SuspendProgram=/etc/slurm/gpufleet-suspend
    GPUFLEET_CLUSTER=train exec /opt/gpufleet/bin/gpufleet slurm resume "$@"

The server and the token come as for every command: ``gpufleet login`` run once as
SlurmUser (saved owner-only in its home), or ``GPUFLEET_URL`` / ``GPUFLEET_TOKEN`` set in
the wrapper (then make it readable by SlurmUser only). The token needs the project's
admin role.

``resume`` reads ``SLURM_RESUME_FILE`` first (the file is gone once slurmctld stops),
asks the server and returns as soon as it accepted: the machines come in the
background, and must register with slurmd within Slurm's ResumeTimeout. Slurm keeps
nothing of what these programs print, so each call appends one line to ``--log-file``
(the time, action, cluster, nodes, jobs, and the action id or the error; never the
token), or writes it to stderr when that file cannot be opened.

Exit codes: 0 the server accepted (or had nothing to do), 2 bad input (a hostlist or a
resume file that is not one, no cluster, no credentials, a 4xx), 1 the server failed or
could not be reached.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.errors import EXIT_FAILURE, EXIT_USAGE, CliError, describe
from gpufleet.cli.output import stderr
from gpufleet.client.errors import ApiError, ServerUnreachable
from gpufleet.core.autoscaling import PowerAction, PowerResult
from gpufleet.core.clock import utcnow
from gpufleet.schedulers.slurm.power import (
    MAX_RESUME_FILE_BYTES,
    HostlistError,
    ResumeFile,
    ResumeFileError,
    expand_nodes,
    parse_resume_file,
)

ENV_CLUSTER = "GPUFLEET_CLUSTER"
ENV_PROJECT = "GPUFLEET_PROJECT"
ENV_RESUME_FILE = "SLURM_RESUME_FILE"
DEFAULT_LOG_FILE = Path("/var/log/gpufleet/slurm-power.log")
# The server keeps at most this many jobs with one call, and a job's features and
# partition up to these lengths: they are notes on the action, never a reason to refuse
# a resume (the nodes would go DOWN), so more is cut here.
MAX_JOBS = 1024
MAX_FEATURES = 512
MAX_PARTITION = 128
EXIT_OK = 0
MIN_SECRET = 8

ClusterOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster",
        "-c",
        envvar=ENV_CLUSTER,
        help=f"The cluster (id or name) whose nodes these are; default ${ENV_CLUSTER}.",
    ),
]
ProjectOpt = Annotated[
    str | None,
    typer.Option(
        "--project",
        "-p",
        envvar=ENV_PROJECT,
        help=f"Project to find the cluster's name in; default ${ENV_PROJECT}.",
    ),
]
LogFileOpt = Annotated[
    Path,
    typer.Option(
        "--log-file",
        dir_okay=False,
        help="Append one line per call here (Slurm logs nothing these programs print); "
        "stderr when it cannot be opened.",
    ),
]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="Kept with the action.")]
HostlistArg = Annotated[
    str,
    typer.Argument(
        help="The nodes, as Slurm passes them: cloud[1-3,5],gpu-[01-02],node7.",
        show_default=False,
    ),
]


@dataclass(frozen=True)
class Outcome:
    """How one call ended: its exit code, and the action id or the error."""

    code: int
    action_id: str | None = None
    error: str = ""
    note: str = ""


# ---------------------------------------------------------------- the log line

_PLAIN = re.compile(r"^[A-Za-z0-9_.,:/@+\[\]-]*$")


def _value(text: str, *, limit: int = 512) -> str:
    """A field's value: bare when it is plain, else JSON-quoted (one line always)."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text if text and _PLAIN.match(text) else json.dumps(text, ensure_ascii=False)


def format_log_line(
    *,
    at: dt.datetime,
    action: PowerAction,
    cluster: str | None,
    hostlist: str,
    nodes: int | None,
    jobs: Sequence[str],
    outcome: Outcome,
    secrets: Sequence[str] = (),
) -> str:
    """One line: ``<UTC time> <action> cluster=.. hostlist=.. nodes=N jobs=.. exit=N``,
    then ``action=<id>`` (``none``: nothing to do) or ``error="..."``, and ``note=".."``.
    Any of ``secrets`` in it (the token) is blanked out."""
    stamp = at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    parts = [
        stamp,
        action.value,
        f"cluster={_value(cluster or '')}",
        f"hostlist={_value(hostlist)}",
        f"nodes={nodes if nodes is not None else '?'}",
        f"jobs={_value(','.join(jobs[:20]) + (f',+{len(jobs) - 20}' if len(jobs) > 20 else ''))}",
        f"exit={outcome.code}",
    ]
    if outcome.code == EXIT_OK:
        parts.append(f"action={outcome.action_id or 'none'}")
    else:
        parts.append(f"error={_value(outcome.error, limit=1000)}")
    if outcome.note:
        parts.append(f"note={_value(outcome.note)}")
    line = " ".join(parts)
    for secret in secrets:
        if len(secret) >= MIN_SECRET:  # a one-letter "token" would blank every such letter
            line = line.replace(secret, "***")
    return line


def append_log(path: Path, line: str) -> bool:
    """Append ``line`` to ``path`` (made 0640 if new); False (and the line on stderr)
    when it cannot be opened or written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        try:
            os.write(fd, (line + "\n").encode())
        finally:
            os.close(fd)
    except OSError as exc:
        why = exc.strerror or exc
        sys.stderr.write(f"gpufleet slurm power: cannot write {path} ({why}): {line}\n")
        return False
    return True


# ---------------------------------------------------------------- the call


def read_resume_file() -> tuple[bytes | None, str]:
    """``SLURM_RESUME_FILE``'s bytes (None when unset or already gone, with a note)."""
    path = os.environ.get(ENV_RESUME_FILE)
    if not path:
        return None, ""
    try:
        with Path(path).open("rb") as f:
            # one byte past the limit: parse_resume_file then refuses it by its size
            return f.read(MAX_RESUME_FILE_BYTES + 1), ""
    except OSError as exc:
        # the nodes alone are enough to resume; only the jobs' details are lost
        return None, f"resume file {path} unreadable ({exc.strerror or exc}); no job details"


def job_bodies(resume: ResumeFile | None) -> list[dict[str, object]]:
    """The resume file's jobs as the power call takes them (at most ``MAX_JOBS``)."""
    if resume is None:
        return []
    return [
        {
            "job_id": job.job_id,
            "nodes": list(job.nodes_resume or job.nodes_alloc),
            "features": job.features[:MAX_FEATURES],
            "partition": job.partition[:MAX_PARTITION],
        }
        for job in resume.jobs[:MAX_JOBS]
    ]


def _power(
    ctx: typer.Context,
    *,
    action: PowerAction,
    hostlist: str,
    cluster: str | None,
    project: str | None,
    log_file: Path,
    reason: str,
) -> None:
    raw, note = read_resume_file() if action is PowerAction.RESUME else (None, "")
    started = utcnow()
    nodes: tuple[str, ...] | None = None
    jobs: list[dict[str, object]] = []
    secrets: list[str] = []
    summary = ""
    try:
        nodes = expand_nodes(hostlist)
        resume = parse_resume_file(raw) if raw is not None else None
        jobs = job_bodies(resume)
        if resume is not None and len(resume.jobs) > MAX_JOBS:
            note = f"{len(resume.jobs)} jobs in the resume file; the first {MAX_JOBS} sent"
        if not cluster:
            raise CliError(
                f"no cluster: give --cluster NAME or set {ENV_CLUSTER} (in the wrapper "
                "script slurm.conf names as ResumeProgram/SuspendProgram)"
            )
        opts = ctx.find_root().obj
        if not isinstance(opts, config.GlobalOptions):
            opts = config.GlobalOptions()
        creds = config.resolve_credentials(url=opts.url, token=opts.token)
        secrets.append(creds.token)
        with config.make_client(creds) as client:
            cluster_id = client.find_cluster(cluster, project=project).id
            result = client.power_nodes(
                cluster_id,
                action=action,
                nodes=nodes,
                jobs=jobs,
                reason=reason or f"Slurm's {action.value.capitalize()}Program",
            )
        summary = _summary(action, len(nodes), result)
        action_id = result.action.id if result.action is not None else None
        if result.action is None:
            note = "; ".join(n for n in (note, result.detail) if n)
        outcome = Outcome(EXIT_OK, action_id=action_id, note=note)
    except (HostlistError, ResumeFileError) as exc:
        outcome = Outcome(EXIT_USAGE, error=str(exc), note=note)
    except (ApiError, ServerUnreachable, CliError) as exc:
        message, code = describe(exc)
        outcome = Outcome(code, error=message, note=note)
    except Exception as exc:  # noqa: BLE001 - Slurm keeps nothing else: log it, exit 1
        outcome = Outcome(EXIT_FAILURE, error=f"{type(exc).__name__}: {exc}", note=note)
    line = format_log_line(
        at=started,
        action=action,
        cluster=cluster,
        hostlist=hostlist,
        nodes=len(nodes) if nodes is not None else None,
        jobs=[str(j["job_id"]) for j in jobs],
        outcome=outcome,
        secrets=secrets,
    )
    append_log(log_file, line)
    if outcome.code != EXIT_OK:
        stderr().print(Text(f"error: {outcome.error}", style="red"))
        raise typer.Exit(outcome.code)
    typer.echo(summary)


def _summary(action: PowerAction, count: int, result: PowerResult) -> str:
    done = (
        f"action {result.action.id} ({result.action.status.value})"
        if result.action is not None
        else result.detail or "nothing to do"
    )
    return f"{action.value} {count} node(s): accepted, {done}"


def resume(
    ctx: typer.Context,
    hostlist: HostlistArg = "",
    cluster: ClusterOpt = None,
    project: ProjectOpt = None,
    log_file: LogFileOpt = DEFAULT_LOG_FILE,
    reason: ReasonOpt = "",
) -> None:
    """Slurm's ResumeProgram: get machines for these CLOUD nodes (their slurmd must
    register within ResumeTimeout). Reads SLURM_RESUME_FILE for the jobs that wait.
    Returns once the server accepted. Exit 0 accepted, 2 bad input, 1 server error."""
    _power(
        ctx,
        action=PowerAction.RESUME,
        hostlist=hostlist,
        cluster=cluster,
        project=project,
        log_file=log_file,
        reason=reason,
    )


def suspend(
    ctx: typer.Context,
    hostlist: HostlistArg = "",
    cluster: ClusterOpt = None,
    project: ProjectOpt = None,
    log_file: LogFileOpt = DEFAULT_LOG_FILE,
    reason: ReasonOpt = "",
) -> None:
    """Slurm's SuspendProgram: give back the machines of these nodes, idle for Slurm's
    SuspendTime (a node that runs a job or is under repair stays). Returns once the
    server accepted. Exit 0 accepted, 2 bad input, 1 server error."""
    _power(
        ctx,
        action=PowerAction.SUSPEND,
        hostlist=hostlist,
        cluster=cluster,
        project=project,
        log_file=log_file,
        reason=reason,
    )
