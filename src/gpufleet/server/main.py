"""Entry points: ``run_server`` (production) and ``run_demo`` (embedded defaults)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import sys
from pathlib import Path

import uvicorn

from gpufleet.core.clock import utcnow
from gpufleet.core.inventory import KeyRotationResult
from gpufleet.server.app import create_app, keyring_from_settings
from gpufleet.server.context import AppContext
from gpufleet.server.db.engine import Database
from gpufleet.server.demo import console_banner, prepare_demo
from gpufleet.server.demo_slurm import SlurmDemo, start_lab, stop_lab
from gpufleet.server.routers.agent import with_reports_fast_path
from gpufleet.server.services.credentials import rotate_credentials
from gpufleet.server.settings import ServerSettings, default_data_dir

GRACEFUL_SHUTDOWN_S = 5


def configure_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


async def freeze_startup_heap(_ctx: AppContext) -> None:
    """Once the server has started, move everything alive then out of the garbage
    collector's sight (``gc.freeze``): modules, classes, the signature catalog, the
    validators, the loops and the sim world live as long as the process, yet every full
    collection walked them again. Measured on the API reads bench: a full collection took
    80-130 ms every few seconds per process, and every request in flight waited for it
    (that was the p99). After the freeze a full collection walks only what came later.

    A process-wide act, so only the entry points (one app per process) ask for it, not
    ``create_app``: a test process builds many apps. Scheduled for the loop's next turn,
    after the lifespan has started the loops and the sim."""
    asyncio.get_running_loop().call_soon(_freeze)


def _freeze() -> None:
    gc.collect()
    gc.freeze()


def run_server(settings: ServerSettings | None = None) -> None:
    """Serve until interrupted. Settings come from ``GPUFLEET_*`` when not given."""
    settings = settings or ServerSettings()
    configure_logging()
    app = create_app(settings, startup_hooks=[freeze_startup_heap])
    print(f"gpufleet: serving on http://{settings.host}:{settings.port}", flush=True)
    uvicorn.run(
        with_reports_fast_path(app),  # agent reports skip the app's layers (routers/agent.py)
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        # Agents hold command polls open for up to 20 s; a stop cancels them after this
        # instead of waiting them out (each claim is shielded; the agent polls again).
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )


def rotate_secret_key(settings: ServerSettings | None = None) -> KeyRotationResult:
    """Re-seal every stored credential under the current key, in one transaction.

    Run it after making the new key current and listing the old one as previous; then
    the old key can go. Raises ``KeyringError`` for a malformed key, ``Conflict`` when no
    key is set, ``SecretUnavailable`` naming a credential no configured key opens (and
    then nothing was changed).
    """
    settings = settings or ServerSettings()
    keyring = keyring_from_settings(settings)

    async def rotate() -> KeyRotationResult:
        db = Database(settings.resolved_database_url())
        try:
            await db.migrate()
            async with db.transaction() as session:
                return await rotate_credentials(
                    session, keyring=keyring, actor="system:rotate-secret-key", now=utcnow()
                )
        finally:
            await db.dispose()

    return asyncio.run(rotate())


def demo_settings(
    *, port: int, data_dir: Path | None, slurm_conf: Path | None = None
) -> ServerSettings:
    overrides: dict[str, object] = {
        "port": port,
        "host": "127.0.0.1",
        "sim_agents": True,
        "database_url": None,
        "announce_bootstrap_token": False,
    }
    if slurm_conf is not None:
        overrides["slurm_conf"] = slurm_conf
    # Demo-sized defaults; a GPUFLEET_* variable in the environment still wins.
    defaults: dict[str, object] = {
        # Quick boots so the whole demo fleet reports within seconds, not minutes.
        "sim_provision_delay_s": (2.0, 6.0),
        # A fault every few minutes somewhere in the 128 GPUs (the real rate is ~4,000×
        # lower), short jobs and reboots: repairs arise and finish while you watch.
        "sim_fault_rate_per_gpu_day": 2.0,
        "sim_job_minutes": (1.0, 4.0),
        "sim_reboot_delay_s": (5.0, 15.0),
        # One background fault in four is broken hardware a reboot does not fix.
        "sim_sticky_share": 0.25,
        # Check tools at 1/100 of their real durations: the demo cluster's acceptance
        # suite (DCGM level 3 is 15 min on a real node) is over in seconds.
        "sim_program_time_scale": 0.01,
    }
    for name, value in defaults.items():
        if f"GPUFLEET_{name.upper()}" not in os.environ:
            overrides[name] = value
    # The demo keeps its own directory so it never mixes with a real server's data.
    overrides["data_dir"] = data_dir if data_dir is not None else default_data_dir() / "demo"
    return ServerSettings(**overrides)  # type: ignore[arg-type]


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def run_demo(*, port: int = 8080, data_dir: Path | None = None, slurm: bool = False) -> None:
    """The demo on SQLite with a simulated 16-node cluster; prints URL and token.

    ``slurm``: also start the Slurm lab (``deploy/slurm-lab``) and manage its nodes as
    the cluster ``slurm``; the lab stops (its state kept) when the demo does.
    """
    settings = demo_settings(port=port, data_dir=data_dir)
    lab: SlurmDemo | None = None
    if slurm:
        lab_dir = Path(os.environ.get("SLURM_LAB_DIR") or Path(settings.data_dir) / "slurm-lab")
        lab = start_lab(lab_dir)
        settings = demo_settings(port=port, data_dir=data_dir, slurm_conf=lab.slurm_conf)
        print(
            f"gpufleet demo: Slurm lab up in {lab.startup_s:.1f} s: {lab.size} nodes "
            f"{lab.node_prefix}{lab.first_index:03d}... (SLURM_CONF={lab.slurm_conf})",
            file=sys.stderr,
            flush=True,
        )
    configure_logging("WARNING")

    async def announce(ctx: AppContext) -> None:
        token = await prepare_demo(ctx, slurm=lab)
        print(f"GPUFLEET_URL={ctx.public_url}", flush=True)
        print(f"GPUFLEET_TOKEN={token}", flush=True)
        print(console_banner(ctx.public_url), file=sys.stderr, flush=True)
        print(
            f"gpufleet demo: data in {settings.data_dir}; try `gpufleet nodes list`; Ctrl-C stops",
            file=sys.stderr,
            flush=True,
        )

    app = create_app(settings, startup_hooks=[announce, freeze_startup_heap])
    if lab is not None:
        # uvicorn re-raises SIGTERM once it has shut down; exit through ``finally`` then,
        # so the lab stops too, instead of dying by the signal's default action.
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        uvicorn.run(
            with_reports_fast_path(app),
            host=settings.host,
            port=settings.port,
            log_level="warning",
            access_log=False,
        )
    finally:
        if lab is not None:
            stop_lab(lab.slurm_conf.parent.parent)
