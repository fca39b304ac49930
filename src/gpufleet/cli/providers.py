"""``gpufleet providers check CLUSTER``: reach every inventory host of a cluster."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.errors import EXIT_FAILURE
from gpufleet.cli.output import OutputFormat, OutputOpt, note, plain, print_json, print_table, table
from gpufleet.core.enums import ProviderKind
from gpufleet.core.providers import ProvidersCheckResult

app = typer.Typer(help="The drivers that reach a cluster's machines.", no_args_is_help=True)

POWER_STYLES = {"on": "green", "off": "yellow", "unknown": "dim"}


def _render(result: ProvidersCheckResult) -> None:
    t = table("HOSTNAME", "HOST ID", "REACHABLE", "POWER", "DETAIL")
    for h in result.hosts:
        t.add_row(
            plain(h.hostname),
            plain(h.host_id),
            Text("yes", style="green") if h.reachable else Text("no", style="red"),
            Text(h.power, style=POWER_STYLES.get(h.power, "")),
            plain(h.detail),
        )
    print_table(t)
    down = sum(1 for h in result.hosts if not h.reachable)
    note(
        f"{result.provider.value}: {len(result.hosts) - down} of {len(result.hosts)} host(s) "
        "reachable" + ("" if result.hosts else " (the cluster has no hosts in the inventory)")
    )


@app.command("check")
def check(
    ctx: typer.Context,
    cluster: Annotated[str, typer.Argument(help="Cluster id or name.")],
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Project of the cluster (by name).")
    ] = None,
    provider: Annotated[
        ProviderKind | None,
        typer.Option(
            case_sensitive=False,
            help="Check as this provider (ipmi, redfish, ssh) instead of the cluster's own.",
        ),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Reach every host of the cluster in the inventory (its BMC or SSH) and print its
    power state, or what failed. Changes nothing.

    Exit code 0 when every host answered, 1 when any did not (or the server failed),
    2 for bad input (an unknown cluster, a provider with no reach check).
    """
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(cluster, project=project).id
        result = client.check_providers(cluster_id, provider=provider)
    if output is OutputFormat.JSON:
        print_json(result)
    else:
        _render(result)
    if not result.all_reachable:
        raise typer.Exit(EXIT_FAILURE)
