"""``KubeSchedulers``: the Kubernetes driver of each ``kubernetes`` cluster, built from the
cluster's scheduler configuration (``core.models.SchedulerConfig``) and its kubeconfig,
stored sealed as a credential of kind ``kubeconfig`` (or the server's in-cluster service
account).

A cluster's lookup (``services.schedulers.scheduler_for``) is synchronous and costs
nothing: it hands out a ``ClusterKubeScheduler`` that, on each call, reads the
credential's row (one small query) and reuses the ``KubernetesScheduler`` it built before
unless the configuration or the credential changed (replaced, re-sealed under another
key by ``rotate-secret-key``). Only then is the kubeconfig opened and a new driver built;
the old one's connection pool is closed. kubernetes_asyncio is imported on the driver's
first call, never at start-up.

Every failure to build is a ``DriverError`` naming the cluster and what to fix (no
configuration, a credential gone or of the wrong kind, one that does not open, a
kubeconfig without the context), so a reconciler's pass fails the way any driver call
does, and tries again on the next.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from gpufleet.core.errors import DriverError, GpufleetError
from gpufleet.core.inventory import CredentialKind
from gpufleet.core.models import Cluster, SchedulerConfig
from gpufleet.schedulers.base import EvictionPass, SchedJob, SchedNode
from gpufleet.schedulers.kubernetes.config import KubernetesConfig
from gpufleet.schedulers.kubernetes.driver import KubernetesScheduler, SlurmSide
from gpufleet.schedulers.kubernetes.parsing import KubePod
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, CredentialRow
from gpufleet.server.services.credentials import open_credential
from gpufleet.server.services.keyring import Keyring

# What makes a built driver stale: the configuration, and the credential's row id, key id
# and last change (a replaced kubeconfig or a re-seal changes rotated_at).
_CacheKey = tuple[str, str | None, str | None, dt.datetime | None]

DriverFactory = Callable[..., KubernetesScheduler]  # (config, slurm=...) as the driver
_STORE_AGAIN = (
    "store a working kubeconfig under that name (`gpufleet credentials set {name} "
    "--kind kubeconfig --secret-file FILE`)"
)


@dataclasses.dataclass(frozen=True, slots=True)
class _Built:
    key: _CacheKey
    scheduler: KubernetesScheduler


def scheduler_config_of(cluster: Cluster | ClusterRow) -> SchedulerConfig | None:
    """The cluster's scheduler configuration, from its row (JSON) or its domain object;
    None when it has none or it does not read."""
    raw = cluster.scheduler_config
    if raw is None or isinstance(raw, SchedulerConfig):
        return raw
    if not raw:
        return None
    try:
        return SchedulerConfig.model_validate(raw)
    except ValidationError:
        return None


class KubeSchedulers:
    """One ``KubernetesScheduler`` per kubernetes cluster, rebuilt when its configuration
    or its credential changes. ``timeout_s`` bounds each API request (seconds; the
    driver's default, 30, unless a test shortens it); ``factory`` builds a driver."""

    def __init__(
        self,
        *,
        db: Database,
        keyring: Keyring,
        timeout_s: float | None = None,
        factory: DriverFactory = KubernetesScheduler,
        slurm: SlurmSide | None = None,
    ) -> None:
        self._db = db
        self._slurm = slurm  # the server's Slurm driver, for clusters with Slurm on them
        self._keyring = keyring
        self._timeout_s = timeout_s
        self._factory = factory
        self._built: dict[str, _Built] = {}  # by cluster id: at most one per cluster
        self._locks: dict[str, asyncio.Lock] = {}
        self.builds = 0  # drivers built so far (tests see a rebuild)

    def for_cluster(self, cluster: Cluster | ClusterRow) -> ClusterKubeScheduler:
        return ClusterKubeScheduler(
            self,
            cluster_id=cluster.id,
            cluster_name=cluster.name,
            config=scheduler_config_of(cluster),
        )

    async def reach(self, config: KubernetesConfig) -> str:
        """The version of the API server ``config`` points at, from a driver built for
        this one call and closed after it. Raises ``DriverError`` (unreachable, the
        credential refused, no answer within ``config.timeout_s``)."""
        driver = self._factory(config)
        try:
            # The driver bounds each request; this bounds the whole, TLS and auth included.
            async with asyncio.timeout(config.timeout_s + 5):
                return await driver.version()
        except TimeoutError:
            raise DriverError(
                f"kubernetes: GET /version: no answer within {config.timeout_s:.0f} s"
            ) from None
        finally:
            await driver.aclose()

    async def aclose(self) -> None:
        """Close every driver built (the server stops)."""
        built, self._built = self._built, {}
        for entry in built.values():
            await entry.scheduler.aclose()

    async def build(
        self, *, cluster_id: str, cluster_name: str, config: SchedulerConfig | None
    ) -> KubernetesScheduler:
        """The cluster's driver (raises ``DriverError`` naming what to fix)."""
        lock = self._locks.setdefault(cluster_id, asyncio.Lock())
        async with lock:  # one build per cluster at a time: no driver left unclosed
            return await self._build(
                cluster_id=cluster_id, cluster_name=cluster_name, config=config
            )

    async def _build(
        self, *, cluster_id: str, cluster_name: str, config: SchedulerConfig | None
    ) -> KubernetesScheduler:
        where = f"kubernetes: cluster {cluster_name}"
        if config is None or (config.credential_id is None and not config.in_cluster):
            raise DriverError(
                f"{where}: no kubeconfig or in-cluster credentials on record; delete the "
                "cluster and create it again with --kubeconfig or --in-cluster"
            )
        settings = json.dumps(config.model_dump(mode="json"), sort_keys=True)
        kubeconfig: str | None = None
        credential = "its kubeconfig"
        if config.in_cluster:
            key: _CacheKey = (settings, None, None, None)
        else:
            async with self._db.session() as session:
                row = await session.get(CredentialRow, config.credential_id)
            if row is None:
                raise DriverError(
                    f"{where}: its kubeconfig (credential {config.credential_id}) is not "
                    "stored any more; delete the cluster and create it again with "
                    "--kubeconfig"
                )
            credential = f"credential {row.name}"
            if row.kind != CredentialKind.KUBECONFIG.value:
                raise DriverError(
                    f"{where}: {credential} is a {row.kind} now, not a kubeconfig; "
                    f"{_STORE_AGAIN.format(name=row.name)}"
                )
            key = (settings, row.id, row.key_id, row.rotated_at or row.created_at)
            built = self._built.get(cluster_id)
            if built is not None and built.key == key:
                return built.scheduler
            try:
                kubeconfig = open_credential(self._keyring, row)
            except GpufleetError as exc:  # names the credential and key id, no secret
                raise DriverError(f"{where}: {exc.message}") from None
        built = self._built.get(cluster_id)
        if built is not None and built.key == key:
            return built.scheduler
        extra: dict[str, Any] = {} if self._timeout_s is None else {"timeout_s": self._timeout_s}
        if config.slurm and self._slurm is None:
            raise DriverError(
                f"{where}: Slurm runs on its nodes, and this server has no Slurm driver to "
                "drain them with; set GPUFLEET_SLURM_CONF (or GPUFLEET_SLURM_REST_URL)"
            )
        slurm = {"slurm": self._slurm} if config.slurm else {}
        try:
            scheduler = self._factory(
                KubernetesConfig(
                    kubeconfig=kubeconfig,
                    context=config.context,
                    in_cluster=config.in_cluster,
                    **extra,
                ),
                **slurm,
            )
        except ValueError as exc:  # the kubeconfig's own words, never its secrets
            name = credential.removeprefix("credential ")
            raise DriverError(
                f"{where}: {credential} cannot be used: {exc}; {_STORE_AGAIN.format(name=name)}"
            ) from None
        self._built[cluster_id] = _Built(key=key, scheduler=scheduler)
        self.builds += 1
        if built is not None:
            # A call still under way on the old driver may fail when its pool closes; the
            # reconcilers are level-triggered and try again on the new one.
            await built.scheduler.aclose()
        return scheduler


class ClusterKubeScheduler:
    """The driver of one kubernetes cluster, resolved on each call
    (``KubeSchedulers.build``). Implements what ``KubernetesScheduler`` does: Scheduler,
    SupportsDrain, SupportsDown and SupportsEviction."""

    kind = "kubernetes"

    def __init__(
        self,
        schedulers: KubeSchedulers,
        *,
        cluster_id: str,
        cluster_name: str,
        config: SchedulerConfig | None,
    ) -> None:
        self._schedulers = schedulers
        self._cluster_id = cluster_id
        self._cluster_name = cluster_name
        self._config = config

    async def _driver(self) -> KubernetesScheduler:
        return await self._schedulers.build(
            cluster_id=self._cluster_id, cluster_name=self._cluster_name, config=self._config
        )

    async def version(self) -> str:
        return await (await self._driver()).version()

    async def list_nodes(self) -> list[SchedNode]:
        return await (await self._driver()).list_nodes()

    async def jobs_on_node(self, node: str) -> list[SchedJob]:
        return await (await self._driver()).jobs_on_node(node)

    async def pending_gpu_demand(self) -> int:
        return await (await self._driver()).pending_gpu_demand()

    async def accounting_since(self, since: dt.datetime) -> list[SchedJob]:
        return await (await self._driver()).accounting_since(since)

    async def drain(self, node: str, *, reason: str) -> None:
        await (await self._driver()).drain(node, reason=reason)

    async def resume(self, node: str) -> None:
        await (await self._driver()).resume(node)

    async def down(self, node: str, *, reason: str) -> None:
        await (await self._driver()).down(node, reason=reason)

    async def evict_pods(self, node: str) -> EvictionPass:
        return await (await self._driver()).evict_pods(node)

    async def slurmd_pods(self) -> list[KubePod]:
        return await (await self._driver()).slurmd_pods()
