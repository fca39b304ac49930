"""``AwsProviders``: the AWS driver of each ``aws`` cluster, built from the cluster's
provider configuration and its project's ``aws_key`` credential.

A cluster's lookup (``DriverRegistry.provider_for``) is synchronous and costs nothing: it
hands out a ``ClusterAwsProvider`` that, on each call, reads the credential's row (one
small query) and reuses the ``AwsProvider`` it built before unless the configuration or
the credential changed (replaced, re-sealed under another key). Only then is the secret
opened (``host_directory.aws_credential``) and a new driver built: boto3 is still
imported on the driver's first AWS call, never at start-up.

Every failure to build is a ``DriverError`` naming the cluster and what to fix (no
configuration, a credential missing or of the wrong kind, one that does not open), so a
provisioning pass or a repair step fails the way any driver call does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from gpufleet.core.enums import ProviderKind
from gpufleet.core.errors import DriverError, GpufleetError
from gpufleet.core.providers import AwsProviderConfig, parse_provider_config
from gpufleet.providers.aws.config import AwsConfig, AwsPlacement
from gpufleet.providers.aws.driver import AwsProvider
from gpufleet.providers.base import Instance, PowerState, ProvisionRequest, ReachCheck
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow
from gpufleet.server.services.credentials import find_credential_row
from gpufleet.server.services.host_directory import aws_credential
from gpufleet.server.services.keyring import Keyring

_CacheKey = tuple[str, str, str, dt.datetime | None]


@dataclasses.dataclass(frozen=True, slots=True)
class _Built:
    key: _CacheKey
    provider: AwsProvider


class AwsProviders:
    """One ``AwsProvider`` per aws cluster, rebuilt when its configuration or credential
    changes. ``settings`` are ``AwsConfig``'s bounds and polling (tests shorten them)."""

    def __init__(
        self, *, db: Database, keyring: Keyring, settings: dict[str, Any] | None = None
    ) -> None:
        self._db = db
        self._keyring = keyring
        self._settings = dict(settings or {})
        self._built: dict[str, _Built] = {}  # by cluster id: at most one per cluster

    def for_cluster(self, cluster: ClusterRow) -> ClusterAwsProvider:
        return ClusterAwsProvider(
            self,
            cluster_id=cluster.id,
            cluster_name=cluster.name,
            project_id=cluster.project_id,
            raw=dict(cluster.provider_config or {}),
        )

    async def build(
        self, *, cluster_id: str, cluster_name: str, project_id: str, raw: dict[str, Any]
    ) -> AwsProvider:
        """The cluster's driver (raises ``DriverError`` naming what to fix)."""
        where = f"aws: cluster {cluster_name}"
        try:
            config = parse_provider_config(ProviderKind.AWS, raw)
        except GpufleetError as exc:
            raise DriverError(
                f"{where}: no usable provider configuration ({exc.message}); set it with "
                "`gpufleet clusters provider-config set`"
            ) from None
        assert isinstance(config, AwsProviderConfig)
        async with self._db.session() as session:
            row = await find_credential_row(session, project_id=project_id, ref=config.credential)
            if row is None:
                raise DriverError(
                    f"{where}: credential {config.credential!r} is not in its project any "
                    "more; store it again or name another in the provider configuration"
                )
            key: _CacheKey = (
                json.dumps(config.model_dump(mode="json"), sort_keys=True),
                row.id,
                row.key_id,
                row.rotated_at or row.created_at,
            )
            built = self._built.get(cluster_id)
            if built is not None and built.key == key:
                return built.provider
            try:
                credential = aws_credential(self._keyring, row)
            except GpufleetError as exc:  # names the credential and key id, no secret
                raise DriverError(f"{where}: {exc.message}") from None
        try:
            placement = AwsPlacement(
                auto_scaling_group=config.auto_scaling_group,
                launch_template_id=config.launch_template_id,
                launch_template_name=config.launch_template_name,
                launch_template_version=config.launch_template_version,
                instance_type=config.instance_type,
                subnet_id=config.subnet_id,
                tags=dict(config.tags),
            )
            provider = AwsProvider(
                AwsConfig(
                    region=config.region,
                    endpoint_url=config.endpoint_url,
                    clusters={cluster_id: placement},
                    **self._settings,
                ),
                credential,
            )
        except ValueError as exc:
            raise DriverError(f"{where}: {exc}") from None
        self._built[cluster_id] = _Built(key=key, provider=provider)
        return provider


class ClusterAwsProvider:
    """The driver of one aws cluster, resolved on each call (``AwsProviders.build``).
    Implements what ``AwsProvider`` does: Provider, SupportsPower, SupportsReboot,
    SupportsReprovision, SupportsReplace and SupportsReachCheck."""

    kind = "aws"

    def __init__(
        self,
        providers: AwsProviders,
        *,
        cluster_id: str,
        cluster_name: str,
        project_id: str,
        raw: dict[str, Any],
    ) -> None:
        self._providers = providers
        self._cluster_id = cluster_id
        self._cluster_name = cluster_name
        self._project_id = project_id
        self._raw = raw

    async def _driver(self) -> AwsProvider:
        return await self._providers.build(
            cluster_id=self._cluster_id,
            cluster_name=self._cluster_name,
            project_id=self._project_id,
            raw=self._raw,
        )

    async def provision(self, request: ProvisionRequest) -> Instance:
        return await (await self._driver()).provision(request)

    async def get_instance(self, instance_id: str) -> Instance | None:
        return await (await self._driver()).get_instance(instance_id)

    async def list_instances(self, cluster_id: str) -> list[Instance]:
        return await (await self._driver()).list_instances(cluster_id)

    async def terminate(self, instance_id: str) -> None:
        await (await self._driver()).terminate(instance_id)

    async def power_state(self, instance_id: str) -> PowerState:
        return await (await self._driver()).power_state(instance_id)

    async def power_cycle(self, instance_id: str) -> None:
        await (await self._driver()).power_cycle(instance_id)

    async def reboot(self, instance_id: str) -> None:
        await (await self._driver()).reboot(instance_id)

    async def reprovision(self, instance_id: str, *, user_data: dict[str, str]) -> Instance | None:
        return await (await self._driver()).reprovision(instance_id, user_data=user_data)

    async def replace(self, instance_id: str, *, request: ProvisionRequest) -> Instance:
        return await (await self._driver()).replace(instance_id, request=request)

    async def check_reach(self, instance_id: str) -> ReachCheck:
        return await (await self._driver()).check_reach(instance_id)
