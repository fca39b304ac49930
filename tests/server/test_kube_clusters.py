"""Kubernetes clusters: created through the API with a kubeconfig against the Kubernetes
API emulator (``gpufleet.testing.kube_api``), the kubeconfig sealed as a credential and
never shown; bad, unreachable or silent API servers refused with a 422 and nothing
written; the per-cluster driver behind ``scheduler_for``, rebuilt when the credential is
re-sealed or replaced and closed when the server stops. On SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from apihelpers import console_page, create_project, error_of
from inventoryhelpers import KEY_A, KEY_B, keyed_app, put_credential
from sqlalchemy import select

import gpufleet.server.services.kube_clusters as kube_clusters
from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import SupportsDown, SupportsDrain, SupportsEviction
from gpufleet.schedulers.kubernetes.config import KubernetesConfig
from gpufleet.schedulers.kubernetes.driver import KubernetesScheduler
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.server.db.tables import AuditLogRow, ClusterRow, CredentialRow, EventRow
from gpufleet.server.main import rotate_secret_key
from gpufleet.server.schemas.clusters import CreateClusterRequest
from gpufleet.server.services.credentials import open_credential
from gpufleet.server.services.keyring import Keyring, decode_key
from gpufleet.server.services.kube_schedulers import (
    ClusterKubeScheduler,
    KubeSchedulers,
    scheduler_config_of,
)
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.testing.app import RunningApp, make_settings
from gpufleet.testing.kube_api import NODES, RunningKubeApi, kube_api
from gpufleet.testing.processes import free_port

# Recognisable, and unlike anything else the server writes.
APP_URL = "https://gpufleet.test"  # the console's session cookies are Secure
TOKEN = "kube-canary-4b1d7e-TOKEN-do-not-leak"


class RecordedScheduler(KubernetesScheduler):
    """The real driver, remembering whether it was closed."""

    built: list[RecordedScheduler] = []

    def __init__(self, config: KubernetesConfig) -> None:
        super().__init__(config)
        self.closed = False
        RecordedScheduler.built.append(self)

    async def aclose(self) -> None:
        self.closed = True
        await super().aclose()


@pytest.fixture
async def api() -> AsyncIterator[RunningKubeApi]:
    async with kube_api() as running:
        running.emulator.seed(
            NODES,
            {
                "metadata": {"name": "gpu-000", "labels": {}},
                "spec": {},
                "status": {
                    "capacity": {"nvidia.com/gpu": "8"},
                    "allocatable": {"nvidia.com/gpu": "8"},
                    "conditions": [{"type": "Ready", "status": "True"}],
                },
            },
        )
        yield running


def _kube_body(kubeconfig: str | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "project": "ml", "name": "kube", "size": 1, "scheduler": "kubernetes",
        "acceptance_tests": False, "node_prefix": "gpu-",
    }  # fmt: skip
    if kubeconfig is not None:
        body["kubeconfig"] = kubeconfig
    return {**body, **extra}


async def _stored(app: RunningApp) -> tuple[list[ClusterRow], list[CredentialRow]]:
    async with app.ctx.db.session() as session:
        clusters = list(await session.scalars(select(ClusterRow)))
        credentials = list(await session.scalars(select(CredentialRow)))
    return clusters, credentials


async def _texts_written(app: RunningApp) -> list[str]:
    async with app.ctx.db.session() as session:
        events = list(await session.scalars(select(EventRow)))
        audits = list(await session.scalars(select(AuditLogRow)))
        clusters = list(await session.scalars(select(ClusterRow)))
    return [
        *(f"{e.kind} {e.message} {e.data}" for e in events),
        *(f"{a.action} {a.object_type} {a.detail}" for a in audits),
        *(f"{c.scheduler_config} {c.provider_config}" for c in clusters),
    ]


async def test_a_kubernetes_cluster_is_created_with_its_kubeconfig_sealed_and_never_shown(
    database_url: str, tmp_path: Path, api: RunningKubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    kubeconfig = api.kubeconfig(token=TOKEN)
    async with keyed_app(database_url, tmp_path, public_url=APP_URL) as app:
        texts: list[str] = []
        await create_project(app.client, "ml")
        created = await app.client.post("/api/v1/clusters", json=_kube_body(kubeconfig))
        assert created.status_code == 201, created.text
        cluster = created.json()
        config = cluster["scheduler_config"]
        assert (config["context"], config["server"], config["in_cluster"]) == (
            "lab", api.url, False,
        )  # fmt: skip
        shown = await app.client.get(f"/api/v1/clusters/{cluster['id']}")
        assert shown.json()["scheduler_config"] == config
        listed = await app.client.get("/api/v1/clusters")
        credentials = await app.client.get("/api/v1/projects/ml/credentials")
        assert [(c["name"], c["kind"], c["id"]) for c in credentials.json()] == [
            (f"kubeconfig-{cluster['id']}", "kubeconfig", config["credential_id"])
        ]
        one = await app.client.get(f"/api/v1/projects/ml/credentials/kubeconfig-{cluster['id']}")
        page = await console_page(app, f"/clusters/{cluster['id']}/configuration")
        assert api.url in page.text and config["credential_id"] in page.text
        # In use by the cluster: the credential cannot go.
        refused = await app.client.delete(
            f"/api/v1/projects/ml/credentials/kubeconfig-{cluster['id']}"
        )
        assert refused.status_code == 409 and "kube" in error_of(refused)["message"]
        texts += [r.text for r in (created, shown, listed, credentials, one, page, refused)]

        # Sealed at rest; the server's driver for the cluster opens it and reads the API.
        (_, (row,)) = await _stored(app)
        assert TOKEN.encode() not in row.ciphertext
        assert open_credential(app.ctx.keyring, row) == kubeconfig
        async with app.ctx.db.session() as session:
            cluster_row = await session.get(ClusterRow, cluster["id"])
        assert cluster_row is not None
        scheduler = scheduler_for(app.ctx.drivers, cluster_row)
        assert isinstance(scheduler, ClusterKubeScheduler)
        for capability in (SupportsDrain, SupportsDown, SupportsEviction):
            assert isinstance(scheduler, capability)
        nodes = await scheduler.list_nodes()
        assert [(n.name, n.gpus) for n in nodes] == [("gpu-000", 8)]

        texts += await _texts_written(app)
        texts += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
        assert any("credential.create" in t for t in texts)  # the scan sees the audit rows
        leaked = [t[:200] for t in texts if TOKEN in t]
        assert not leaked, leaked


async def test_bad_or_unreachable_kubeconfigs_are_refused_saying_why_and_nothing_is_stored(
    database_url: str, tmp_path: Path, api: RunningKubeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    good = api.kubeconfig(token=TOKEN)
    closed = f"http://127.0.0.1:{free_port()}"
    no_user = good.replace("    user: lab-admin\n", "    user: nobody\n")
    assert no_user != good

    # A server that takes the connection and never answers.
    async def hang(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)
        writer.close()

    silent = await asyncio.start_server(hang, "127.0.0.1", 0)
    silent_url = f"http://127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    monkeypatch.setattr(kube_clusters, "REACH_TIMEOUT_S", 0.5)
    cases: list[tuple[dict[str, Any], int, str, list[str]]] = [
        (_kube_body("kind: Config\nclusters: [unclosed"), 422, "kubeconfig", ["not YAML"]),
        (_kube_body(good, kube_context="nope"), 422, "kube_context", ["'nope'", "lab"]),
        (_kube_body(no_user), 422, "kubeconfig", ["'nobody'", "not listed"]),
        (_kube_body(good.replace(api.url, closed)), 422, "kubeconfig",
         [f"cannot reach the Kubernetes API at {closed}"]),
        (_kube_body(good.replace(api.url, silent_url)), 422, "kubeconfig",
         [f"cannot reach the Kubernetes API at {silent_url}", "within"]),
        (_kube_body(kube_in_cluster=True), 422, "kube_in_cluster",
         ["cannot reach the Kubernetes API at the in-cluster API server", "pod"]),
        (_kube_body(good, kube_in_cluster=True), 422, "kube_in_cluster", ["not both"]),
        (_kube_body(), 422, "kubeconfig", ["kube_in_cluster"]),
        (_kube_body(kube_context="lab"), 422, "kubeconfig", ["kubeconfig"]),
        (_kube_body(12), 422, "kubeconfig", ["string"]),
        ({**_kube_body(good), "scheduler": "slurm"}, 422, "kubeconfig", ["only a kubernetes"]),
        ({**_kube_body(kube_in_cluster=True), "scheduler": "sim"}, 422, "kube_in_cluster",
         ["only a kubernetes"]),
    ]  # fmt: skip
    try:
        async with keyed_app(database_url, tmp_path) as app:
            await create_project(app.client, "ml")
            for body, status, field, said in cases:
                refused = await app.client.post("/api/v1/clusters", json=body)
                assert refused.status_code == status, (body, refused.text)
                error = error_of(refused)
                assert error["field"] == field, error
                for words in said:
                    assert words in error["message"], (words, error)
                assert TOKEN not in refused.text
                assert await _stored(app) == ([], [])
            assert not [t for t in await _texts_written(app) if TOKEN in t]
    finally:
        silent.close()


async def test_without_a_secret_key_a_kubeconfig_is_refused_before_the_api_is_asked(
    app: RunningApp, api: RunningKubeApi
) -> None:
    await create_project(app.client, "ml")
    refused = await app.client.post(
        "/api/v1/clusters", json=_kube_body(api.kubeconfig(token=TOKEN))
    )
    assert refused.status_code == 409 and "GPUFLEET_SECRET_KEY" in error_of(refused)["message"]
    assert api.emulator.requests_to("GET") == []
    assert await _stored(app) == ([], [])


async def test_rotation_and_replacement_rebuild_the_driver_and_the_old_one_is_closed(
    database_url: str, tmp_path: Path, api: RunningKubeApi
) -> None:
    RecordedScheduler.built.clear()
    async with keyed_app(database_url, tmp_path) as app:
        # The server knows both keys, as it does while a rotation is under way.
        both = Keyring.from_keys(
            decode_key(KEY_A, setting="t"), previous=[decode_key(KEY_B, setting="t")]
        )
        schedulers = KubeSchedulers(db=app.ctx.db, keyring=both, factory=RecordedScheduler)
        app.ctx.drivers.per_cluster_schedulers["kubernetes"] = schedulers
        stale = KubeSchedulers(db=app.ctx.db, keyring=app.ctx.keyring)  # key A alone
        await create_project(app.client, "ml")
        created = await app.client.post(
            "/api/v1/clusters", json=_kube_body(api.kubeconfig(token=TOKEN))
        )
        assert created.status_code == 201, created.text
        (reach,) = RecordedScheduler.built  # the reach check's, closed after its one call
        assert reach.closed
        async with app.ctx.db.session() as session:
            row = await session.get(ClusterRow, created.json()["id"])
        assert row is not None
        scheduler = scheduler_for(app.ctx.drivers, row)
        assert len(await scheduler.list_nodes()) == 1
        assert len(await scheduler.list_nodes()) == 1
        assert await stale.for_cluster(row).pending_gpu_demand() == 0
        assert schedulers.builds == 1
        first = RecordedScheduler.built[-1]

        settings = make_settings(
            data_dir=tmp_path / "data", database_url=database_url,
            secret_key=KEY_B, previous_secret_keys=[KEY_A],
        )  # fmt: skip
        result = await asyncio.to_thread(rotate_secret_key, settings)
        assert result.reencrypted == 1
        assert len(await scheduler.list_nodes()) == 1
        assert schedulers.builds == 2 and first.closed
        # A server that lacks the new key says which, naming the cluster, never the secret.
        with pytest.raises(DriverError) as info:
            await stale.for_cluster(row).list_nodes()
        assert "cluster kube" in info.value.message and TOKEN not in info.value.message

        # Replaced by name (a new token): rebuilt again; a kubeconfig that is not one is
        # refused.
        name = f"kubeconfig-{row.id}"
        bad = await put_credential(
            app.client, name, secret="just: [text", kind="kubeconfig", username=None
        )
        assert bad.status_code == 422 and "not YAML" in error_of(bad)["message"]
        replaced = await put_credential(
            app.client, name, secret=api.kubeconfig(token=TOKEN + "-2"), kind="kubeconfig",
            username=None,
        )  # fmt: skip
        assert replaced.status_code == 200, replaced.text
        second = RecordedScheduler.built[-1]
        assert len(await scheduler.list_nodes()) == 1
        assert schedulers.builds == 3 and second.closed
        third = RecordedScheduler.built[-1]
        await stale.aclose()
    assert third.closed  # the server stopped: its drivers' pools closed


async def test_in_cluster_credentials_store_nothing_secret(
    database_url: str, tmp_path: Path, api: RunningKubeApi
) -> None:
    """In a pod, ``KubernetesConfig(in_cluster=True)`` reads the service account; here a
    factory stands in for the pod's view, pointing the driver at the emulator."""
    kubeconfig = api.kubeconfig(token=TOKEN)

    def in_a_pod(config: KubernetesConfig) -> KubernetesScheduler:
        assert config.in_cluster and config.kubeconfig is None
        return KubernetesScheduler(KubernetesConfig(kubeconfig=kubeconfig))

    async with keyed_app(database_url, tmp_path) as app:
        app.ctx.drivers.per_cluster_schedulers["kubernetes"] = KubeSchedulers(
            db=app.ctx.db, keyring=app.ctx.keyring, factory=in_a_pod
        )
        await create_project(app.client, "ml")
        created = await app.client.post("/api/v1/clusters", json=_kube_body(kube_in_cluster=True))
        assert created.status_code == 201, created.text
        assert created.json()["scheduler_config"] == {
            "credential_id": None, "context": None, "server": None, "in_cluster": True,
            "slurm": False,
        }  # fmt: skip
        clusters, credentials = await _stored(app)
        assert len(clusters) == 1 and credentials == []
        nodes = await scheduler_for(app.ctx.drivers, clusters[0]).list_nodes()
        assert [n.name for n in nodes] == ["gpu-000"]


async def test_a_kubernetes_cluster_needs_the_scheduler_on_the_server(
    database_url: str, tmp_path: Path, api: RunningKubeApi
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        app.ctx.drivers.per_cluster_schedulers.clear()
        await create_project(app.client, "ml")
        refused = await app.client.post(
            "/api/v1/clusters", json=_kube_body(api.kubeconfig(token=TOKEN))
        )
        assert refused.status_code == 422
        assert "'kubernetes' is not configured" in error_of(refused)["message"]
        assert await _stored(app) == ([], [])


def test_neither_the_request_nor_the_checked_access_shows_the_kubeconfig() -> None:
    request = CreateClusterRequest.model_validate(_kube_body(f"token: {TOKEN}"))
    assert TOKEN not in repr(request) and TOKEN not in str(request.model_dump(mode="json"))
    access = kube_clusters.KubeAccess(
        kubeconfig=TOKEN, context="lab", server="https://k", in_cluster=False, version="v1"
    )
    assert TOKEN not in repr(access)


async def test_slurm_on_its_nodes_goes_through_the_servers_slurm_driver(
    database_url: str, tmp_path: Path, api: RunningKubeApi
) -> None:
    """``kube_slurm``: the cluster's driver is built with the server's Slurm driver (it
    drains the Slurm side first, tests/schedulers/slurm/test_lab_slinky.py); refused on a
    server without one, nothing stored."""
    async with keyed_app(database_url, tmp_path) as app:
        await create_project(app.client, "ml")
        drivers = app.ctx.drivers
        kube = drivers.per_cluster_schedulers["kubernetes"]
        assert isinstance(kube, KubeSchedulers)
        # The server's Slurm driver (the host's Slurm here; none is called by this test).
        slurm = drivers.schedulers.pop("slurm", None)
        if slurm is None:  # a host without Slurm's commands: the server built none
            slurm = SlurmScheduler(SlurmConfig())
            kube._slurm = slurm
        refused = await app.client.post(
            "/api/v1/clusters", json=_kube_body(api.kubeconfig(token=TOKEN), kube_slurm=True)
        )
        assert refused.status_code == 422, refused.text
        assert error_of(refused)["field"] == "kube_slurm"
        assert "no Slurm driver" in error_of(refused)["message"]
        assert await _stored(app) == ([], [])

        drivers.schedulers["slurm"] = slurm
        created = await app.client.post(
            "/api/v1/clusters", json=_kube_body(api.kubeconfig(token=TOKEN), kube_slurm=True)
        )
        assert created.status_code == 201, created.text
        assert created.json()["scheduler_config"]["slurm"] is True
        async with app.ctx.db.session() as session:
            (row,) = await session.scalars(select(ClusterRow))
        scheduler = scheduler_for(drivers, row)
        assert isinstance(scheduler, ClusterKubeScheduler)
        built = await kube.build(
            cluster_id=row.id, cluster_name=row.name, config=scheduler_config_of(row)
        )
        assert built.slurm is slurm
