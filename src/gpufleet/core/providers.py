"""What ``gpufleet providers check`` returns, as the API, the client and the CLI see it.

A reach check reaches each host's management path (BMC, SSH) through the cluster's
provider and reports what it saw, changing nothing. Nothing here ever holds a secret: a
row's ``detail`` is the driver's own scrubbed text.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from gpufleet.core.enums import ProviderKind

# The provider's view of a machine's power (providers.base.PowerState's values); SSH
# cannot see power, so its hosts are "on" when they answer, else "unknown".
Power = Literal["on", "off", "unknown"]


class _Domain(BaseModel):
    model_config = ConfigDict(frozen=True)


class HostReach(_Domain):
    """One host of the inventory as its provider's reach check saw it."""

    hostname: str
    host_id: str
    reachable: bool
    power: Power
    detail: str  # what was seen, or what failed (never a secret)


class ProvidersCheckResult(_Domain):
    cluster_id: str
    provider: ProviderKind  # whose ``check_reach`` ran: the cluster's, or the one asked for
    hosts: list[HostReach]  # by hostname

    @property
    def all_reachable(self) -> bool:
        return all(h.reachable for h in self.hosts)
