"""``gpufleet stacks``: the platform's software stacks (OS image, driver, CUDA, NCCL,
DCGM, Slurm, agent); new clusters take the latest unless ``clusters create --stack``."""

from __future__ import annotations

from typing import Annotated

import typer

from gpufleet.cli import config
from gpufleet.cli.output import (
    OutputFormat,
    OutputOpt,
    emit,
    fields,
    fmt_time,
    plain,
    print_json,
    print_table,
    table,
)
from gpufleet.core.stacks import COMPONENTS, Stack

app = typer.Typer(
    no_args_is_help=True,
    help="Software stacks: what nodes run (driver, CUDA, Slurm...); the latest.",
)


@app.command("list")
def list_stacks(ctx: typer.Context, output: OutputOpt = OutputFormat.TABLE) -> None:
    """Every stack, newest first; * marks the latest."""
    with config.client_for(ctx) as client:
        stacks = client.list_stacks()
    if output is OutputFormat.JSON:
        print_json(stacks)
        return
    t = table("", "NAME", "DRIVER", "CUDA", "SLURM", "OS IMAGE", "CREATED")
    for s in stacks:
        t.add_row(
            "*" if s.latest else "",
            plain(s.name),
            plain(s.driver),
            plain(s.cuda),
            plain(s.slurm),
            plain(s.os_image),
            fmt_time(s.created_at),
        )
    print_table(t, empty="no stacks")


@app.command("show")
def show(ctx: typer.Context, name: str, output: OutputOpt = OutputFormat.TABLE) -> None:
    """One stack: everything it pins."""
    with config.client_for(ctx) as client:
        stack = client.get_stack(name)
    emit(output, stack, _render)


@app.command("create")
def create(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="e.g. gpu-2026.12 (a stack never changes).")],
    os_image: Annotated[str | None, typer.Option(help="The OS image nodes boot.")] = None,
    driver: Annotated[str | None, typer.Option(help="NVIDIA driver, e.g. 580.95.05.")] = None,
    cuda: Annotated[str | None, typer.Option(help="CUDA toolkit, e.g. 12.9.")] = None,
    nccl: Annotated[str | None, typer.Option(help="NCCL, e.g. 2.27.3.")] = None,
    dcgm: Annotated[str | None, typer.Option(help="DCGM, e.g. 4.2.3.")] = None,
    slurm: Annotated[str | None, typer.Option(help="Slurm, e.g. 25.05.3.")] = None,
    agent: Annotated[str | None, typer.Option(help="gpufleet's agent version.")] = None,
    notes: Annotated[str, typer.Option(help="What changed, for the people who migrate.")] = "",
    latest: Annotated[bool, typer.Option(help="New clusters take it from now on.")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Define a stack (the platform owner)."""
    pinned = {
        "os_image": os_image, "driver": driver, "cuda": cuda, "nccl": nccl, "dcgm": dcgm,
        "slurm": slurm, "agent": agent,
    }  # fmt: skip
    spec = {k: v for k, v in pinned.items() if v is not None}
    with config.client_for(ctx) as client:
        stack = client.create_stack(name, spec=spec, notes=notes, latest=latest)
    emit(output, stack, _render)


@app.command("latest")
def latest(ctx: typer.Context, name: str, output: OutputOpt = OutputFormat.TABLE) -> None:
    """Make ``name`` the stack new clusters take (existing ones keep theirs)."""
    with config.client_for(ctx) as client:
        stack = client.make_latest_stack(name)
    emit(output, stack, _render)


def _render(s: Stack) -> None:
    rows: list[tuple[str, str]] = [("name", s.name), ("latest", "yes" if s.latest else "no")]
    rows += [(c.replace("_", " "), getattr(s, c) or "-") for c in COMPONENTS]
    rows += [("notes", s.notes or "-"), ("by", s.created_by), ("created", fmt_time(s.created_at))]
    print_table(fields(rows))
