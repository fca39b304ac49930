"""Slurm on Kubernetes (Slinky): a Kubernetes node whose slurmd pod runs a node of the real
Slurm lab. The Kubernetes driver, given the lab's Slurm driver, drains in Slurm first,
waits for the Slurm job, then cordons and evicts; it uncordons before it resumes in
Slurm. The order is checked from both sides: the Kubernetes API (the emulator of
``gpufleet.testing.kube_api``) looks at Slurm's state at the moment each request comes
in, and Slurm's own state is read between the steps."""

from __future__ import annotations

import asyncio
from typing import Any

import kmock

from gpufleet.core.holds import repair_hold
from gpufleet.schedulers.kubernetes.config import KubernetesConfig
from gpufleet.schedulers.kubernetes.driver import KubernetesScheduler
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.testing.kube_api import NODES, PODS, kube_api, pod_object
from gpufleet.testing.slurm_lab import SlurmLab

REPAIR = repair_hold("0191d3a4-0000-7000-8000-0000000000aa", signature_id="xid-79", action="reboot")
K8S_NODE = "k8s-gpu-2"


def _pod(name: str, *, owner: tuple[str, str], gpus: int = 0, **spec: Any) -> dict[str, Any]:
    labels = {"app.kubernetes.io/name": "slurmd"} if owner[0] == "NodeSet" else {}
    return pod_object(
        name, K8S_NODE, namespace="slurm", owner=owner, gpus=gpus, labels=labels, grace_s=5,
        **spec,
    )  # fmt: skip


async def test_slurm_is_drained_before_any_eviction_and_resumed_after_uncordon(
    slurm_lab: SlurmLab,
) -> None:
    slurm_node = slurm_lab.node_names[1]
    slurm = SlurmScheduler(SlurmConfig(env=slurm_lab.env()))
    seen: list[tuple[str, str, str]] = []  # (what the API got, Slurm's state at that moment)

    def slurm_state_at(request: kmock.Request) -> None:
        if request.method == kmock.method.POST and request.subresource == "eviction":
            seen.append(("evict", str(request.name), slurm_lab.node_states()[slurm_node]))
        elif request.method == kmock.method.PATCH and request.resource == NODES:
            body = request.data if isinstance(request.data, dict) else {}
            if "unschedulable" in (body.get("spec") or {}):
                what = "cordon" if body["spec"]["unschedulable"] else "uncordon"
                seen.append((what, str(request.name), slurm_lab.node_states()[slurm_node]))

    job = slurm_lab.run(
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        f"--nodelist={slurm_node}",
        "--wrap",
        "sleep 4",
    ).stdout.strip()
    slurm_lab.wait_until(
        lambda: slurm_lab.node_states()[slurm_node] in ("alloc", "mix"),
        timeout_s=30,
        what=f"job {job} running on {slurm_node}",
    )
    try:
        async with kube_api() as api:
            api.emulator.seed(
                NODES,
                {
                    "metadata": {"name": K8S_NODE},
                    "spec": {},
                    "status": {
                        "allocatable": {"nvidia.com/gpu": "8"},
                        "conditions": [{"type": "Ready", "status": "True"}],
                    },
                },
            )
            # slurmd (a NodeSet pod, hostname = the Slurm node), an inference pod, and a
            # DaemonSet's pod that stays.
            api.emulator.seed(
                PODS,
                _pod("gpu-nodes-1", owner=("NodeSet", "gpu-nodes"), gpus=8, hostname=slurm_node),
            )
            api.emulator.seed(PODS, _pod("exporter", owner=("DaemonSet", "dcgm-exporter")))
            api.emulator.watchers.append(slurm_state_at)
            kube = KubernetesScheduler(
                KubernetesConfig(kubeconfig=api.kubeconfig(), timeout_s=10), slurm=slurm
            )
            try:
                await kube.drain(K8S_NODE, reason=REPAIR.text)
                # Slurm drained with gpufleet's reason; Kubernetes not cordoned yet.
                assert slurm_lab.node_states()[slurm_node] in ("drng", "drain")
                reason = slurm_lab.run("sinfo", "-h", "-n", slurm_node, "-o", "%E").stdout.strip()
                assert reason == REPAIR.text
                node = api.emulator.stored(NODES, K8S_NODE)
                assert not node["spec"].get("unschedulable")
                assert node["metadata"]["annotations"]["gpufleet.io/slurm-node"] == slurm_node

                # The Slurm job holds the node: no cordon, no eviction, it is listed as a job.
                waiting = await kube.evict_pods(K8S_NODE)
                assert waiting.evicted == () and "Slurm job(s) still running" in waiting.blocked[0]
                alone = await kube.jobs_on_node(K8S_NODE)
                assert job in {j.job_id for j in alone}
                # Many nodes at once (DeleteNodes, the repair planner): the same answer,
                # from one read of Kubernetes and one of Slurm.
                many = await kube.jobs_on_nodes([K8S_NODE, "gpu-9"])
                assert many == {K8S_NODE: alone, "gpu-9": None}
                assert seen == []

                slurm_lab.wait_for_node_state(slurm_node, "drain", timeout_s=60)
                done = await kube.evict_pods(K8S_NODE)
                assert done.evicted == ("slurm/gpu-nodes-1",)
                assert done.skipped == ("slurm/exporter",)
                assert [s[0] for s in seen] == ["cordon", "evict"]
                assert all(state == "drain" for _, _, state in seen), seen  # Slurm first

                for _ in range(100):
                    if not await kube.jobs_on_node(K8S_NODE):
                        break
                    await asyncio.sleep(0.05)
                assert await kube.jobs_on_node(K8S_NODE) == []

                await kube.resume(K8S_NODE)
                assert seen[-1] == ("uncordon", K8S_NODE, "drain")  # Slurm still drained then
                assert slurm_lab.node_states()[slurm_node].rstrip("*") == "idle"  # resumed after
                node = api.emulator.stored(NODES, K8S_NODE)
                assert not node["spec"].get("unschedulable")
                assert "gpufleet.io/slurm-node" not in (node["metadata"].get("annotations") or {})
                assert api.emulator.requests_to("delete") == []
            finally:
                await kube.aclose()
    finally:
        slurm_lab.reset()
