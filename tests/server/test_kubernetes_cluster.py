"""A cluster of kind ``kubernetes``, end to end: xid-79 on a Kubernetes node → a reboot
proposal → approved by an admin (a member cannot) → the node cordoned and tainted → its
GPU pod evicted once its PodDisruptionBudget allows it (the 429 waited out, the
DaemonSet pod left alone) → the provider reboots the machine → the node is Ready again
with a new boot id and its agent reports → uncordoned, taint gone, ``GpuHealthy=True``.
No pod is deleted (asserted on every request the API server got).

Stand-ins, named as such: the Kubernetes API is ``gpufleet.testing.kube_api`` (kmock with
the behaviour its doc lists; no kube-apiserver runs here), the machines and their agents
are the sim provider's, and the test plays the kubelet (Ready, boot id) and the PDB
controller (``disruptionsAllowed``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apihelpers import console_page, error_of, member_client
from inventoryhelpers import KEY_A

from gpufleet.testing.fleet import SimFleet, sim_app
from gpufleet.testing.kube_api import NODES, PDBS, PODS, RunningKubeApi, kube_api, pod_object


def _kube_node(name: str, *, boot_id: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            "nodeInfo": {"bootID": boot_id},
        },
    }


def _pod(name: str, node: str, *, owner: tuple[str, str], gpus: int = 0) -> dict[str, Any]:
    return pod_object(name, node, owner=owner, gpus=gpus, labels={"app": owner[1]})


def _kubelet(api: RunningKubeApi, node: str, ready: str, reason: str, **info: str) -> None:
    """What the kubelet reports: its Ready condition (the others kept, as its strategic
    merge does) and, after a boot, the new boot id."""
    kept = [
        c for c in api.emulator.stored(NODES, node)["status"]["conditions"] if c["type"] != "Ready"
    ]
    status: dict[str, Any] = {
        "conditions": [*kept, {"type": "Ready", "status": ready, "reason": reason}]
    }
    if info:
        status["nodeInfo"] = info
    api.emulator.change(NODES, node, {"status": status})


async def _kube_cluster(fleet: SimFleet, api: RunningKubeApi) -> dict[str, Any]:
    created = await fleet.app.client.post(
        "/api/v1/clusters",
        json={
            "project": "ml",
            "name": "kube",
            "scheduler": "kubernetes",
            "provider": "sim",
            "size": 2,
            "gpus_per_node": 8,
            "acceptance_tests": False,
            "kubeconfig": api.kubeconfig(),
        },
    )
    assert created.status_code == 201, created.text
    cluster: dict[str, Any] = created.json()
    fleet.cluster = cluster
    return cluster


async def test_xid_79_on_a_kubernetes_node_is_repaired_through_the_kubernetes_api(
    database_url: str, tmp_path: Path
) -> None:
    async with kube_api() as api, sim_app(database_url, tmp_path, secret_key=KEY_A) as fleet:
        cluster = await _kube_cluster(fleet, api)
        assert cluster["scheduler_config"]["server"] == api.url
        assert "emulator-token" not in str(cluster)

        async def ready() -> dict[str, Any] | None:
            status = await fleet.get(f"/api/v1/clusters/{fleet.cluster_id}/status")
            return status if status["status"] == "ready" else None

        await fleet.until(ready, ticks=10, what="the cluster ready")
        fleet.nodes = await fleet.nodes_of(fleet.cluster_id)
        await fleet.tick(0)
        names = sorted(fleet.nodes)
        target = names[0]
        kube_name = fleet.nodes[target]["scheduler_name"] or target
        for name in names:
            node = fleet.nodes[name]
            api.emulator.seed(
                NODES, _kube_node(node["scheduler_name"] or name, boot_id=str(node["boot_id"]))
            )
        api.emulator.seed(PODS, _pod("train-0", kube_name, owner=("Job", "train"), gpus=8))
        api.emulator.seed(PODS, _pod("dcgm-x", kube_name, owner=("DaemonSet", "dcgm-exporter")))
        api.emulator.seed(
            PDBS,
            {
                "metadata": {"name": "train", "namespace": "ml"},
                "spec": {"selector": {"matchLabels": {"app": "train"}}, "minAvailable": 1},
                "status": {"disruptionsAllowed": 0, "currentHealthy": 1, "desiredHealthy": 1},
            },
        )
        # The nodes page reads Kubernetes: the GPU pod is the node's job, in namespace ml.
        shown = await fleet.node(target)
        before_boot = shown["boot_id"]

        await fleet.inject(target, "xid-79", gpu_index=2)
        repair = await fleet.until(lambda: fleet.proposed_for(target), what="the proposal")
        assert repair["action"] == "reboot" and repair["signature_id"] == "xid-79"
        detail = await fleet.repair(repair["id"])
        assert [(j["job_id"], j["account"]) for j in detail["jobs"]] == [("ml/train-0", "ml")]

        async with await member_client(fleet.app) as member:
            refused = await member.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
            assert refused.status_code == 403 and "repair.approve" in error_of(refused)["message"]
        approved = await fleet.app.client.post(
            f"/api/v1/repairs/{repair['id']}/approve", json={"reason": "xid 79"}
        )
        assert approved.status_code == 200, approved.text

        async def status_is(*wanted: str) -> dict[str, Any] | None:
            found = await fleet.repair(repair["id"])
            return found if found["status"] in wanted else None

        # Cordoned and tainted with the health condition; the budget refuses the eviction.
        held = await fleet.until(lambda: status_is("draining"), ticks=10, what="draining")
        node = api.emulator.stored(NODES, kube_name)
        assert node["spec"]["unschedulable"] is True
        assert node["metadata"]["annotations"]["gpufleet.io/hold"] == (
            f"gpufleet: {repair['id']} xid-79"
        )
        assert {"key": "gpufleet.io/repair", "value": "repair", "effect": "NoSchedule"} in node[
            "spec"
        ]["taints"]
        condition = next(c for c in node["status"]["conditions"] if c["type"] == "GpuHealthy")
        assert (condition["status"], condition["reason"]) == ("False", "Xid79")
        for _ in range(3):
            await fleet.tick(5)
        held = await fleet.repair(repair["id"])
        assert held["status"] == "draining", held
        assert "eviction refused for now: ml/train-0" in held["detail"], held["detail"]
        assert api.emulator.stored(PODS, "train-0", "ml") is not None

        # The console's tabs work for it as for Slurm: the GPU pod is the node's job.
        cid, node_id = fleet.cluster_id, fleet.nodes[target]["id"]
        for tab in ("health", "events", "repairs", "configuration"):
            await console_page(fleet.app, f"/clusters/{cid}/{tab}")
        assert "ml/train-0" in (await console_page(fleet.app, f"/clusters/{cid}/nodes")).text
        assert (
            "ml/train-0" in (await console_page(fleet.app, f"/clusters/{cid}/nodes/{node_id}")).text
        )
        shown = (await console_page(fleet.app, f"/clusters/{cid}/repairs/{repair['id']}")).text
        assert "eviction refused for now" in shown

        # The budget allows one more (a replacement became healthy): evicted, then gone
        # after its grace period; the machine is rebooted through the provider.
        api.emulator.change(PDBS, "train", {"status": {"disruptionsAllowed": 1}}, "ml")
        # The kubelet goes with the reboot (NotReady until the test says it is back).
        _kubelet(api, kube_name, "Unknown", "NodeStatusUnknown")

        async def rebooted() -> dict[str, Any] | None:
            found = await fleet.repair(repair["id"])
            if found["status"] in ("verifying", "succeeded", "failed"):
                return found
            return None

        await fleet.until(rebooted, ticks=60, seconds=2, what="the reboot")
        assert api.emulator.stored(PODS, "train-0", "ml") is None
        assert api.emulator.stored(PODS, "dcgm-x", "ml") is not None  # the DaemonSet's pod

        # The agent reports the new boot; the node stays cordoned while not Ready.
        async def waits_for_ready() -> dict[str, Any] | None:
            found = await fleet.repair(repair["id"])
            return found if "is not Ready yet" in found["detail"] else None

        waiting = await fleet.until(waits_for_ready, ticks=20, seconds=2, what="Ready awaited")
        assert waiting["status"] == "verifying", waiting
        assert api.emulator.stored(NODES, kube_name)["spec"]["unschedulable"] is True
        after = await fleet.node(target)
        _kubelet(api, kube_name, "True", "KubeletReady", bootID=str(after["boot_id"]))
        done = await fleet.until(
            lambda: status_is("succeeded", "failed"), ticks=60, seconds=5, what="the end"
        )
        assert done["status"] == "succeeded", done
        after = await fleet.node(target)
        assert after["state"] == "in_service" and after["boot_id"] != before_boot, after

        released = api.emulator.stored(NODES, kube_name)
        assert not released["spec"].get("unschedulable")
        taints = released["spec"].get("taints") or []
        assert not [t for t in taints if t["key"] == "gpufleet.io/repair"]
        assert "gpufleet.io/hold" not in (released["metadata"].get("annotations") or {})
        condition = next(c for c in released["status"]["conditions"] if c["type"] == "GpuHealthy")
        assert condition["status"] == "True"

        # Evictions only: the budget's 429, then the one it allowed; no pod deleted.
        evictions = api.emulator.requests_to("post", subresource="eviction")
        assert [r.name for r in evictions].count("train-0") >= 2
        assert "dcgm-x" not in {r.name for r in evictions}
        assert api.emulator.requests_to("delete") == []
