"""Client calls for the host inventory and its credentials. Mixed into ``ApiClient``.

A credential's secret is sent once (``put_credential``) and never returned by the server.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpufleet.client.calls import API, Calls, segment

# These models load on first use, inside the calls that return them: importing them
# with the client was a good part of every command's start (issue 19).
if TYPE_CHECKING:
    from gpufleet.core.inventory import (
        CredentialKind,
        Host,
        HostImportResult,
        HostSpec,
        HostState,
        StoredCredential,
    )


class InventoryCalls(Calls):
    """Mixed into ``ApiClient``."""

    # -- credentials --------------------------------------------------------------------
    def list_credentials(self, project: str) -> list[StoredCredential]:
        from gpufleet.core.inventory import StoredCredential

        data = self._call("GET", f"{API}/projects/{segment(project)}/credentials")
        return [StoredCredential.model_validate(c) for c in data]

    def get_credential(self, project: str, name: str) -> StoredCredential:
        from gpufleet.core.inventory import StoredCredential

        path = f"{API}/projects/{segment(project)}/credentials/{segment(name)}"
        return StoredCredential.model_validate(self._call("GET", path))

    def put_credential(
        self, project: str, name: str, *, kind: CredentialKind, username: str | None, secret: str
    ) -> StoredCredential:
        """Create or replace; the answer is the metadata only."""
        from gpufleet.core.inventory import StoredCredential

        path = f"{API}/projects/{segment(project)}/credentials/{segment(name)}"
        body = {"kind": kind.value, "username": username, "secret": secret}
        return StoredCredential.model_validate(self._call("PUT", path, body=body))

    def delete_credential(self, project: str, name: str) -> StoredCredential:
        from gpufleet.core.inventory import StoredCredential

        path = f"{API}/projects/{segment(project)}/credentials/{segment(name)}"
        return StoredCredential.model_validate(self._call("DELETE", path))

    # -- hosts --------------------------------------------------------------------------
    def list_hosts(self, project: str, *, cluster_id: str | None = None) -> list[Host]:
        from gpufleet.core.inventory import Host

        params = {"cluster": cluster_id} if cluster_id else None
        data = self._call("GET", f"{API}/projects/{segment(project)}/hosts", params=params)
        return [Host.model_validate(h) for h in data]

    def get_host(self, project: str, host: str) -> Host:
        from gpufleet.core.inventory import Host

        path = f"{API}/projects/{segment(project)}/hosts/{segment(host)}"
        return Host.model_validate(self._call("GET", path))

    def import_hosts(self, project: str, hosts: Sequence[HostSpec]) -> HostImportResult:
        from gpufleet.core.inventory import HostImportResult

        body = {"hosts": [h.model_dump(mode="json", exclude_none=True) for h in hosts]}
        path = f"{API}/projects/{segment(project)}/hosts/import"
        return HostImportResult.model_validate(self._call("POST", path, body=body))

    def bind_host(self, project: str, host: str, *, node_id: str) -> Host:
        from gpufleet.core.inventory import Host

        path = f"{API}/projects/{segment(project)}/hosts/{segment(host)}/bind"
        return Host.model_validate(self._call("POST", path, body={"node_id": node_id}))

    def set_host_state(self, project: str, host: str, *, state: HostState, reason: str) -> Host:
        from gpufleet.core.inventory import Host

        path = f"{API}/projects/{segment(project)}/hosts/{segment(host)}/state"
        body = {"state": state.value, "reason": reason}
        return Host.model_validate(self._call("POST", path, body=body))
