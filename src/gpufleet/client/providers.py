"""Client calls for a cluster's providers. Mixed into ``ApiClient``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpufleet.client.calls import API, Calls, segment
from gpufleet.core.enums import ProviderKind

# These models load on first use, inside the calls that return them: importing them
# with the client was a good part of every command's start (issue 19).
if TYPE_CHECKING:
    from gpufleet.core.providers import ClusterProviderConfig, ProvidersCheckResult


# A reach check waits for the slowest host: a hung BMC takes its driver's whole bound
# (Redfish: three requests of 15 s; SSH: three connection attempts of 10 s), and hosts
# beyond the server's 16 at once wait their turn. The server bounds every host; this only
# keeps the client from giving up first.
CHECK_TIMEOUT_S = 600.0


class ProviderCalls(Calls):
    """Mixed into ``ApiClient``."""

    def check_providers(
        self, cluster_id: str, *, provider: ProviderKind | None = None
    ) -> ProvidersCheckResult:
        """Reach every inventory host of the cluster through its provider (or
        ``provider``), changing nothing. An unreachable host is a row, not an error."""
        from gpufleet.core.providers import ProvidersCheckResult

        path = f"{API}/clusters/{segment(cluster_id)}/providers/check"
        body = {"provider": provider.value if provider is not None else None}
        data = self._call("POST", path, body=body, timeout_s=CHECK_TIMEOUT_S)
        return ProvidersCheckResult.model_validate(data)

    def get_provider_config(self, cluster_id: str) -> ClusterProviderConfig:
        """The cluster's provider and its configuration (a credential by name only)."""
        from gpufleet.core.providers import ClusterProviderConfig

        path = f"{API}/clusters/{segment(cluster_id)}/provider-config"
        return ClusterProviderConfig.model_validate(self._call("GET", path))

    def set_provider_config(
        self, cluster_id: str, config: Mapping[str, object], *, reason: str = ""
    ) -> ClusterProviderConfig:
        """Replace the cluster's provider configuration (admins). For ``aws``: region,
        credential (a stored aws_key's name), endpoint_url and the placement fields."""
        from gpufleet.core.providers import ClusterProviderConfig

        path = f"{API}/clusters/{segment(cluster_id)}/provider-config"
        data = self._call("PUT", path, body={"config": dict(config), "reason": reason})
        return ClusterProviderConfig.model_validate(data)
