"""``gpufleet nodes``: list and show nodes, with each GPU's latest sample; and the admin
actions on a node (cordon, uncordon, drain; reboot, reprovision, replace, remove and
reset-gpu, which run as an approved repair)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.cli.node_ref import NodeArg, find_node
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fields,
    fmt_age,
    fmt_num,
    fmt_time,
    health_text,
    note,
    plain,
    print_table,
    state_text,
    table,
)
from gpufleet.cli.paging import collect
from gpufleet.client.api import ApiClient
from gpufleet.core.enums import Health, NodeState
from gpufleet.core.limits import MAX_GPUS_PER_NODE
from gpufleet.core.models import Gpu, Node, NodeAction, NodeActionResult, Page

app = typer.Typer(help="Nodes and their GPUs.", no_args_is_help=True)

ClusterOpt = Annotated[str | None, typer.Option("--cluster", "-c", help="Cluster id or name.")]
ProjectOpt = Annotated[
    str | None, typer.Option("--project", "-p", help="Project to find the cluster name in.")
]


def _render_list(page: Page[Node]) -> None:
    t = table("NAME", "STATE", "HEALTH", "GPUS", "RACK", "LAST REPORT", "ID", right=("GPUS",))
    for n in page.items:
        t.add_row(
            plain(n.name),
            state_text(n.state.value),
            health_text(n.health.value),
            str(n.expected_gpus),
            plain(n.rack),
            fmt_age(n.last_report_at),
            plain(n.id),
        )
    print_table(t, empty="no nodes")
    if page.next_cursor:
        note(f"showing the first {len(page.items)} nodes; raise --limit for more")


def _ecc(gpu: Gpu) -> Text:
    sbe = "-" if gpu.ecc_sbe_volatile is None else str(gpu.ecc_sbe_volatile)
    dbe = "-" if gpu.ecc_dbe_volatile is None else str(gpu.ecc_dbe_volatile)
    # Any double-bit error is uncorrectable: make it impossible to miss.
    return Text(f"{sbe}/{dbe}", style="bold red" if gpu.ecc_dbe_volatile else "")


def _mem(gpu: Gpu) -> Text:
    if gpu.memory_used_mib is None and gpu.memory_total_mib is None:
        return Text("-", style="dim")
    used = fmt_num(gpu.memory_used_mib, digits=1, scale=1024).plain
    total = fmt_num(gpu.memory_total_mib, digits=1, scale=1024).plain
    return Text(f"{used}/{total}")


def _render_gpus(gpus: list[Gpu]) -> None:
    t = table(
        "IDX", "UUID", "UTIL %", "MEM GiB", "TEMP °C", "POWER W", "SM MHz", "ECC SBE/DBE",
        "HEALTH", "SAMPLED",
        title="GPUs",
        right=("IDX", "UTIL %", "MEM GiB", "TEMP °C", "POWER W", "SM MHz", "ECC SBE/DBE"),
    )  # fmt: skip
    for g in sorted(gpus, key=lambda g: g.index):
        t.add_row(
            str(g.index),
            plain(g.uuid),
            fmt_num(g.utilization_pct),
            _mem(g),
            fmt_num(g.temperature_c),
            fmt_num(g.power_w),
            fmt_num(g.sm_clock_mhz),
            _ecc(g),
            health_text(g.health.value),
            fmt_age(g.sampled_at),
        )
    print_table(t)


def _render_one(n: Node) -> None:
    rows: list[tuple[str, Text | str]] = [
        ("name", n.name),
        ("id", n.id),
        ("cluster", n.cluster_id),
        ("state", state_text(n.state.value)),
        ("health", health_text(n.health.value)),
        ("hostname", n.hostname or "-"),
        ("scheduler name", n.scheduler_name or "-"),
        ("serial", n.serial or "-"),
        ("provider instance", n.provider_instance_id or "-"),
        ("rack / leaf / pdu", " / ".join(v or "-" for v in (n.rack, n.leaf_switch, n.pdu))),
        ("expected gpus", str(n.expected_gpus)),
        (
            "last report",
            Text.assemble(fmt_age(n.last_report_at), f"  ({fmt_time(n.last_report_at)})")
            if n.last_report_at
            else fmt_age(None),
        ),
        ("created", fmt_time(n.created_at)),
    ]
    if n.software is not None:
        runs = n.software.model_dump(exclude_none=True)
        rows.append(("software", ", ".join(f"{k} {v}" for k, v in runs.items()) or "-"))
    if n.stack_skew:
        off = [f"{s.component} {s.have or 'none'} (stack: {s.want})" for s in n.stack_skew]
        rows.append(("off its stack", Text("; ".join(off), style="yellow")))
    print_table(fields(rows))
    if n.gpus:
        note("")  # a blank line between the two tables
        _render_gpus(n.gpus)
    elif n.gpus is not None:
        note("no GPUs reported yet")


def _cluster_id(client: ApiClient, ref: str | None, project: str | None) -> str | None:
    return None if ref is None else client.find_cluster(ref, project=project).id


@app.command("list")
def list_nodes(
    ctx: typer.Context,
    cluster: ClusterOpt = None,
    project: ProjectOpt = None,
    state: Annotated[
        NodeState | None, typer.Option(case_sensitive=False, help="Only this state.")
    ] = None,
    health: Annotated[
        Health | None, typer.Option(case_sensitive=False, help="Only this health.")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(min=1, help="Show at most N nodes (default: all).")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """List nodes, with state, health and when each last reported."""
    with config.client_for(ctx) as client:
        cluster_id = _cluster_id(client, cluster, project)
        page = collect(
            lambda cursor, n: client.list_nodes(
                cluster=cluster_id, state=state, health=health, cursor=cursor, limit=n
            ),
            limit=limit,
        )
    emit(output, page, _render_list)


@app.command("show")
def show_node(
    ctx: typer.Context,
    ref: NodeArg,
    cluster: ClusterOpt = None,
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Show a node and the latest sample of each of its GPUs."""
    with config.client_for(ctx) as client:
        node = find_node(client, ref, cluster=cluster, project=project)
    emit(output, node, _render_one)


@app.command("token")
def node_token(
    ctx: typer.Context,
    ref: NodeArg,
    cluster: ClusterOpt = None,
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Issue a new node token for the node's agent and print it (shown this once).

    The node's previous token is refused from now on. For machines that take no user data
    (bare metal from the host inventory) and reinstalled agents: write it to the file the
    agent's node_token_file setting names. Needs the project's admin role and a
    credential that does not expire (a node token never does)."""
    with config.client_for(ctx) as client:
        node = find_node(client, ref, cluster=cluster, project=project)
        issued = client.issue_node_token(node.id)
    emit(output, issued, lambda t: print(t.token))


# -- actions ----------------------------------------------------------------------------

ReasonOpt = Annotated[
    str,
    typer.Option(
        "--reason", "-r", help="Why; kept in the node's events and the audit log. Required."
    ),
]
YesOpt = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
ForceOpt = Annotated[
    bool,
    typer.Option(
        "--force",
        help="Let the drain kill the jobs still running at its timeout (default: wait for "
        "them, however long).",
    ),
]


def stdin_is_terminal() -> bool:
    return sys.stdin.isatty()


def confirm(question: str, *, yes: bool, what: str) -> None:
    """Ask ``question`` before something that cannot be taken back, unless ``--yes``.

    With no terminal to ask on (a script, a pipe, CI) it refuses with exit 2 rather than
    read a stray line of input as consent. ``what`` names the act in that refusal.
    """
    if yes:
        return
    if not stdin_is_terminal():
        raise CliError(f"not going to {what} unasked: stdin is not a terminal; pass --yes")
    typer.confirm(question, abort=True, err=True)


def _reason(reason: str) -> str:
    if not reason.strip():
        raise typer.BadParameter("give the reason in words, it is kept in the audit log",
                                 param_hint="--reason")  # fmt: skip
    return reason.strip()


def _act(
    ctx: typer.Context,
    action: NodeAction,
    ref: str,
    *,
    reason: str,
    cluster: str | None,
    project: str | None,
    output: OutputFormat,
    yes: bool = True,
    force: bool = False,
    gpu: int | None = None,
) -> None:
    reason = _reason(reason)
    with config.client_for(ctx) as client:
        node = find_node(client, ref, cluster=cluster, project=project)
        if not yes:
            verb = action.value.replace("_", " ")
            what = f"{verb} {f'GPU {gpu} of ' if gpu is not None else ''}node {node.name}"
            jobs = "its jobs are drained first" + (
                ", and killed at the drain timeout" if force else ""
            )
            confirm(f"{what.capitalize()} ({node.id})? {jobs}.", yes=False, what=what)
        result = client.node_action(
            node.id, action=action, reason=reason, force=force, gpu_index=gpu
        )
    emit(output, result, _render_action(action))


def _render_action(action: NodeAction) -> Callable[[NodeActionResult], None]:
    def render(result: NodeActionResult) -> None:
        node, repair = result.node, result.repair
        if repair is None:
            note(f"node {node.name} ({node.id}) is {node.state.value}")
            return
        note(
            f"{action.value} of node {node.name}: repair {repair.id} is {repair.status.value}"
            + (f" ({repair.detail})" if repair.detail else "")
        )
        note(f"follow it: gpufleet repairs show {repair.id}")

    return render


def _hold_command(action: NodeAction, doc: str) -> None:
    def command(
        ctx: typer.Context,
        ref: NodeArg,
        reason: ReasonOpt,
        cluster: ClusterOpt = None,
        project: ProjectOpt = None,
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        _act(ctx, action, ref, reason=reason, cluster=cluster, project=project, output=output)

    command.__doc__ = doc
    app.command(action.value)(command)


_hold_command(NodeAction.CORDON, "Stop new jobs landing on a node; running jobs go on.")
_hold_command(NodeAction.UNCORDON, "Put a cordoned or drained node back in service.")
_hold_command(NodeAction.DRAIN, "Cordon a node and let its jobs finish; none is killed.")


def _repair_command(action: NodeAction, doc: str) -> None:
    def command(
        ctx: typer.Context,
        ref: NodeArg,
        reason: ReasonOpt,
        cluster: ClusterOpt = None,
        project: ProjectOpt = None,
        yes: YesOpt = False,
        force: ForceOpt = False,
        output: OutputOpt = OutputFormat.TABLE,
    ) -> None:
        _act(ctx, action, ref, reason=reason, cluster=cluster, project=project,
             output=output, yes=yes, force=force)  # fmt: skip

    command.__doc__ = doc
    app.command(action.value)(command)


_repair_command(
    NodeAction.REBOOT,
    "Reboot a node as an approved repair: cordon, drain, reboot, verify it reports clean.",
)
_repair_command(
    NodeAction.REPROVISION,
    "Reinstall a node's OS image as an approved repair (cordon, drain, reprovision, verify).",
)
_repair_command(
    NodeAction.REPLACE,
    "Move a node onto a new host as an approved repair (cordon, drain, fail over, verify).",
)
_repair_command(
    NodeAction.REMOVE,
    "Take a node out of the cluster for good, after draining it.",
)


@app.command("reset-gpu")
def reset_gpu(
    ctx: typer.Context,
    ref: NodeArg,
    reason: ReasonOpt,
    gpu: Annotated[
        int | None,
        typer.Option("--gpu", min=0, max=MAX_GPUS_PER_NODE - 1, help="GPU index (default: all)."),
    ] = None,
    cluster: ClusterOpt = None,
    project: ProjectOpt = None,
    yes: YesOpt = False,
    force: ForceOpt = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Reset a node's GPU (or all of them) as an approved repair, after draining it."""
    _act(ctx, NodeAction.RESET_GPU, ref, reason=reason, cluster=cluster, project=project,
         output=output, yes=yes, force=force, gpu=gpu)  # fmt: skip
