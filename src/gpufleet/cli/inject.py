"""``gpufleet inject``: make a node fail on purpose, to see detection work end to end.

On a sim node it goes through the API (the simulated agent reports the finding at once).
On a real node, ``--log PATH`` writes the kernel-log line the fault would print to the
log file the node's agent follows: no server involved, the agent does the rest.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import config
from gpufleet.cli.errors import CliError
from gpufleet.cli.node_ref import NODE_HELP, find_node
from gpufleet.cli.output import (
    SEVERITY_STYLES,
    OutputFormat,
    OutputOpt,
    fields,
    note,
    print_json,
    print_table,
    styled,
)
from gpufleet.core.faults import Fault
from gpufleet.core.signatures.catalog import get_signature
from gpufleet.core.signatures.models import Signature
from gpufleet.sim.faults import kernel_log_line


def _signature(signature_id: str) -> Signature:
    signature = get_signature(signature_id)
    if signature is None:
        raise typer.BadParameter(
            f"{signature_id!r} is not in the signature catalog "
            "(e.g. xid-79, xid-48, thermal-slowdown, ib-link-down)",
            param_hint="--signature",
        )
    return signature


def _uptime_s() -> float:
    try:
        return float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.monotonic()


def _write_log(path: Path, signature: Signature, gpu: int | None) -> str:
    line = kernel_log_line(signature, gpu_index=gpu, uptime_s=_uptime_s())
    try:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
    except OSError as exc:
        raise CliError(f"cannot append to {path}: {exc.strerror or exc}") from exc
    return line


def _render(fault: Fault) -> None:
    where = "whole node" if fault.gpu_index is None else f"GPU {fault.gpu_index}"
    rows: list[tuple[str, Text | str]] = [
        ("node", fault.node_name),
        ("signature", fault.signature),
        ("title", fault.title),
        ("severity", styled(fault.severity.value, SEVERITY_STYLES)),
        ("where", where + (f" ({fault.gpu_uuid})" if fault.gpu_uuid else "")),
        ("count", str(fault.count)),
        ("clears", "by itself at " + fault.clears_at.isoformat() if fault.clears_at else
         "only on replace (sticky: it returns after reboots)" if fault.sticky else
         "on reboot, reprovision or replace"),
    ]  # fmt: skip
    print_table(fields(rows))


def inject(
    ctx: typer.Context,
    signature: Annotated[
        str, typer.Option("--signature", "-s", help="Catalog signature id, e.g. xid-79.")
    ],
    node: Annotated[str | None, typer.Option("--node", "-n", help=NODE_HELP)] = None,
    gpu: Annotated[
        int | None, typer.Option("--gpu", min=0, max=63, help="GPU index (default: any).")
    ] = None,
    cluster: Annotated[
        str | None, typer.Option("--cluster", "-c", help="Cluster id or name.")
    ] = None,
    project: Annotated[
        str | None, typer.Option("--project", "-p", help="Project to find the cluster in.")
    ] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Clear the fault instead.")] = False,
    sticky: Annotated[
        bool,
        typer.Option(
            "--sticky",
            help="Broken hardware: the fault returns after every reboot and reinstall; "
            "only a failover to a new host gets rid of it.",
        ),
    ] = False,
    log: Annotated[
        Path | None,
        typer.Option(
            "--log",
            help="Real node: append the fault's kernel-log line to this file (the log the "
            "agent follows) instead of calling the server.",
        ),
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Inject a fault into a sim node (or, with --log, into a real node's followed log)."""
    sig = _signature(signature)
    if log is not None:
        if clear:
            raise CliError("--clear does not apply to --log: a log line cannot be taken back")
        line = _write_log(log, sig, gpu)
        if output is OutputFormat.JSON:
            typer.echo(json.dumps({"path": str(log), "line": line}))
        else:
            note(f"appended to {log}:\n{line}")
        return
    if node is None:
        raise CliError("give --node (its name or id), or --log PATH")
    with config.client_for(ctx) as client:
        target = find_node(client, node, cluster=cluster, project=project)
        if clear:
            cleared = client.clear_fault(target.id, sig.id, gpu_index=gpu)
            if output is OutputFormat.JSON:
                print_json(cleared)
            elif not cleared:
                note(f"no open {sig.id} fault on {target.name}")
            else:
                note(f"cleared {len(cleared)} {sig.id} fault(s) on {target.name}")
            return
        fault = client.inject_fault(target.id, signature=sig.id, gpu_index=gpu, sticky=sticky)
    if output is OutputFormat.JSON:
        print_json(fault)
    else:
        _render(fault)
        note(f"watch it: gpufleet findings --node {target.id}")
