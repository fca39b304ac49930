"""``gpufleet rollouts``: stack rollouts, a cluster's migration to another stack inside
maintenance windows (scheduled with ``gpufleet clusters migrate``): list, show with each
node's progress, pause, resume, abort, and roll one node back to its old stack."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.node_ref import find_node
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    counts,
    emit,
    fields,
    fmt_time,
    plain,
    print_json,
    print_table,
    styled,
    table,
)
from gpufleet.core.enums import RolloutStatus
from gpufleet.core.rollouts import Rollout

app = typer.Typer(
    no_args_is_help=True,
    help="Stack rollouts: clusters migrating to another stack in maintenance windows.",
)

STATUS_STYLES = {
    "scheduled": "cyan",
    "running": "magenta",
    "paused": "bold yellow",
    "aborting": "yellow",
    "succeeded": "green",
    "aborted": "dim",
}
NODE_STYLES = {
    "pending": "dim",
    "migrating": "magenta",
    "done": "green",
    "failed": "bold red",
    "rolling_back": "magenta",
    "rolled_back": "yellow",
    "skipped": "dim",
}

RolloutArg = Annotated[str, typer.Argument(help="Rollout id (`gpufleet rollouts list`).")]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="Why; kept in the audit log.")]


def opening_text(r: Rollout) -> Text:
    """The current opening (``open now``), else the next; ``-`` for a rollout that has
    ended, ``none`` for one whose window never opens again."""
    if r.status in (RolloutStatus.SUCCEEDED, RolloutStatus.ABORTED):
        return Text("-", style="dim")
    if r.next_opening is None:
        return Text("none (the window does not open again)", style="dim")
    span = f"{fmt_time(r.next_opening.start)} to {fmt_time(r.next_opening.end)}"
    return Text(f"open now: {span}", style="green") if r.open_now else Text(span)


def summary_rows(r: Rollout) -> list[tuple[str, Text | str]]:
    """What ``clusters migrate`` prints and ``rollouts show`` heads its table with."""
    stacks = f"{r.from_stack or 'no stack'} -> {r.to_stack}"
    return [
        ("rollout", r.id),
        ("cluster", f"{r.cluster_name} ({r.cluster_id})"),
        ("stack", stacks),
        ("status", styled(r.status.value, STATUS_STYLES)),
        ("detail", r.detail or "-"),
        ("window", r.window_text),
        ("next opening", opening_text(r)),
        ("nodes", f"{len(r.nodes)}"),
        ("  by status", counts(r.counts, NODE_STYLES)),
        ("max unavailable", r.max_unavailable),
        ("at window close", r.on_window_close.value),
        ("failures", f"{r.failures} (it pauses at {r.failure_budget})"),
    ]


def render_summary(r: Rollout) -> None:
    print_table(fields(summary_rows(r)))


def render_rollout(r: Rollout) -> None:
    rows = summary_rows(r)
    rows += [
        ("reservation", r.reservation or "-"),
        ("by", r.created_by),
        ("created", fmt_time(r.created_at)),
        ("updated", fmt_time(r.updated_at)),
        ("finished", fmt_time(r.finished_at)),
    ]
    print_table(fields(rows))
    t = table("NODE", "STATUS", "REPAIR", "REPAIR STATUS", "ATTEMPTS", "DETAIL",
              right=("ATTEMPTS",))  # fmt: skip
    for n in sorted(r.nodes, key=lambda n: n.position):
        t.add_row(
            plain(n.node_name),
            styled(n.status.value, NODE_STYLES),
            plain(n.repair_id),
            plain(n.repair_status),
            str(n.attempts),
            plain(n.detail),
        )
    typer.echo()
    print_table(t)


def _render_list(rollouts: list[Rollout]) -> None:
    t = table("ID", "STATUS", "STACK", "WINDOW", "NEXT OPENING", "NODES", "CREATED")
    for r in rollouts:
        t.add_row(
            plain(r.id),
            styled(r.status.value, STATUS_STYLES),
            plain(f"{r.from_stack or '-'} -> {r.to_stack}"),
            plain(r.window_text),
            opening_text(r),
            counts(r.counts, NODE_STYLES),
            fmt_time(r.created_at),
        )
    print_table(t, empty="no rollouts")


@app.command("list")
def list_rollouts(
    ctx: typer.Context,
    cluster: Annotated[str, typer.Option("--cluster", "-c", help="Cluster id or name.")],
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Project id or name to look in.")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """A cluster's rollouts, newest first."""
    with config.client_for(ctx) as client:
        rollouts = client.list_rollouts(client.find_cluster(cluster, project=project).id)
    if output is OutputFormat.JSON:
        print_json(rollouts)
    else:
        _render_list(rollouts)


@app.command("show")
def show(ctx: typer.Context, rollout: RolloutArg, output: OutputOpt = OutputFormat.TABLE) -> None:
    """One rollout: its window, pacing, budget, and each node's progress."""
    with config.client_for(ctx) as client:
        found = client.get_rollout(rollout)
    emit(output, found, render_rollout)


@app.command("pause")
def pause(
    ctx: typer.Context, rollout: RolloutArg, reason: ReasonOpt = "",
    output: OutputOpt = OutputFormat.TABLE,
) -> None:  # fmt: skip
    """Hold a rollout: no node starts until resumed; those under way finish."""
    with config.client_for(ctx) as client:
        paused = client.pause_rollout(rollout, reason=reason)
    emit(output, paused, render_summary)


@app.command("resume")
def resume(
    ctx: typer.Context,
    rollout: RolloutArg,
    retry_failed: Annotated[
        bool,
        typer.Option(
            "--retry-failed",
            help="Put failed nodes back in line and forgive their failures (needed once "
            "the failure budget is spent).",
        ),
    ] = False,
    reason: ReasonOpt = "",
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Resume a paused rollout: it waits for (or works in) its window again."""
    with config.client_for(ctx) as client:
        resumed = client.resume_rollout(rollout, reason=reason, retry_failed=retry_failed)
    emit(output, resumed, render_summary)


@app.command("abort")
def abort(
    ctx: typer.Context, rollout: RolloutArg, reason: ReasonOpt = "",
    output: OutputOpt = OutputFormat.TABLE,
) -> None:  # fmt: skip
    """Stop a rollout: no node starts any more (project admins).

    Nodes under way finish and return to service; nodes already moved stay moved."""
    with config.client_for(ctx) as client:
        aborted = client.abort_rollout(rollout, reason=reason)
    emit(output, aborted, render_summary)


@app.command("rollback")
def rollback(
    ctx: typer.Context,
    rollout: RolloutArg,
    node: Annotated[str, typer.Argument(help="Node id, or its name in the rollout's cluster.")],
    reason: ReasonOpt = "",
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Put one node back on the stack it came from (project admins).

    Only a node done or failed, of a rollout not finished; it moves in the window, like
    the others."""
    with config.client_for(ctx) as client:
        found = client.get_rollout(rollout)
        # The name is looked for in the rollout's own cluster: never ambiguous.
        node_id = find_node(client, node, cluster=found.cluster_id, project=None).id
        done = client.rollback_rollout_node(found.id, node_id, reason=reason)
    emit(output, done, render_rollout)
