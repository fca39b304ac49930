"""``gpufleet volumes``: a project's storage volumes and the clusters they attach to."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli import config
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fmt_time,
    note,
    plain,
    print_json,
    print_table,
    table,
)
from gpufleet.client.api import ApiClient
from gpufleet.core.access import Volume

app = typer.Typer(help="Storage volumes of a project.", no_args_is_help=True)

ProjectOpt = Annotated[str, typer.Option("--project", "-p", help="Project id or name.")]
VolumeArg = Annotated[str, typer.Argument(help="Volume id or name.")]
ClusterArg = Annotated[str, typer.Argument(help="Cluster id or name (in the same project).")]


def _render(volumes: list[Volume]) -> None:
    t = table("NAME", "ID", "SIZE GB", "MOUNT PATH", "CLUSTERS", "UPDATED", right=("SIZE GB",))
    for v in volumes:
        t.add_row(
            plain(v.name),
            plain(v.id),
            plain(v.size_gb),
            plain(v.mount_path),
            plain(", ".join(v.cluster_ids) or "-"),
            fmt_time(v.updated_at),
        )
    print_table(t, empty="no volumes")


def _render_one(volume: Volume) -> None:
    _render([volume])


def _cluster_id(client: ApiClient, ref: str, project: str) -> str:
    return client.find_cluster(ref, project=project).id


@app.command("list")
def list_volumes(
    ctx: typer.Context, project: ProjectOpt, output: OutputOpt = OutputFormat.TABLE
) -> None:
    with config.client_for(ctx) as client:
        volumes = client.list_volumes(project)
    if output is OutputFormat.JSON:
        print_json(volumes)
    else:
        _render(volumes)


@app.command("create")
def create_volume(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Name, unique in the project.")],
    project: ProjectOpt,
    size_gb: Annotated[int, typer.Option("--size-gb", min=1, help="Size in GB.")],
    mount_path: Annotated[str, typer.Option(help="Absolute path it mounts at on nodes.")],
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create a volume (project admins)."""
    with config.client_for(ctx) as client:
        volume = client.create_volume(project, name=name, size_gb=size_gb, mount_path=mount_path)
    emit(output, volume, _render_one)


@app.command("resize")
def resize_volume(
    ctx: typer.Context,
    volume: VolumeArg,
    project: ProjectOpt,
    size_gb: Annotated[int, typer.Option("--size-gb", min=1, help="New size; volumes grow.")],
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    with config.client_for(ctx) as client:
        updated = client.update_volume(project, volume, size_gb=size_gb)
    emit(output, updated, _render_one)


@app.command("delete")
def delete_volume(
    ctx: typer.Context,
    volume: VolumeArg,
    project: ProjectOpt,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Delete a volume attached nowhere (detach it first)."""
    with config.client_for(ctx) as client:
        deleted = client.delete_volume(project, volume)
    if output is OutputFormat.JSON:
        print_json(deleted)
    else:
        note(f"deleted volume {deleted.name}")


@app.command("attach")
def attach_volume(
    ctx: typer.Context,
    volume: VolumeArg,
    cluster: ClusterArg,
    project: ProjectOpt,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    with config.client_for(ctx) as client:
        attached = client.attach_volume(
            project, volume, cluster_id=_cluster_id(client, cluster, project)
        )
    emit(output, attached, _render_one)


@app.command("detach")
def detach_volume(
    ctx: typer.Context,
    volume: VolumeArg,
    cluster: ClusterArg,
    project: ProjectOpt,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    with config.client_for(ctx) as client:
        detached = client.detach_volume(
            project, volume, cluster_id=_cluster_id(client, cluster, project)
        )
    emit(output, detached, _render_one)
