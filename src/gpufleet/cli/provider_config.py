"""``gpufleet clusters provider-config show|set``: a cluster's provider configuration
(for aws: region, endpoint, the credential's name, the placement). ``set`` reads a YAML
or JSON mapping from a file; a file that is not one fails here (exit 2) before the server
is asked, and the server's 422 names any field it refuses (exit 2 too)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.cli.output import OutputFormat, OutputOpt, emit, fields, print_table
from gpufleet.core.providers import ClusterProviderConfig

app = typer.Typer(
    help="A cluster's provider configuration (aws: region, credential, placement).",
    no_args_is_help=True,
)

ClusterRef = Annotated[str, typer.Argument(help="Cluster id, or its name.")]
ProjectOpt = Annotated[
    str | None, typer.Option("--project", "-p", help="Project id or name to look in.")
]


def read_config_file(path: Path) -> dict[str, Any]:
    """The mapping in a YAML (or JSON) file; ``CliError`` (exit 2) naming what is wrong."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        # pyyaml comes with the [server] extra and ships no type stubs.
        import yaml  # type: ignore[import-untyped]
    except ImportError as exc:
        raise CliError(f"reading {path} needs pyyaml (pip install pyyaml): {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}  # an empty file: an empty configuration (sim, ipmi, redfish, ssh)
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise CliError(
            f"{path}: expected a mapping of fields, e.g. region: us-east-1 / credential: "
            "aws-prod / auto_scaling_group: gpu-h100; nothing was sent"
        )
    return data


def _render(c: ClusterProviderConfig) -> None:
    rows: list[tuple[str, str]] = [
        ("cluster", f"{c.cluster_name} ({c.cluster_id})"),
        ("provider", c.provider.value),
    ]
    values = c.config.model_dump(mode="json")
    for key, value in values.items():
        if isinstance(value, dict):
            shown = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
        else:
            shown = "-" if value is None else str(value)
        rows.append((key, shown))
    if not values:
        rows.append(("configuration", f"none: {c.provider.value} takes nothing per cluster"))
    print_table(fields(rows))


@app.command("show")
def show_provider_config(
    ctx: typer.Context,
    ref: ClusterRef,
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Show the cluster's provider and its configuration (a credential by name only)."""
    with config.client_for(ctx) as client:
        cluster = client.find_cluster(ref, project=project)
        shown = client.get_provider_config(cluster.id)
    emit(output, shown, _render)


@app.command("set")
def set_provider_config(
    ctx: typer.Context,
    ref: ClusterRef,
    file: Annotated[
        Path,
        typer.Option(
            "--file",
            "-f",
            help="YAML or JSON mapping: the whole configuration.",
            dir_okay=False,
        ),
    ],
    project: ProjectOpt = None,
    reason: Annotated[str, typer.Option(help="Why; kept in the audit log.")] = "",
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Replace the cluster's provider configuration (project admins). Fields left out
    take their defaults; the next driver call uses it."""
    values = read_config_file(file)
    with config.client_for(ctx) as client:
        cluster = client.find_cluster(ref, project=project)
        shown = client.set_provider_config(cluster.id, values, reason=reason)
    emit(output, shown, _render)
