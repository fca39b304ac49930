"""What the app holds while it runs: settings, store, drivers, ingest, clock."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.core.clock import Clock
from gpufleet.core.repair.models import PolicyConfig
from gpufleet.server.db.engine import Database
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.ingest import ReportIngestor
from gpufleet.server.limits import RateLimiter
from gpufleet.server.services.keyring import Keyring
from gpufleet.server.services.oidc import OidcRelyingParty
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
    # The port the Cluster Autoscaler externalgrpc service listens on (None: not served).
    externalgrpc_port: int | None = None
    bootstrap_token: str | None = field(default=None, repr=False)
    # Seals and opens stored credentials; empty when no key is configured.
    keyring: Keyring = field(default_factory=Keyring, repr=False)
    # The repair policy of a project that never set one.
    default_repair_policy: PolicyConfig = field(default_factory=PolicyConfig)
    # Login (routers/auth.py builds both on first use): the OIDC relying party with its
    # discovery/JWKS caches, and the per-client-IP limiter of the login endpoints.
    oidc: OidcRelyingParty | None = None
    login_limiter: RateLimiter | None = None
