"""``gpufleet slurm epilog|healthcheck``: the Slurm node hooks (see
``gpufleet.agent.slurm_hooks``). slurm.conf: ``Epilog=`` / ``HealthCheckProgram=``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Slurm node hooks: run by slurmd on each node, as root.")

StateDirOpt = Annotated[
    Path | None,
    typer.Option(help="The agent's state dir (default $GPUFLEET_AGENT_STATE_DIR or "
                 "/var/lib/gpufleet-agent)."),
]  # fmt: skip


@app.command("epilog")
def epilog(
    state_dir: StateDirOpt = None,
    grace_s: Annotated[
        float, typer.Option(min=0, max=60, help="Seconds between SIGTERM and SIGKILL.")
    ] = 2.0,
) -> None:
    """Kill what the finished job left behind (cgroup, environment, process tree),
    report it as an event; always exit 0, so a hiccup never drains the node."""
    from gpufleet.agent.slurm_hooks import run

    raise typer.Exit(run("epilog", state_dir=state_dir, grace_s=grace_s))


@app.command("healthcheck")
def healthcheck(state_dir: StateDirOpt = None) -> None:
    """Drain this node (reason 'gpufleet: healthcheck <signature>') while the agent holds
    a fatal or critical finding; resume only that drain once it cleared."""
    from gpufleet.agent.slurm_hooks import run

    raise typer.Exit(run("healthcheck", state_dir=state_dir))
