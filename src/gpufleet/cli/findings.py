"""``gpufleet findings``: what the passive checks found, newest first."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.node_ref import NODE_HELP, find_node
from gpufleet.cli.output import (
    SEVERITY_STYLES,
    OutputFormat,
    OutputOpt,
    emit,
    fmt_age,
    plain,
    print_table,
    styled,
    table,
)
from gpufleet.cli.paging import collect
from gpufleet.core.models import Finding, Page


def list_findings(
    ctx: typer.Context,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Cluster id or name.")
    ] = None,
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Project to find the cluster in.")
    ] = None,
    node: Annotated[str | None, typer.Option("--node", "-n", help=NODE_HELP)] = None,
    signature: Annotated[str | None, typer.Option(help="Only this signature id.")] = None,
    open_only: Annotated[
        bool, typer.Option("--open/--all", help="Open findings only (default), or all.")
    ] = True,
    limit: Annotated[int, typer.Option(min=1, help="Show at most N findings.")] = 100,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """List findings (newest first): signature, severity, GPU, evidence."""
    with config.client_for(ctx) as client:
        cluster_id = None if cluster is None else client.find_cluster(cluster, project=project).id
        node_id = None
        if node is not None:
            node_id = find_node(client, node, cluster=cluster, project=project).id
        page = collect(
            lambda cursor, n: client.list_findings(
                cluster=cluster_id,
                node=node_id,
                signature=signature,
                open=True if open_only else None,
                cursor=cursor,
                limit=n,
            ),
            limit=limit,
        )
        names: dict[str, str] = {}
        if output is OutputFormat.TABLE and page.items:
            for cid in sorted({f.cluster_id for f in page.items}):
                names.update({n.id: n.name for n in client.iter_nodes(cluster=cid)})

    def render(p: Page[Finding]) -> None:
        t = table(
            "NODE", "GPU", "SIGNATURE", "SEVERITY", "TITLE", "COUNT", "LAST SEEN", "STATE",
            "EVIDENCE",
            right=("GPU", "COUNT"),
        )  # fmt: skip
        for f in p.items:
            t.add_row(
                plain(names.get(f.node_id, f.node_id)),
                plain(f.gpu_index),
                plain(f.signature_id),
                styled(f.severity.value, SEVERITY_STYLES),
                plain(f.title),
                str(f.count),
                fmt_age(f.last_seen),
                Text("open", style="red") if f.cleared_at is None else Text("cleared", "green"),
                plain(f.evidence),
            )
        print_table(t, empty="no findings")

    emit(output, page, render)
