"""Slurm on Kubernetes: a slurmd pod restarted or replaced by its controller (the
self-healing daemon) is an event on its node's timeline, each change recorded once, also
across a server restart (the last state seen is the newest event). Against the API
emulator of ``gpufleet.testing.kube_api``, with the sim provider's machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from inventoryhelpers import KEY_A

from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.server.services.kube_schedulers import KubeSchedulers
from gpufleet.server.workers.base import LoopDeps
from gpufleet.server.workers.slurmd_watch import SlurmdWatchLoop
from gpufleet.testing.fleet import sim_app
from gpufleet.testing.kube_api import PODS, kube_api, pod_object


def _slurmd(name: str, node: str, *, slurm_node: str, restarts: int = 0) -> dict[str, Any]:
    obj = pod_object(
        name, node, namespace="slurm", owner=("NodeSet", "gpu"), hostname=slurm_node,
        labels={"app.kubernetes.io/name": "slurmd"},
    )  # fmt: skip
    obj["status"]["containerStatuses"] = [{"name": "main", "restartCount": restarts, "ready": True}]
    return obj


async def test_a_restarted_or_replaced_slurmd_pod_is_an_event_once(
    database_url: str, tmp_path: Path
) -> None:
    async with kube_api() as api, sim_app(database_url, tmp_path, secret_key=KEY_A) as fleet:
        # The server's Slurm driver (the host's Slurm here; the watch calls none of it).
        drivers = fleet.app.ctx.drivers
        slurm = drivers.schedulers.setdefault("slurm", SlurmScheduler(SlurmConfig()))
        kube = drivers.per_cluster_schedulers["kubernetes"]
        assert isinstance(kube, KubeSchedulers)
        kube._slurm = kube._slurm or slurm  # type: ignore[assignment]

        async def create(name: str, *, slurm_on_it: bool) -> str:
            created = await fleet.app.client.post(
                "/api/v1/clusters",
                json={
                    "project": "ml", "name": name, "scheduler": "kubernetes", "size": 2,
                    "acceptance_tests": False, "kubeconfig": api.kubeconfig(),
                    "kube_slurm": slurm_on_it,
                },
            )  # fmt: skip
            assert created.status_code == 201, created.text
            return str(created.json()["id"])

        cluster_id = await create("kube", slurm_on_it=True)
        plain_id = await create("plain", slurm_on_it=False)  # no Slurm: not watched
        nodes = await fleet.nodes_of(cluster_id)
        name = sorted(nodes)[0]
        kube_node = nodes[name]["scheduler_name"] or name
        api.emulator.seed(PODS, _slurmd("gpu-0", kube_node, slurm_node="gpu-0"))
        api.emulator.seed(PODS, _slurmd("elsewhere", "not-ours", slurm_node="x"))
        plain_node = sorted(await fleet.nodes_of(plain_id))[0]
        api.emulator.seed(PODS, _slurmd("plain-0", plain_node, slurm_node="plain-0"))
        watch = fleet.loop(SlurmdWatchLoop)

        async def daemon_events() -> list[dict[str, Any]]:
            return await fleet.events(cluster_id, "node.daemon")

        await watch.run_once()
        (first,) = await daemon_events()
        assert "runs in pod slurm/gpu-0" in first["message"] and first["node_id"]
        await watch.run_once()
        assert len(await daemon_events()) == 1  # nothing changed
        assert await fleet.events(plain_id, "node.daemon") == []

        # The kubelet restarts slurmd in place (its container was OOM-killed).
        api.emulator.change(
            PODS,
            "gpu-0",
            {
                "status": {
                    "containerStatuses": [
                        {
                            "name": "main",
                            "restartCount": 1,
                            "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
                        }
                    ]
                }
            },
            "slurm",
        )
        await watch.run_once()
        events = await daemon_events()
        assert len(events) == 2
        assert "restarted by Kubernetes in pod slurm/gpu-0 (restarts 0 → 1" in events[-1]["message"]
        assert "OOMKilled, exit 137" in events[-1]["message"]
        assert events[-1]["data"]["source"] == "kubernetes"

        # A server restart (a new loop, nothing in memory) records nothing twice.
        deps = LoopDeps(db=fleet.app.ctx.db, clock=fleet.clock, owner="replica-2", lease_ttl_s=30)
        again = SlurmdWatchLoop(deps, interval_s=30, drivers=fleet.app.ctx.drivers)
        await again.run_once()
        assert len(await daemon_events()) == 2

        # The NodeSet controller replaces the pod: a new uid.
        api.emulator.objects[PODS, "slurm", "gpu-0"].delete()
        api.emulator.seed(PODS, _slurmd("gpu-0", kube_node, slurm_node="gpu-0"))
        await again.run_once()
        events = await daemon_events()
        assert len(events) == 3
        assert "replaced by its controller" in events[-1]["message"]
