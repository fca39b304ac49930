"""Request bodies of the provider routes."""

from __future__ import annotations

from gpufleet.core.enums import ProviderKind
from gpufleet.server.schemas.common import Request


class CheckProvidersRequest(Request):
    """Whose reach check runs: the cluster's own provider (None), or another kind, to
    check a cluster's hosts before switching it (bare-metal kinds cannot be chosen for a
    cluster yet: docs/providers.md)."""

    provider: ProviderKind | None = None
