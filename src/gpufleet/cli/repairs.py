"""``gpufleet repairs``: the repair queue (list, show, approve, dismiss, force), the
policy's dry run (replay) and a project's repair policy (policy show, policy set)."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.cli.node_ref import NODE_HELP, find_node
from gpufleet.cli.nodes import confirm
from gpufleet.cli.output import (
    SEVERITY_STYLES,
    OutputFormat,
    OutputOpt,
    emit,
    fields,
    fmt_age,
    fmt_time,
    note,
    plain,
    print_data,
    print_table,
    styled,
    table,
)
from gpufleet.cli.paging import collect
from gpufleet.client.api import policy_json, replay_adapter
from gpufleet.core.enums import RepairAction, RepairStatus
from gpufleet.core.ids import is_id
from gpufleet.core.models import Page, Repair
from gpufleet.core.repair.models import DrainTimeoutAction, PolicyConfig, RepairKind
from gpufleet.core.repair.replay import ReplayReport

app = typer.Typer(help="The repair queue: recommendations, approvals, progress.",
                  no_args_is_help=True)  # fmt: skip
policy_app = typer.Typer(help="A project's repair policy.", no_args_is_help=True)
app.add_typer(policy_app, name="policy")

STATUS_STYLES = {
    "proposed": "bold yellow",
    "approved": "cyan",
    "cordoning": "magenta",
    "draining": "magenta",
    "acting": "magenta",
    "verifying": "magenta",
    "succeeded": "green",
    "failed": "bold red",
    "rejected": "dim",
    "superseded": "dim",
    "resolved": "dim",
}

RepairRef = Annotated[str, typer.Argument(help="Repair id.")]
ProjectReq = Annotated[str, typer.Option("--project", "-p", help="Project id or name.")]


def _subject(r: Repair) -> str:
    if r.kind == "incident":
        return f"incident {r.incident_key or '?'} ({len(r.node_ids)} nodes)"
    return r.node_name or r.node_id or "-"


def _action(r: Repair) -> Text:
    text = Text(r.action.value)
    if r.gpu_index is not None:
        text.append(f" gpu {r.gpu_index}")
    if r.escalated_from is not None:
        text.append(f" (from {r.escalated_from.value})", style="dim")
    return text


def _status(r: Repair) -> Text:
    text = styled(r.status.value, STATUS_STYLES)
    if r.auto_approved:
        text.append(" (auto)", style="dim")
    if r.forced:
        text.append(" (forced)", style="red")
    return text


def _render_list(page: Page[Repair]) -> None:
    t = table("ID", "NODE", "ACTION", "STATUS", "SIGNATURE", "AGE", "DETAIL")
    for r in page.items:
        t.add_row(
            plain(r.id),
            plain(_subject(r)),
            _action(r),
            _status(r),
            plain(r.signature_id),
            fmt_age(r.created_at),
            plain(r.detail),
        )
    print_table(t, empty="no repairs")
    if page.next_cursor:
        note(f"showing the first {len(page.items)} repairs; raise --limit for more")


def _dicts(value: object) -> list[dict[str, Any]]:
    """The list of objects under an evidence key; anything else (old rows, a key the
    server dropped) reads as empty rather than crashing the page a person needs."""
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, dict)]


def _render_findings(findings: list[dict[str, Any]], *, title: str) -> None:
    t = table("SIGNATURE", "SEVERITY", "GPU", "COUNT", "FIRST SEEN", "EVIDENCE",
              title=title, right=("GPU", "COUNT"))  # fmt: skip
    for f in findings:
        severity = f.get("severity")
        t.add_row(
            plain(f.get("signature_id")),
            styled(str(severity), SEVERITY_STYLES) if severity else plain(None),
            plain(f.get("gpu_index")),
            plain(f.get("count")),
            _when(f.get("first_seen")),
            plain(f.get("evidence")),
        )
    print_table(t)


def _render_history(history: list[dict[str, Any]]) -> None:
    t = table("REPAIR", "ACTION", "STATUS", "FINISHED", title="Host history")
    for h in history:
        t.add_row(
            plain(h.get("repair_id")),
            plain(h.get("action")),
            styled(str(h.get("status")), STATUS_STYLES),
            _when(h.get("finished_at")),
        )
    print_table(t)


def _render_jobs(jobs: list[dict[str, Any]], *, title: str) -> None:
    errors = [j["error"] for j in jobs if "error" in j]
    running = [j for j in jobs if "error" not in j]
    for error in errors:
        note(f"{title}: {error}")
    if errors and not running:
        return
    if not running:
        note(f"{title}: none")
        return
    t = table("JOB", "NAME", "USER", "ACCOUNT", "STATE", "GPUS", "STARTED",
              title=title, right=("GPUS",))  # fmt: skip
    for j in running:
        t.add_row(
            plain(j.get("job_id")),
            plain(j.get("name")),
            plain(j.get("user")),
            plain(j.get("account")),
            plain(j.get("state")),
            plain(j.get("gpus")),
            _when(j.get("started_at")),
        )
    print_table(t)


def _render_one(r: Repair) -> None:
    decided = "-"
    if r.decided_by:
        decided = r.decided_by + (f": {r.decision_reason}" if r.decision_reason else "")
    topology = r.evidence.get("topology")
    where = (
        ", ".join(f"{k} {v}" for k, v in topology.items() if v)
        if isinstance(topology, dict)
        else ""
    )
    rows: list[tuple[str, Text | str]] = [
        ("id", r.id),
        ("status", _status(r)),
        ("detail", r.detail or "-"),
        ("action", _action(r)),
        ("node" if r.kind != "incident" else "incident", _subject(r)),
        ("node id", r.node_id or "-"),
        ("cluster", r.cluster_id),
        ("host", r.host or "-"),
        ("topology", where or "-"),
        ("signature", r.signature_id),
        ("source", r.source),
        ("reason", r.reason),
        ("rule", r.rule),
        ("requested by", r.requested_by or "-"),
        ("decided by", decided),
        ("created", fmt_time(r.created_at)),
        ("approved", fmt_time(r.approved_at)),
        ("finished", fmt_time(r.finished_at)),
    ]
    print_table(fields(rows))
    members = _dicts(r.evidence.get("nodes"))
    if members:
        note("")
        t = table("NODE", "NODE ID", "FINDINGS", title="Nodes in the incident")
        for m in members:
            sigs = sorted({str(f.get("signature_id")) for f in _dicts(m.get("findings"))})
            t.add_row(plain(m.get("name")), plain(m.get("node_id")), plain(", ".join(sigs)))
        print_table(t)
    findings = _dicts(r.evidence.get("findings"))
    note("")
    if findings:
        _render_findings(findings, title="Evidence")
    elif r.source == "manual":
        note("Evidence: no open findings; an admin asked for it")
    else:
        note("Evidence: none stored")
    history = _dicts(r.evidence.get("history"))
    if history:
        note("")
        _render_history(history)
    if r.kind == "incident":
        return
    note("")
    if r.jobs is not None:
        _render_jobs(_dicts(r.jobs), title="Jobs on the node now")
    elif "jobs" in r.evidence:
        _render_jobs(_dicts(r.evidence["jobs"]), title="Jobs on the node when it was asked for")


def _repair_id(ref: str) -> str:
    if not is_id(ref):
        raise CliError(f"{ref!r} is not a repair id; `gpufleet repairs list` shows them")
    return ref


def _when(value: object) -> Text:
    """An ISO timestamp from evidence, written like every other time the CLI prints."""
    if not isinstance(value, str):
        return plain(value)
    try:
        return Text(fmt_time(dt.datetime.fromisoformat(value)))
    except ValueError:
        return plain(value)


def _reason(reason: str, *, option: str = "--reason") -> str:
    if not reason.strip():
        raise typer.BadParameter("give the reason in words; it is kept in the audit log",
                                 param_hint=option)  # fmt: skip
    return reason.strip()


def _after(verb: str) -> Callable[[Repair], None]:
    def render(r: Repair) -> None:
        note(f"repair {r.id} ({r.action.value} on {_subject(r)}) {verb}: now {r.status.value}"
             + (f" ({r.detail})" if r.detail else ""))  # fmt: skip

    return render


@app.command("list")
def list_repairs(
    ctx: typer.Context,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Cluster id or name.")
    ] = None,
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Project to find the cluster in.")
    ] = None,
    node: Annotated[str | None, typer.Option("--node", "-n", help=NODE_HELP)] = None,
    status: Annotated[
        list[RepairStatus] | None,
        typer.Option(case_sensitive=False, help="Only these statuses; repeatable. Implies --all."),
    ] = None,
    kind: Annotated[
        RepairKind | None,
        typer.Option(case_sensitive=False, help="Only node repairs, or incidents."),
    ] = None,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all", help="Every repair, ended ones too (default: proposed and in flight)."
        ),
    ] = False,
    limit: Annotated[int, typer.Option(min=1, help="Show at most N repairs.")] = 100,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """List repairs, newest first: what, where, why, and how far along."""
    with config.client_for(ctx) as client:
        cluster_id = None if cluster is None else client.find_cluster(cluster, project=project).id
        node_id = None
        if node is not None:
            node_id = find_node(client, node, cluster=cluster, project=project).id
        open_only = not show_all and not status
        page = collect(
            lambda cursor, n: client.list_repairs(
                cluster=cluster_id,
                node=node_id,
                status=status,
                kind=None if kind is None else kind.value,
                open=True if open_only else None,
                cursor=cursor,
                limit=n,
            ),
            limit=limit,
        )
    emit(output, page, _render_list)


@app.command("show")
def show_repair(ctx: typer.Context, ref: RepairRef, output: OutputOpt = OutputFormat.TABLE) -> None:
    """Show a repair: why (reason, rule, findings), host history, jobs on the node now."""
    with config.client_for(ctx) as client:
        repair = client.get_repair(_repair_id(ref))
    emit(output, repair, _render_one)


@app.command("approve")
def approve_repair(
    ctx: typer.Context,
    ref: RepairRef,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why; kept in the audit log.")] = "",
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Let the drain kill the jobs still running at its timeout (default: wait).",
        ),
    ] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Approve a proposed repair (project admins); the executor then carries it out."""
    with config.client_for(ctx) as client:
        repair = client.approve_repair(_repair_id(ref), reason=reason.strip(), force=force)
    emit(output, repair, _after("approved"))


@app.command("dismiss")
def dismiss_repair(
    ctx: typer.Context,
    ref: RepairRef,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why not. Required.")],
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Dismiss a proposed repair; nothing is done to the node."""
    reason = _reason(reason)
    with config.client_for(ctx) as client:
        repair = client.dismiss_repair(_repair_id(ref), reason=reason)
    emit(output, repair, _after("dismissed"))


@app.command("force")
def force_repair(
    ctx: typer.Context,
    ref: RepairRef,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why. Required.")],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Kill the jobs still on a draining repair's node now, so the repair can go on."""
    reason = _reason(reason)
    with config.client_for(ctx) as client:
        if not yes:
            repair = client.get_repair(_repair_id(ref))
            jobs = [j for j in _dicts(repair.jobs) if "error" not in j]
            who = ", ".join(sorted({f"{j.get('job_id')} ({j.get('user')})" for j in jobs}))
            what = f"kill the jobs on {_subject(repair)}"
            confirm(f"{what.capitalize()}{': ' + who if who else ''}?", yes=False, what=what)
        repair = client.force_repair(_repair_id(ref), reason=reason)
    emit(output, repair, _after("forced"))


def _render_replay(report: ReplayReport) -> None:
    t = table("AT", "SUBJECT", "KIND", "ACTION", "SIGNATURE", "AUTO", "REASON", "RULE")
    for e in report.entries:
        t.add_row(
            Text(fmt_time(e.at)),
            plain(e.subject),
            plain(e.kind),
            plain(None if e.action is None else e.action.value),
            plain(e.signature_id),
            Text("auto", style="yellow") if e.auto_approved else plain(None),
            plain(e.reason),
            plain(e.rule),
        )
    if report.entries:
        print_table(t)
    else:
        note("the policy would have done nothing")
    if report.summary:
        note("")
        rows = [(k, str(v)) for k, v in sorted(report.summary.items())]
        print_table(fields(rows, title="Summary"))


def _load_json_object(path: Path, *, option: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except ValueError as exc:
        raise CliError(f"{path} is not JSON ({option}): {exc}") from exc
    if not isinstance(data, dict):
        raise CliError(f"{path} must hold one JSON object of policy fields ({option})")
    return data


@app.command("replay")
def replay_policy(
    ctx: typer.Context,
    project: ProjectReq,
    days: Annotated[
        float, typer.Option(min=0.01, max=90, help="How far back to replay, in days.")
    ] = 7.0,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Only this cluster (id or name).")
    ] = None,
    policy_file: Annotated[
        Path | None,
        typer.Option(
            "--policy-file",
            help="Try this policy (JSON, as `policy show -o json` prints) instead of the "
            "project's.",
        ),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Dry run: what a policy would have done over the last days' findings; changes nothing."""
    policy = None if policy_file is None else _load_json_object(policy_file, option="--policy-file")
    with config.client_for(ctx) as client:
        cluster_id = None if cluster is None else client.find_cluster(cluster, project=project).id
        report = client.replay_repair_policy(
            project, days=days, cluster_id=cluster_id, policy=policy
        )
    if output is OutputFormat.JSON:
        print_data(replay_adapter().dump_python(report, mode="json"))
    else:
        _render_replay(report)


def _render_policy(policy: PolicyConfig) -> None:
    values = policy_json(policy)
    rows: list[tuple[str, Text | str]] = [
        (k, str(v)) for k, v in values.items() if k != "auto_approve"
    ]
    rows.append(
        (
            "auto_approve",
            ", ".join(f"{r.signature_id}:{r.action.value}" for r in policy.auto_approve)
            or "none (every repair waits for an admin)",
        )
    )
    print_table(fields(rows))


@policy_app.command("show")
def show_policy(
    ctx: typer.Context, project: ProjectReq, output: OutputOpt = OutputFormat.TABLE
) -> None:
    """Show a project's repair policy (the server's default until someone sets one)."""
    with config.client_for(ctx) as client:
        policy = client.get_repair_policy(project)
    if output is OutputFormat.JSON:
        print_data(policy_json(policy))
    else:
        _render_policy(policy)


def parse_auto_approve(values: list[str]) -> list[dict[str, str]]:
    """``["xid-79:reboot"]`` → rules; a malformed one is a usage error (exit 2)."""
    allowed = sorted(a.value for a in RepairAction if a not in
                     (RepairAction.NONE, RepairAction.RESTART_WORKLOAD))  # fmt: skip
    rules: list[dict[str, str]] = []
    for item in values:
        signature, sep, action = item.rpartition(":")
        if not sep or not signature.strip() or action.strip() not in allowed:
            raise typer.BadParameter(
                f"{item!r} is not SIGNATURE:ACTION (ACTION one of {', '.join(allowed)})",
                param_hint="--auto-approve",
            )
        rules.append({"signature_id": signature.strip(), "action": action.strip()})
    return rules


@policy_app.command("set")
def set_policy(
    ctx: typer.Context,
    project: ProjectReq,
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            help="The whole policy as JSON; fields left out take the defaults. Without it, "
            "the flags change the current policy.",
        ),
    ] = None,
    auto_approve: Annotated[
        list[str] | None,
        typer.Option(
            "--auto-approve",
            help="SIGNATURE:ACTION approved without a human, e.g. xid-79:reboot; repeatable; "
            "replaces the list.",
        ),
    ] = None,
    no_auto_approve: Annotated[
        bool, typer.Option("--no-auto-approve", help="Clear the list: every repair waits.")
    ] = False,
    breaker_max_share: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="Share of a cluster's nodes out at once (0-1]."),
    ] = None,
    incident_min_nodes: Annotated[
        int | None, typer.Option(min=2, help="Nodes failing together that make an incident.")
    ] = None,
    drain_timeout_action: Annotated[
        DrainTimeoutAction | None,
        typer.Option(case_sensitive=False, help="At the drain timeout: wait, or requeue the jobs."),
    ] = None,
    ttl_s: Annotated[float | None, typer.Option(min=0.0, help="Seconds.")] = None,
    cooldown_s: Annotated[float | None, typer.Option(min=0.0, help="Seconds.")] = None,
    ladder_window_s: Annotated[float | None, typer.Option(min=0.0, help="Seconds.")] = None,
    incident_window_s: Annotated[float | None, typer.Option(min=0.0, help="Seconds.")] = None,
    drain_timeout_s: Annotated[float | None, typer.Option(min=0.0, help="Seconds.")] = None,
    verify_settle_s: Annotated[float | None, typer.Option(min=0.0, help="Seconds.")] = None,
    verify_timeout_s: Annotated[float | None, typer.Option(min=0.0, help="Seconds.")] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Set a project's repair policy (project admins), from --file and/or flags."""
    if auto_approve and no_auto_approve:
        raise typer.BadParameter("give --auto-approve or --no-auto-approve, not both",
                                 param_hint="--auto-approve")  # fmt: skip
    rules = parse_auto_approve(auto_approve or [])
    changes: dict[str, Any] = {
        name: value
        for name, value in {
            "ttl_s": ttl_s,
            "cooldown_s": cooldown_s,
            "ladder_window_s": ladder_window_s,
            "breaker_max_share": breaker_max_share,
            "incident_window_s": incident_window_s,
            "drain_timeout_s": drain_timeout_s,
            "verify_settle_s": verify_settle_s,
            "verify_timeout_s": verify_timeout_s,
            "incident_min_nodes": incident_min_nodes,
            "drain_timeout_action": None
            if drain_timeout_action is None
            else drain_timeout_action.value,
        }.items()
        if value is not None
    }
    if rules or no_auto_approve:
        changes["auto_approve"] = rules
    base = None if file is None else _load_json_object(file, option="--file")
    if base is None and not changes:
        raise CliError("nothing to set: give --file, or a flag such as --breaker-max-share")
    with config.client_for(ctx) as client:
        # PUT replaces the whole policy: flags alone change the current one, not the
        # defaults, so `--auto-approve` does not quietly reset the breaker.
        current = base if base is not None else policy_json(client.get_repair_policy(project))
        stored = client.set_repair_policy(project, {**current, **changes})
    if output is OutputFormat.JSON:
        print_data(policy_json(stored))
    else:
        _render_policy(stored)
