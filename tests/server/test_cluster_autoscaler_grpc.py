"""Kubernetes' Cluster Autoscaler drives a gpufleet cluster through the externalgrpc
CloudProvider service the server serves: a real gRPC client (stubs generated from
gpufleet's proto) calls every RPC against the running app, and gpufleet answers as the
spec says — IncreaseSize makes nodes (provisioned in the background, shown ``creating``),
DeleteNodes on a node running a GPU pod is refused, a stockout shows on the instance
with CA's OutOfResources class.

Stand-ins, named as such: the Kubernetes API is ``gpufleet.testing.kube_api`` (kmock);
the machines are the sim provider's (with a capacity, to run out of); the test seeds
the Node objects a kubelet would register.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from gpufleet.server.externalgrpc import externalgrpc_pb2 as pb
from gpufleet.server.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from gpufleet.testing.fleet import SimFleet, sim_app
from gpufleet.testing.kube_api import NODES, PODS, RunningKubeApi, kube_api, pod_object

KEY = "bm90LWEtcmVhbC1rZXktanVzdC1mb3ItdGVzdHMtMzI="


def _kube_node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.present": "true"}},
        "spec": {},
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
        },
    }


async def _register(fleet: SimFleet, api: RunningKubeApi, seen: set[str]) -> None:
    """Play the kubelets: each node gpufleet made registers its Node object once."""
    for name, node in (await fleet.nodes_of(fleet.cluster_id)).items():
        kube = node["scheduler_name"] or name
        if kube not in seen and node["state"] != "provisioning":
            api.emulator.seed(NODES, _kube_node(kube))
            seen.add(kube)


async def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    code: grpc.StatusCode = info.value.code()
    return code


async def test_cluster_autoscaler_calls_every_rpc_against_gpufleet(
    database_url: str, tmp_path: Path
) -> None:
    async with kube_api() as api, sim_app(
        database_url, tmp_path, secret_key=KEY, externalgrpc_address="127.0.0.1:0",
        sim_max_instances=3,
    ) as fleet:  # fmt: skip
        created = await fleet.app.client.post(
            "/api/v1/clusters",
            json={
                "project": "ml", "name": "inf", "scheduler": "kubernetes", "provider": "sim",
                "size": 1, "gpus_per_node": 8, "gpu_model": "NVIDIA H100 80GB HBM3",
                "acceptance_tests": False, "kubeconfig": api.kubeconfig(),
            },
        )  # fmt: skip
        assert created.status_code == 201, created.text
        fleet.cluster = created.json()
        cid = fleet.cluster_id
        seen: set[str] = set()

        async def ready() -> bool:
            await _register(fleet, api, seen)
            status = await fleet.get(f"/api/v1/clusters/{cid}/status")
            return bool(status["status"] == "ready")

        await fleet.until(ready, ticks=10, what="the cluster ready")
        first = sorted(await fleet.nodes_of(cid))[0]
        put = await fleet.app.client.put(
            f"/api/v1/clusters/{cid}/autoscale",
            json={"mode": "cluster-autoscaler", "min_nodes": 1, "max_nodes": 4},
        )
        assert put.status_code == 200, put.text

        port = fleet.app.ctx.externalgrpc_port
        assert port
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            ca = pb_grpc.CloudProviderStub(channel)
            await ca.Refresh(pb.RefreshRequest(), timeout=5)
            (group,) = (await ca.NodeGroups(pb.NodeGroupsRequest(), timeout=5)).nodeGroups
            assert (group.id, group.minSize, group.maxSize) == (cid, 1, 4)
            assert "inf" in group.debug
            label = await ca.GPULabel(pb.GPULabelRequest(), timeout=5)
            assert label.label == "nvidia.com/gpu.product"
            types = await ca.GetAvailableGPUTypes(pb.GetAvailableGPUTypesRequest(), timeout=5)
            assert set(types.gpuTypes) == {"NVIDIA H100 80GB HBM3"}

            mine = pb.ExternalGrpcNode(providerID=f"gpufleet://{cid}/{first}", name=first)
            found = await ca.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=mine), timeout=5)
            assert found.nodeGroup.id == cid
            by_name = pb.ExternalGrpcNode(providerID="aws:///us-east-1a/i-0abc", name=first)
            found = await ca.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=by_name), timeout=5)
            assert found.nodeGroup.id == cid
            stranger = pb.ExternalGrpcNode(providerID="gpufleet://x/y", name="not-ours")
            found = await ca.NodeGroupForNode(pb.NodeGroupForNodeRequest(node=stranger), timeout=5)
            assert found.nodeGroup.id == ""  # not managed: CA leaves it alone

            size = await ca.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=cid), timeout=5)
            assert size.targetSize == 1

            # IncreaseSize answers at once (well within CA's 5 s); nodes come behind it.
            started = time.perf_counter()
            await ca.NodeGroupIncreaseSize(
                pb.NodeGroupIncreaseSizeRequest(id=cid, delta=2), timeout=5
            )
            assert time.perf_counter() - started < 5
            size = await ca.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=cid), timeout=5)
            assert size.targetSize == 3
            listed = await ca.NodeGroupNodes(pb.NodeGroupNodesRequest(id=cid), timeout=5)
            states = sorted(i.status.instanceState for i in listed.instances)
            assert states == sorted(
                [pb.InstanceStatus.instanceRunning] + [pb.InstanceStatus.instanceCreating] * 2
            )
            assert all(i.id.startswith(f"gpufleet://{cid}/") for i in listed.instances)
            assert (
                await _code(
                    ca.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=cid, delta=2))
                )
                is grpc.StatusCode.FAILED_PRECONDITION
            )  # over the maximum of 4
            assert (
                await _code(
                    ca.NodeGroupIncreaseSize(pb.NodeGroupIncreaseSizeRequest(id=cid, delta=0))
                )
                is grpc.StatusCode.INVALID_ARGUMENT
            )
            assert (
                await _code(
                    ca.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id="no-such-group"))
                )
                is grpc.StatusCode.NOT_FOUND
            )

            async def all_running() -> bool:
                await _register(fleet, api, seen)
                got = await ca.NodeGroupNodes(pb.NodeGroupNodesRequest(id=cid), timeout=5)
                return len(got.instances) == 3 and all(
                    i.status.instanceState == pb.InstanceStatus.instanceRunning
                    for i in got.instances
                )

            await fleet.until(all_running, ticks=20, what="three nodes running")
            (up,) = (await fleet.get(f"/api/v1/clusters/{cid}/autoscale/actions"))["items"]
            assert (up["kind"], up["source"], up["status"]) == (
                "scale_up", "cluster-autoscaler", "succeeded",
            )  # fmt: skip

            # DeleteNodes: a node running a GPU pod is refused; an idle one goes.
            names = sorted(await fleet.nodes_of(cid))
            busy, idle = names[0], names[1]
            api.emulator.seed(PODS, pod_object("serve-0", busy, owner=("Job", "serve"), gpus=8))
            refused = await _code(
                ca.NodeGroupDeleteNodes(
                    pb.NodeGroupDeleteNodesRequest(id=cid, nodes=[pb.ExternalGrpcNode(name=busy)])
                )
            )
            assert refused is grpc.StatusCode.FAILED_PRECONDITION
            assert (
                await _code(
                    ca.NodeGroupDeleteNodes(
                        pb.NodeGroupDeleteNodesRequest(
                            id=cid, nodes=[pb.ExternalGrpcNode(name="x")]
                        )
                    )
                )
                is grpc.StatusCode.NOT_FOUND
            )
            size = await ca.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=cid), timeout=5)
            assert size.targetSize == 3  # nothing removed by the refusals
            await ca.NodeGroupDeleteNodes(
                pb.NodeGroupDeleteNodesRequest(
                    id=cid,
                    nodes=[pb.ExternalGrpcNode(providerID=f"gpufleet://{cid}/{idle}", name=idle)],
                ),
                timeout=5,
            )
            listed = await ca.NodeGroupNodes(pb.NodeGroupNodesRequest(id=cid), timeout=5)
            deleting = [
                i.id
                for i in listed.instances
                if i.status.instanceState == pb.InstanceStatus.instanceDeleting
            ]
            assert deleting == [f"gpufleet://{cid}/{idle}"]

            async def gone() -> bool:
                got = await ca.NodeGroupNodes(pb.NodeGroupNodesRequest(id=cid), timeout=5)
                return f"gpufleet://{cid}/{idle}" not in {i.id for i in got.instances}

            await fleet.until(gone, ticks=10, what="the idle node removed")
            size = await ca.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=cid), timeout=5)
            assert size.targetSize == 2

            # A stockout: the sim cloud has 3 machines and 2 run; ask for 2 more.
            await ca.NodeGroupIncreaseSize(
                pb.NodeGroupIncreaseSizeRequest(id=cid, delta=2), timeout=5
            )

            async def refused_one() -> list[Any]:
                await _register(fleet, api, seen)
                got = await ca.NodeGroupNodes(pb.NodeGroupNodesRequest(id=cid), timeout=5)
                return [i for i in got.instances if i.status.HasField("errorInfo")]

            errors = await fleet.until(refused_one, ticks=10, what="a machine refused")
            (stuck,) = errors
            assert stuck.status.instanceState == pb.InstanceStatus.instanceCreating
            assert stuck.status.errorInfo.instanceErrorClass == 1  # OutOfResources
            assert stuck.status.errorInfo.errorCode == "out_of_capacity"
            assert "no capacity" in stuck.status.errorInfo.errorMessage
            # CA gives up the request it cannot get: the target comes back down.
            assert (
                await _code(
                    ca.NodeGroupDecreaseTargetSize(
                        pb.NodeGroupDecreaseTargetSizeRequest(id=cid, delta=1)
                    )
                )
                is grpc.StatusCode.INVALID_ARGUMENT
            )
            await ca.NodeGroupDecreaseTargetSize(
                pb.NodeGroupDecreaseTargetSizeRequest(id=cid, delta=-1), timeout=5
            )
            size = await ca.NodeGroupTargetSize(pb.NodeGroupTargetSizeRequest(id=cid), timeout=5)
            assert size.targetSize == 3
            assert (
                await _code(
                    ca.NodeGroupDecreaseTargetSize(
                        pb.NodeGroupDecreaseTargetSizeRequest(id=cid, delta=-1)
                    )
                )
                is grpc.StatusCode.FAILED_PRECONDITION
            )  # no request left to give up

            options = await ca.NodeGroupGetOptions(
                pb.NodeGroupAutoscalingOptionsRequest(id=cid), timeout=5
            )
            assert options.nodeGroupAutoscalingOptions.MaxNodeProvisionDuration.seconds == 3600
            for call in (
                ca.PricingNodePrice(pb.PricingNodePriceRequest()),
                ca.PricingPodPrice(pb.PricingPodPriceRequest()),
                ca.NodeGroupTemplateNodeInfo(pb.NodeGroupTemplateNodeInfoRequest(id=cid)),
            ):
                assert await _code(call) is grpc.StatusCode.UNIMPLEMENTED
            await ca.Cleanup(pb.CleanupRequest(), timeout=5)

        events = await fleet.get("/api/v1/events", cluster=cid, kind="autoscale.decision")
        assert any("Cluster Autoscaler asked" in e["message"] for e in events["items"])
