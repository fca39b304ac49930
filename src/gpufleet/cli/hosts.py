"""``gpufleet hosts``: the host inventory (import from YAML or CSV, list, show, bind)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpufleet.cli import config
from gpufleet.cli.inventory_file import read_inventory
from gpufleet.cli.node_ref import NodeArg, find_node
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    note,
    plain,
    print_json,
    print_table,
    table,
)
from gpufleet.core.inventory import Host, HostState

app = typer.Typer(help="The host inventory: machines, BMCs, racks, spares.", no_args_is_help=True)

ProjectOpt = Annotated[str, typer.Option("--project", "-p", help="Project id or name.")]
HostArg = Annotated[str, typer.Argument(help="Hostname or host id.")]


def _render(hosts: list[Host]) -> None:
    t = table(
        "HOSTNAME", "BMC", "ADDRESS", "CREDENTIAL", "RACK", "CLUSTER", "ROLE", "STATE", "NODE"
    )
    for h in hosts:
        t.add_row(
            plain(h.hostname),
            plain(h.bmc_type.value),
            plain(h.bmc_address + (f":{h.port}" if h.port else "")),
            plain(h.credential or "-"),
            plain(h.rack or "-"),
            plain(h.cluster_id or "-"),
            plain(h.role.value),
            plain(h.state.value),
            plain(h.node_id or "-"),
        )
    print_table(t, empty="no hosts")


def _render_one(host: Host) -> None:
    _render([host])


@app.command("import")
def import_hosts(
    ctx: typer.Context,
    file: Annotated[Path, typer.Argument(help="YAML list or CSV with a header row.")],
    project: ProjectOpt,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create or update hosts by hostname, all or nothing (a bad row: exit 2, naming it)."""
    specs = read_inventory(file)
    with config.client_for(ctx) as client:
        result = client.import_hosts(project, specs)
    if output is OutputFormat.JSON:
        print_json(result)
    else:
        note(
            f"imported {len(specs)} host(s): {len(result.created)} created, "
            f"{len(result.updated)} updated, {len(result.unchanged)} unchanged"
        )


@app.command("list")
def list_hosts(
    ctx: typer.Context,
    project: ProjectOpt,
    cluster: Annotated[str | None, typer.Option(help="Only this cluster's (id or name).")] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(cluster, project=project).id if cluster else None
        hosts = client.list_hosts(project, cluster_id=cluster_id)
    if output is OutputFormat.JSON:
        print_json(hosts)
    else:
        _render(hosts)


@app.command("show")
def show_host(
    ctx: typer.Context, host: HostArg, project: ProjectOpt, output: OutputOpt = OutputFormat.TABLE
) -> None:
    with config.client_for(ctx) as client:
        found = client.get_host(project, host)
    emit(output, found, _render_one)


@app.command("bind")
def bind_host(
    ctx: typer.Context,
    host: HostArg,
    node: NodeArg,
    project: ProjectOpt,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Cluster to find the node name in.")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Record that a node runs on this host (also done when its agent reports the hostname)."""
    with config.client_for(ctx) as client:
        node_id = find_node(client, node, cluster=cluster, project=project).id
        bound = client.bind_host(project, host, node_id=node_id)
    emit(output, bound, _render_one)


@app.command("set-state")
def set_host_state(
    ctx: typer.Context,
    host: HostArg,
    state: Annotated[
        HostState, typer.Argument(help="in_service, spare or out_of_service (maintenance).")
    ],
    project: ProjectOpt,
    reason: Annotated[str, typer.Option(help="Why, for the timeline and the audit log.")] = "",
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Take a host out of service, return it to the spare pool, or put it in service."""
    with config.client_for(ctx) as client:
        moved = client.set_host_state(project, host, state=state, reason=reason)
    emit(output, moved, _render_one)
