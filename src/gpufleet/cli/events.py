"""``gpufleet events``: the timeline of clusters and nodes, newest first."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.node_ref import NODE_HELP, find_node
from gpufleet.cli.output import OutputFormat, OutputOpt, emit, fmt_time, plain, print_table, table
from gpufleet.cli.paging import collect
from gpufleet.client.api import ApiClient
from gpufleet.client.errors import ApiError
from gpufleet.core.clock import utcnow
from gpufleet.core.models import Event, Page

_RELATIVE = re.compile(r"^(\d+)\s*([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str, *, now: dt.datetime | None = None) -> dt.datetime:
    """ISO 8601 (naive means UTC), or a span back from now: ``90s``, ``15m``, ``2h``, ``7d``."""
    text = value.strip()
    match = _RELATIVE.match(text)
    if match:
        seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
        try:
            return (now or utcnow()) - dt.timedelta(seconds=seconds)
        except OverflowError:
            raise typer.BadParameter(
                f"{value!r} reaches back before the year 1; give a shorter span or an ISO "
                "8601 time",
                param_hint="--since",
            ) from None
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is neither an ISO 8601 time (2026-01-31T12:00:00Z) "
            "nor a span like 15m, 2h, 7d",
            param_hint="--since",
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


# Nodes looked up one by one for a table of events from many clusters; the rest keep ids.
_MAX_LOOKUPS = 50


def _node_names(
    client: ApiClient, events: list[Event], *, cluster_id: str | None
) -> dict[str, str]:
    """Node id → name for the table: the cluster's nodes in one listing, else each node
    the events name (a node since removed, or out of reach, keeps its id)."""
    wanted = {e.node_id for e in events if e.node_id}
    if cluster_id is not None:
        return {n.id: n.name for n in client.iter_nodes(cluster=cluster_id) if n.id in wanted}
    names: dict[str, str] = {}
    for node_id in sorted(wanted)[:_MAX_LOOKUPS]:
        try:
            names[node_id] = client.get_node(node_id).name
        except ApiError:
            continue
    return names


def _kind_style(kind: str) -> str:
    if kind.endswith((".error", "_error")) or kind == "finding.opened":
        return "red"
    if kind == "finding.cleared":
        return "green"
    return "cyan"


def list_events(
    ctx: typer.Context,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Cluster id or name.")
    ] = None,
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Project id or name.")
    ] = None,
    node: Annotated[str | None, typer.Option("--node", help=NODE_HELP)] = None,
    kind: Annotated[str | None, typer.Option(help="Event kind, e.g. node.health.")] = None,
    since: Annotated[
        str | None, typer.Option(help="ISO 8601 time, or a span back from now: 15m, 2h, 7d.")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="Show at most N events.")] = 50,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Show events (newest first): status and health changes, findings, provider errors."""
    since_at = parse_since(since) if since is not None else None
    with config.client_for(ctx) as client:
        cluster_id = None if cluster is None else client.find_cluster(cluster, project=project).id
        node_id = None
        if node is not None:
            node_id = find_node(client, node, cluster=cluster_id, project=project).id
        page = collect(
            lambda cursor, n: client.list_events(
                project=project,
                cluster=cluster_id,
                node=node_id,
                kind=kind,
                since=since_at,
                cursor=cursor,
                limit=n,
            ),
            limit=limit,
        )
        names: dict[str, str] = {}
        if output is OutputFormat.TABLE and page.items:
            names = _node_names(client, page.items, cluster_id=cluster_id)

    def render(p: Page[Event]) -> None:
        t = table("TIME", "KIND", "NODE", "ACTOR", "MESSAGE")
        for e in p.items:
            t.add_row(
                fmt_time(e.ts),
                Text(e.kind.value, style=_kind_style(e.kind.value)),
                plain(names.get(e.node_id, e.node_id) if e.node_id else None),
                plain(e.actor),
                plain(e.message),
            )
        print_table(t, empty="no events")

    emit(output, page, render)
