"""Drivers by kind. The server builds one instance of each at start-up, except the
drivers that depend on the cluster: providers like ``aws`` (a region, an account and a
placement per cluster), which ``provider_for`` builds from the cluster's configuration,
and schedulers like ``kubernetes`` (an API server and a kubeconfig per cluster), which
``services.schedulers.scheduler_for`` builds from the cluster's scheduler configuration."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from typing import Protocol

from gpufleet.core.enums import ProviderKind, RepairAction
from gpufleet.core.errors import InvalidInput
from gpufleet.core.models import Cluster
from gpufleet.providers.base import (
    HostDirectory,
    Provider,
    SupportsGpuReset,
    SupportsReboot,
    SupportsReprovision,
)
from gpufleet.providers.ipmi.config import IpmiConfig
from gpufleet.providers.ipmi.driver import IpmiProvider
from gpufleet.providers.redfish.config import RedfishConfig
from gpufleet.providers.redfish.driver import RedfishProvider
from gpufleet.providers.ssh.config import SshConfig
from gpufleet.providers.ssh.driver import SshProvider
from gpufleet.schedulers.base import Scheduler
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.server.db.tables import ClusterRow
from gpufleet.server.settings import ServerSettings


class ClusterProviders(Protocol):
    """Builds the driver of one cluster from its row (services/aws_providers.py)."""

    def for_cluster(self, cluster: ClusterRow) -> Provider: ...


class ClusterSchedulers(Protocol):
    """Builds the scheduler driver of one cluster from its row or its domain object
    (services/kube_schedulers.py), and closes those it built when the server stops."""

    def for_cluster(self, cluster: Cluster | ClusterRow) -> Scheduler: ...

    async def aclose(self) -> None: ...


@dataclass
class DriverRegistry:
    providers: dict[str, Provider] = field(default_factory=dict)
    schedulers: dict[str, Scheduler] = field(default_factory=dict)
    # Provider kinds whose driver is per cluster, by kind ("aws").
    per_cluster: dict[str, ClusterProviders] = field(default_factory=dict)
    # Scheduler kinds whose driver is per cluster, by kind ("kubernetes").
    per_cluster_schedulers: dict[str, ClusterSchedulers] = field(default_factory=dict)

    def provider_for(self, cluster: ClusterRow) -> Provider:
        """The driver that acts on ``cluster``'s machines. Building it does no I/O: a
        per-cluster driver reads its configuration and credential on each call, and a
        call fails with a ``DriverError`` naming what to fix when they are missing."""
        per_cluster = self.per_cluster.get(cluster.provider)
        if per_cluster is not None:
            return per_cluster.for_cluster(cluster)
        return self.provider(cluster.provider)

    def unsupported_actions(self, cluster: ClusterRow) -> frozenset[RepairAction]:
        """The repair actions ``cluster``'s provider cannot take (SSH cannot reinstall, a
        BMC cannot reset one GPU): never recommended, refused when asked by hand. Every
        provider can fail over and remove. Empty for a provider this server lacks (the
        acting step says so)."""
        try:
            provider = self.provider_for(cluster)
        except InvalidInput:
            return frozenset()
        able = {
            RepairAction.RESET_GPU: isinstance(provider, SupportsGpuReset),
            RepairAction.REBOOT: isinstance(provider, SupportsReboot),
            RepairAction.REPROVISION: isinstance(provider, SupportsReprovision),
        }
        return frozenset(action for action, can in able.items() if not can)

    def check_provider(self, kind: str) -> None:
        """Raise ``InvalidInput`` unless this server can drive a cluster on ``kind``."""
        if kind not in self.per_cluster:
            self.provider(kind)

    def provider(self, kind: str) -> Provider:
        try:
            return self.providers[kind]
        except KeyError:
            known = ", ".join(sorted({*self.providers, *self.per_cluster})) or "none"
            raise InvalidInput(
                f"provider {kind!r} is not configured on this server (configured: {known})",
                field="provider",
            ) from None

    def check_scheduler(self, kind: str) -> None:
        """Raise ``InvalidInput`` unless this server can drive a cluster's ``kind``
        scheduler."""
        if kind not in self.per_cluster_schedulers:
            self.scheduler(kind)

    async def aclose(self) -> None:
        """Close the per-cluster drivers built so far (their connection pools)."""
        for schedulers in self.per_cluster_schedulers.values():
            await schedulers.aclose()

    def scheduler(self, kind: str) -> Scheduler:
        try:
            return self.schedulers[kind]
        except KeyError:
            known = ", ".join(sorted({*self.schedulers, *self.per_cluster_schedulers})) or "none"
            raise InvalidInput(
                f"scheduler {kind!r} is not configured on this server (configured: {known})",
                field="scheduler",
            ) from None


def slurm_scheduler(settings: ServerSettings) -> SlurmScheduler | None:
    """The Slurm driver: for ``slurm_conf`` if set, else for the host's Slurm if its
    commands are installed, reading through ``slurm_rest_url`` when that is set (then it
    is built even without the commands: reads work, writes fail with a DriverError);
    None when there is no Slurm to talk to.

    Raises:
        ValueError: ``slurm_rest_url`` is not http(s):// or unix:///<absolute path>.
    """
    env = {"SLURM_CONF": str(settings.slurm_conf)} if settings.slurm_conf is not None else {}
    if not env and settings.slurm_rest_url is None and shutil.which("sinfo") is None:
        return None
    token_file = settings.slurm_rest_token_file
    return SlurmScheduler(
        SlurmConfig(
            env=env,
            rest_url=settings.slurm_rest_url,
            rest_token_file=str(token_file) if token_file is not None else None,
            rest_user=settings.slurm_rest_user,
        )
    )


def bare_metal_providers(
    settings: ServerSettings, *, directory: HostDirectory
) -> dict[str, Provider]:
    """The ipmi, redfish and ssh drivers over one host directory (the inventory), each
    with its config's defaults and the few settings an operator must choose.

    Building them runs nothing and loads no third-party client: ipmitool is run, and
    sushy and asyncssh are imported, on a driver's first call. AWS is not built here: its
    driver is per cluster (``DriverRegistry.per_cluster``, services/aws_providers.py).
    """
    return {
        ProviderKind.IPMI.value: IpmiProvider(
            IpmiConfig(cipher_suite=settings.ipmi_cipher_suite), directory
        ),
        ProviderKind.REDFISH.value: RedfishProvider(
            RedfishConfig(verify_tls=settings.redfish_verify_tls), directory
        ),
        ProviderKind.SSH.value: SshProvider(SshConfig(), directory),
    }
