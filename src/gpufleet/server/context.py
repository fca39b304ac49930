"""What the app holds while it runs: settings, store, drivers, ingest, clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.core.clock import Clock
from gpufleet.server.db.engine import Database
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.ingest import ReportIngestor
from gpufleet.server.settings import ServerSettings


@dataclass
class AppContext:
    settings: ServerSettings
    db: Database
    drivers: DriverRegistry
    ingest: ReportIngestor
    clock: Clock
    public_url: str = ""
    ready: bool = False
    bootstrap_token: str | None = field(default=None, repr=False)
