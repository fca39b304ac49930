"""The Cluster Autoscaler externalgrpc CloudProvider service, over real gRPC.

A real grpc.aio server on loopback runs ``CloudProviderService`` over ``RecordingBackend``
(an in-memory backend defined here), and a real client stub generated from our proto
calls every RPC the way CA does (a 5 s deadline on each call). Also: the proto against
the spec's field table, the error mapping, the deadline budget, mutual TLS with
certificates made here, and that the committed generated code matches the proto.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from google.protobuf import duration_pb2, wrappers_pb2

from gpufleet.core.errors import (
    Conflict,
    DriverError,
    Forbidden,
    InvalidInput,
    NotFound,
    OutOfCapacity,
    Unavailable,
)
from gpufleet.server.externalgrpc import externalgrpc_pb2 as pb
from gpufleet.server.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from gpufleet.server.externalgrpc.backend import (
    ErrorClass,
    GroupInfo,
    GroupInstance,
    GroupOptions,
    InstanceError,
    InstanceState,
    NodeRef,
)
from gpufleet.server.externalgrpc.service import (
    DEFAULT_CALL_TIMEOUT_S,
    CloudProviderService,
    TlsFiles,
    add_port,
    create_server,
    start_server,
    stop_server,
)

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "src" / "gpufleet" / "server" / "externalgrpc"
GENERATED = ("externalgrpc_pb2.py", "externalgrpc_pb2.pyi", "externalgrpc_pb2_grpc.py")
CA_DEADLINE_S = 5.0  # CA's default grpc_timeout: every call it makes runs under this
SERVICE = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider"
H100_NODE = "gpufleet://h100-0"


class RecordingBackend:
    """An in-memory ``NodeGroupBackend`` that records every call.

    Two groups: ``h100`` (target 2: one running, one still creating) and ``a100``
    (target 1: one out-of-capacity failure and one deleting). ``fail[method]`` makes a
    method raise; a method in ``hang`` waits until it is cancelled.
    """

    gpu_label = "nvidia.com/gpu.product"

    def __init__(self) -> None:
        self.groups = {
            "h100": GroupInfo(id="h100", min_size=0, max_size=4, debug="h100: 8×H100 SXM"),
            "a100": GroupInfo(id="a100", min_size=1, max_size=2),
        }
        self.targets = {"h100": 2, "a100": 1}
        self.instances: dict[str, list[GroupInstance]] = {
            "h100": [
                GroupInstance(id=H100_NODE, state=InstanceState.RUNNING),
                GroupInstance(id="gpufleet://h100-1", state=InstanceState.CREATING),
            ],
            "a100": [
                GroupInstance(
                    id="gpufleet://a100-0",
                    state=InstanceState.CREATING,
                    error=InstanceError(
                        code="stockout",
                        message="no A100 capacity in us-east-1a",
                        error_class=ErrorClass.OUT_OF_RESOURCES,
                    ),
                ),
                GroupInstance(
                    id="gpufleet://a100-1",
                    state=InstanceState.DELETING,
                    error=InstanceError(
                        code="bmc", message="power off failed", error_class=ErrorClass.OTHER
                    ),
                ),
            ],
        }
        self.options: dict[str, GroupOptions | None] = {
            "h100": GroupOptions(max_node_provision_s=2700.0, zero_or_max_node_scaling=True),
            "a100": None,
        }
        self.calls: list[tuple[object, ...]] = []
        self.fail: dict[str, Exception] = {}
        self.hang: set[str] = set()
        self.cancelled: list[str] = []

    async def _enter(self, method: str, *args: object) -> None:
        self.calls.append((method, *args))
        if method in self.fail:
            raise self.fail[method]
        if method in self.hang:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(method)
                raise

    def _group(self, group_id: str) -> GroupInfo:
        if group_id not in self.groups:
            raise NotFound(f"no node group {group_id!r}")
        return self.groups[group_id]

    async def gpu_types(self) -> list[str]:
        await self._enter("gpu_types")
        return ["nvidia-h100-80gb-hbm3", "nvidia-a100-sxm4-80gb"]

    async def refresh(self) -> None:
        await self._enter("refresh")

    async def node_groups(self) -> list[GroupInfo]:
        await self._enter("node_groups")
        return list(self.groups.values())

    async def group_for_node(self, node: NodeRef) -> GroupInfo | None:
        await self._enter("group_for_node", node)
        for group_id, instances in self.instances.items():
            if any(i.id == node.provider_id for i in instances):
                return self.groups[group_id]
        return None

    async def target_size(self, group_id: str) -> int:
        await self._enter("target_size", group_id)
        self._group(group_id)
        return self.targets[group_id]

    async def increase_size(self, group_id: str, delta: int) -> None:
        await self._enter("increase_size", group_id, delta)
        group = self._group(group_id)
        if self.targets[group_id] + delta > group.max_size:
            raise Conflict(f"{group_id} would pass its max size {group.max_size}")
        self.targets[group_id] += delta

    async def delete_nodes(self, group_id: str, nodes: Sequence[NodeRef]) -> None:
        await self._enter("delete_nodes", group_id, tuple(nodes))
        self._group(group_id)
        ours = {i.id for i in self.instances[group_id]}
        for node in nodes:
            if node.provider_id not in ours:
                raise NotFound(f"node {node.name} is not in node group {group_id}")
        self.targets[group_id] -= len(nodes)

    async def decrease_target_size(self, group_id: str, delta: int) -> None:
        await self._enter("decrease_target_size", group_id, delta)
        self._group(group_id)
        self.targets[group_id] += delta

    async def group_nodes(self, group_id: str) -> list[GroupInstance]:
        await self._enter("group_nodes", group_id)
        self._group(group_id)
        return self.instances[group_id]

    async def group_options(self, group_id: str) -> GroupOptions | None:
        await self._enter("group_options", group_id)
        self._group(group_id)
        return self.options[group_id]


@dataclass
class Served:
    backend: RecordingBackend
    stub: pb_grpc.CloudProviderStub
    port: int


@asynccontextmanager
async def serving(
    backend: RecordingBackend | None = None,
    *,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
    tls: TlsFiles | None = None,
    client: grpc.ChannelCredentials | None = None,
) -> AsyncIterator[Served]:
    """The service on 127.0.0.1, a free port, and a client channel to it."""
    backend = backend or RecordingBackend()
    server = create_server(backend, call_timeout_s=call_timeout_s)
    port = add_port(server, address="127.0.0.1:0", tls=tls)
    await server.start()
    target = f"127.0.0.1:{port}"
    channel = (
        grpc.aio.insecure_channel(target)
        if client is None
        else grpc.aio.secure_channel(target, client)
    )
    try:
        async with channel:
            yield Served(backend=backend, stub=pb_grpc.CloudProviderStub(channel), port=port)
    finally:
        await stop_server(server, grace_s=0)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async with serving() as running:
        yield running


def node(provider_id: str, name: str, **labels: str) -> pb.ExternalGrpcNode:
    return pb.ExternalGrpcNode(
        providerID=provider_id, name=name, labels=labels, annotations={"owner": "ml"}
    )


async def call_error(
    rpc: Any, request: object, *, deadline_s: float = CA_DEADLINE_S
) -> grpc.aio.AioRpcError:
    """Call ``rpc`` (a stub method) as CA does and return the error it answers with."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await rpc(request, timeout=deadline_s)
    return caught.value


# --- the proto is the spec's ---

SPEC_FIELDS: dict[str, dict[str, int]] = {
    "NodeGroup": {"id": 1, "minSize": 2, "maxSize": 3, "debug": 4},
    "ExternalGrpcNode": {"providerID": 1, "name": 2, "labels": 3, "annotations": 4},
    "NodeGroupsRequest": {},
    "NodeGroupsResponse": {"nodeGroups": 1},
    "NodeGroupForNodeRequest": {"node": 1},
    "NodeGroupForNodeResponse": {"nodeGroup": 1},
    "PricingNodePriceRequest": {"node": 1, "startTimestamp": 4, "endTimestamp": 5},
    "PricingNodePriceResponse": {"price": 1},
    "PricingPodPriceRequest": {"pod_bytes": 4, "startTimestamp": 5, "endTimestamp": 6},
    "PricingPodPriceResponse": {"price": 1},
    "GPULabelRequest": {},
    "GPULabelResponse": {"label": 1},
    "GetAvailableGPUTypesRequest": {},
    "GetAvailableGPUTypesResponse": {"gpuTypes": 1},
    "CleanupRequest": {},
    "CleanupResponse": {},
    "RefreshRequest": {},
    "RefreshResponse": {},
    "NodeGroupTargetSizeRequest": {"id": 1},
    "NodeGroupTargetSizeResponse": {"targetSize": 1},
    "NodeGroupIncreaseSizeRequest": {"delta": 1, "id": 2},
    "NodeGroupIncreaseSizeResponse": {},
    "NodeGroupDeleteNodesRequest": {"nodes": 1, "id": 2},
    "NodeGroupDeleteNodesResponse": {},
    "NodeGroupDecreaseTargetSizeRequest": {"delta": 1, "id": 2},
    "NodeGroupDecreaseTargetSizeResponse": {},
    "NodeGroupNodesRequest": {"id": 1},
    "NodeGroupNodesResponse": {"instances": 1},
    "Instance": {"id": 1, "status": 2},
    "InstanceStatus": {"instanceState": 1, "errorInfo": 2},
    "InstanceErrorInfo": {"errorCode": 1, "errorMessage": 2, "instanceErrorClass": 3},
    "NodeGroupTemplateNodeInfoRequest": {"id": 1},
    "NodeGroupTemplateNodeInfoResponse": {"nodeBytes": 2, "resourceSliceBytes": 3},
    "NodeGroupAutoscalingOptions": {
        "scaleDownUtilizationThreshold": 1,
        "scaleDownGpuUtilizationThreshold": 2,
        "zeroOrMaxNodeScaling": 6,
        "ignoreDaemonSetsUtilization": 7,
        "scaleDownUnneededDuration": 8,
        "scaleDownUnreadyDuration": 9,
        "MaxNodeProvisionDuration": 10,
        "maxNodeStartupDuration": 11,
        "allowNonAtomicScaleUpToMax": 12,
    },
    "NodeGroupAutoscalingOptionsRequest": {"id": 1, "defaults": 2},
    "NodeGroupAutoscalingOptionsResponse": {"nodeGroupAutoscalingOptions": 1},
}
SPEC_RPCS = {
    "NodeGroups": ("NodeGroupsRequest", "NodeGroupsResponse"),
    "NodeGroupForNode": ("NodeGroupForNodeRequest", "NodeGroupForNodeResponse"),
    "PricingNodePrice": ("PricingNodePriceRequest", "PricingNodePriceResponse"),
    "PricingPodPrice": ("PricingPodPriceRequest", "PricingPodPriceResponse"),
    "GPULabel": ("GPULabelRequest", "GPULabelResponse"),
    "GetAvailableGPUTypes": ("GetAvailableGPUTypesRequest", "GetAvailableGPUTypesResponse"),
    "Cleanup": ("CleanupRequest", "CleanupResponse"),
    "Refresh": ("RefreshRequest", "RefreshResponse"),
    "NodeGroupTargetSize": ("NodeGroupTargetSizeRequest", "NodeGroupTargetSizeResponse"),
    "NodeGroupIncreaseSize": ("NodeGroupIncreaseSizeRequest", "NodeGroupIncreaseSizeResponse"),
    "NodeGroupDeleteNodes": ("NodeGroupDeleteNodesRequest", "NodeGroupDeleteNodesResponse"),
    "NodeGroupDecreaseTargetSize": (
        "NodeGroupDecreaseTargetSizeRequest",
        "NodeGroupDecreaseTargetSizeResponse",
    ),
    "NodeGroupNodes": ("NodeGroupNodesRequest", "NodeGroupNodesResponse"),
    "NodeGroupTemplateNodeInfo": (
        "NodeGroupTemplateNodeInfoRequest",
        "NodeGroupTemplateNodeInfoResponse",
    ),
    "NodeGroupGetOptions": (
        "NodeGroupAutoscalingOptionsRequest",
        "NodeGroupAutoscalingOptionsResponse",
    ),
}


def test_the_proto_has_the_spec_field_numbers_and_rpcs() -> None:
    # The wire contract with CA: a renumbered field or renamed method breaks it silently.
    assert pb.DESCRIPTOR.package == "clusterautoscaler.cloudprovider.v1.externalgrpc"
    fields = {
        name: {f.name: f.number for f in message.fields}
        for name, message in pb.DESCRIPTOR.message_types_by_name.items()
    }
    assert fields == SPEC_FIELDS
    service = pb.DESCRIPTOR.services_by_name["CloudProvider"]
    assert service.full_name == SERVICE
    rpcs = {m.name: (m.input_type.name, m.output_type.name) for m in service.methods}
    assert rpcs == SPEC_RPCS
    states = pb.InstanceStatus.InstanceState
    assert [states.Value(n) for n in ("unspecified", "instanceRunning")] == [0, 1]
    assert [states.Value(n) for n in ("instanceCreating", "instanceDeleting")] == [2, 3]


def test_the_servicer_answers_every_rpc_itself() -> None:
    # The generated base answers UNIMPLEMENTED synchronously; every RPC is ours instead.
    for name in SPEC_RPCS:
        assert name in vars(CloudProviderService), name
        assert asyncio.iscoroutinefunction(getattr(CloudProviderService, name)), name


def test_the_committed_code_is_what_the_proto_generates(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(REPO / "scripts" / "gen_externalgrpc.sh"), str(tmp_path)], check=True, env=env
    )
    for name in GENERATED:
        assert (tmp_path / name).read_bytes() == (PACKAGE / name).read_bytes(), (
            f"{name} is stale: run scripts/gen_externalgrpc.sh and commit the result"
        )
    grpc_module = (PACKAGE / "externalgrpc_pb2_grpc.py").read_text()
    assert "from gpufleet.server.externalgrpc import externalgrpc_pb2 " in grpc_module


# --- every RPC ---


async def test_node_groups_lists_every_group(served: Served) -> None:
    answer = await served.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=CA_DEADLINE_S)
    assert [(g.id, g.minSize, g.maxSize, g.debug) for g in answer.nodeGroups] == [
        ("h100", 0, 4, "h100: 8×H100 SXM"),
        ("a100", 1, 2, ""),
    ]


async def test_node_group_for_node_names_the_group_or_an_empty_id(served: Served) -> None:
    request = pb.NodeGroupForNodeRequest(node=node(H100_NODE, "gpu-0", zone="a"))
    answer = await served.stub.NodeGroupForNode(request, timeout=CA_DEADLINE_S)
    assert (answer.nodeGroup.id, answer.nodeGroup.maxSize) == ("h100", 4)
    assert served.backend.calls[-1] == (
        "group_for_node",
        NodeRef(
            provider_id=H100_NODE, name="gpu-0", labels={"zone": "a"}, annotations={"owner": "ml"}
        ),
    )
    # A node gpufleet does not manage: the group's id is empty, which CA reads as "skip".
    request = pb.NodeGroupForNodeRequest(node=node("aws:///i-0abc", "cpu-0"))
    answer = await served.stub.NodeGroupForNode(request, timeout=CA_DEADLINE_S)
    assert answer.HasField("nodeGroup")
    assert answer.nodeGroup.id == ""


async def test_target_size(served: Served) -> None:
    request = pb.NodeGroupTargetSizeRequest(id="h100")
    answer = await served.stub.NodeGroupTargetSize(request, timeout=CA_DEADLINE_S)
    assert answer.targetSize == 2


async def test_increase_size_moves_the_target(served: Served) -> None:
    request = pb.NodeGroupIncreaseSizeRequest(id="h100", delta=2)
    await served.stub.NodeGroupIncreaseSize(request, timeout=CA_DEADLINE_S)
    assert served.backend.calls[-1] == ("increase_size", "h100", 2)
    answer = await served.stub.NodeGroupTargetSize(
        pb.NodeGroupTargetSizeRequest(id="h100"), timeout=CA_DEADLINE_S
    )
    assert answer.targetSize == 4
    # Past the max size: the backend refuses, and CA hears FAILED_PRECONDITION.
    error = await call_error(served.stub.NodeGroupIncreaseSize, request)
    assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == "h100 would pass its max size 4"


@pytest.mark.parametrize("delta", [0, -1])
async def test_increase_size_needs_a_positive_delta(served: Served, delta: int) -> None:
    request = pb.NodeGroupIncreaseSizeRequest(id="h100", delta=delta)
    error = await call_error(served.stub.NodeGroupIncreaseSize, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"got {delta}" in error.details()
    assert served.backend.calls == []


async def test_delete_nodes_removes_exactly_those_nodes(served: Served) -> None:
    request = pb.NodeGroupDeleteNodesRequest(id="h100", nodes=[node(H100_NODE, "gpu-0")])
    await served.stub.NodeGroupDeleteNodes(request, timeout=CA_DEADLINE_S)
    method, group, nodes = served.backend.calls[-1]
    assert (method, group) == ("delete_nodes", "h100")
    assert [(n.provider_id, n.name) for n in nodes] == [(H100_NODE, "gpu-0")]
    assert served.backend.targets["h100"] == 1
    # A node that is not in the group is an error (the spec's rule), not a no-op.
    request = pb.NodeGroupDeleteNodesRequest(id="a100", nodes=[node(H100_NODE, "gpu-0")])
    error = await call_error(served.stub.NodeGroupDeleteNodes, request)
    assert error.code() == grpc.StatusCode.NOT_FOUND
    assert error.details() == "node gpu-0 is not in node group a100"
    # Naming no node at all is a malformed request.
    error = await call_error(
        served.stub.NodeGroupDeleteNodes, pb.NodeGroupDeleteNodesRequest(id="h100")
    )
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_decrease_target_size_needs_a_negative_delta(served: Served) -> None:
    request = pb.NodeGroupDecreaseTargetSizeRequest(id="h100", delta=-1)
    await served.stub.NodeGroupDecreaseTargetSize(request, timeout=CA_DEADLINE_S)
    assert served.backend.calls[-1] == ("decrease_target_size", "h100", -1)
    assert served.backend.targets["h100"] == 1
    request = pb.NodeGroupDecreaseTargetSizeRequest(id="h100", delta=1)
    error = await call_error(served.stub.NodeGroupDecreaseTargetSize, request)
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "negative delta, got 1" in error.details()
    assert len(served.backend.calls) == 1


async def test_node_group_nodes_reports_states_and_error_classes(served: Served) -> None:
    states = pb.InstanceStatus.InstanceState
    answer = await served.stub.NodeGroupNodes(
        pb.NodeGroupNodesRequest(id="h100"), timeout=CA_DEADLINE_S
    )
    assert [(i.id, i.status.instanceState) for i in answer.instances] == [
        (H100_NODE, states.Value("instanceRunning")),
        ("gpufleet://h100-1", states.Value("instanceCreating")),
    ]
    # No error: CA reads an empty errorCode as "no error info".
    assert all(i.status.errorInfo.errorCode == "" for i in answer.instances)

    answer = await served.stub.NodeGroupNodes(
        pb.NodeGroupNodesRequest(id="a100"), timeout=CA_DEADLINE_S
    )
    stockout, other = answer.instances
    assert stockout.status.instanceState == states.Value("instanceCreating")
    assert (stockout.status.errorInfo.errorCode, stockout.status.errorInfo.errorMessage) == (
        "stockout",
        "no A100 capacity in us-east-1a",
    )
    assert stockout.status.errorInfo.instanceErrorClass == 1  # OutOfResources: CA backs off
    assert other.status.instanceState == states.Value("instanceDeleting")
    assert other.status.errorInfo.instanceErrorClass == 99


async def test_gpu_label_and_gpu_types(served: Served) -> None:
    label = await served.stub.GPULabel(pb.GPULabelRequest(), timeout=CA_DEADLINE_S)
    assert label.label == "nvidia.com/gpu.product"
    answer = await served.stub.GetAvailableGPUTypes(
        pb.GetAvailableGPUTypesRequest(), timeout=CA_DEADLINE_S
    )
    assert set(answer.gpuTypes) == {"nvidia-h100-80gb-hbm3", "nvidia-a100-sxm4-80gb"}
    # CA reads only the keys; each value is a StringValue naming the type again.
    for name, packed in answer.gpuTypes.items():
        value = wrappers_pb2.StringValue()
        assert packed.Unpack(value)
        assert value.value == name


async def test_refresh_and_cleanup(served: Served) -> None:
    await served.stub.Refresh(pb.RefreshRequest(), timeout=CA_DEADLINE_S)
    assert served.backend.calls == [("refresh",)]
    await served.stub.Cleanup(pb.CleanupRequest(), timeout=CA_DEADLINE_S)
    assert served.backend.calls == [("refresh",)]  # nothing for the backend to close


@pytest.mark.parametrize(
    ("method", "request_"),
    [
        ("PricingNodePrice", pb.PricingNodePriceRequest(node=node(H100_NODE, "gpu-0"))),
        ("PricingPodPrice", pb.PricingPodPriceRequest(pod_bytes=b"\x0a\x00")),
        ("NodeGroupTemplateNodeInfo", pb.NodeGroupTemplateNodeInfoRequest(id="h100")),
    ],
)
async def test_optional_rpcs_are_unimplemented(
    served: Served, method: str, request_: object
) -> None:
    # Code 12 is what CA's client turns into ErrNotImplemented (and falls back).
    error = await call_error(getattr(served.stub, method), request_)
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert error.code().value[0] == 12
    assert served.backend.calls == []


async def test_get_options_overrides_only_what_the_group_sets(served: Served) -> None:
    defaults = pb.NodeGroupAutoscalingOptions(
        scaleDownUtilizationThreshold=0.5,
        scaleDownGpuUtilizationThreshold=0.5,
        ignoreDaemonSetsUtilization=True,
        scaleDownUnneededDuration=duration_pb2.Duration(seconds=600),
        scaleDownUnreadyDuration=duration_pb2.Duration(seconds=1200),
        MaxNodeProvisionDuration=duration_pb2.Duration(seconds=900),
        maxNodeStartupDuration=duration_pb2.Duration(seconds=900),
    )
    request = pb.NodeGroupAutoscalingOptionsRequest(id="h100", defaults=defaults)
    answer = await served.stub.NodeGroupGetOptions(request, timeout=CA_DEADLINE_S)
    options = answer.nodeGroupAutoscalingOptions
    assert options.MaxNodeProvisionDuration.ToSeconds() == 2700  # GPU bare metal is slow
    assert options.zeroOrMaxNodeScaling is True
    # Everything else is CA's default, sent back as it came (unset would read as 0 s).
    expected = pb.NodeGroupAutoscalingOptions()
    expected.CopyFrom(defaults)
    expected.MaxNodeProvisionDuration.FromSeconds(2700)
    expected.zeroOrMaxNodeScaling = True
    assert options == expected


async def test_get_options_is_unimplemented_for_a_group_without_options(served: Served) -> None:
    request = pb.NodeGroupAutoscalingOptionsRequest(id="a100")
    error = await call_error(served.stub.NodeGroupGetOptions, request)
    assert error.code() == grpc.StatusCode.UNIMPLEMENTED
    assert "a100" in error.details()
    assert served.backend.calls == [("group_options", "a100")]


# --- errors ---


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (NotFound("no node group 'x'"), grpc.StatusCode.NOT_FOUND),
        (InvalidInput("delta 500 is more than 64"), grpc.StatusCode.INVALID_ARGUMENT),
        (Conflict("gpu-0 is held for a repair"), grpc.StatusCode.FAILED_PRECONDITION),
        (OutOfCapacity("no p5.48xlarge capacity"), grpc.StatusCode.RESOURCE_EXHAUSTED),
        (Unavailable("the store is down"), grpc.StatusCode.UNAVAILABLE),
        (DriverError("ipmitool on gpu-0 exited 1"), grpc.StatusCode.UNAVAILABLE),
    ],
)
async def test_domain_errors_map_to_status_codes(
    served: Served, error: Exception, code: grpc.StatusCode
) -> None:
    served.backend.fail["increase_size"] = error
    request = pb.NodeGroupIncreaseSizeRequest(id="h100", delta=1)
    answer = await call_error(served.stub.NodeGroupIncreaseSize, request)
    assert answer.code() == code
    assert answer.details() == str(error)


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("connect to postgresql://gpufleet:hunter2@db failed"),
        Forbidden("token sk-live-123 lacks scope"),  # a domain error with no mapping
        TimeoutError("read timed out (password=hunter2)"),  # the backend's own timeout
    ],
)
async def test_unexpected_errors_are_internal_with_a_generic_message(
    served: Served, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    served.backend.fail["node_groups"] = error
    with caplog.at_level(logging.ERROR, logger="gpufleet.server.externalgrpc.service"):
        answer = await call_error(served.stub.NodeGroups, pb.NodeGroupsRequest())
    assert answer.code() == grpc.StatusCode.INTERNAL
    details = answer.details()
    assert "hunter2" not in details and "sk-live" not in details
    assert "Traceback" not in details and "Error" not in details
    assert "gpufleet server log" in details
    # The operator gets the whole story in the log.
    assert any(r.exc_info and r.exc_info[1] is error for r in caplog.records)


# --- deadlines ---


async def test_a_slow_backend_is_answered_before_cas_deadline() -> None:
    backend = RecordingBackend()
    backend.hang.add("increase_size")
    async with serving(backend) as served:  # the default 4 s budget
        request = pb.NodeGroupIncreaseSizeRequest(id="h100", delta=1)
        started = time.monotonic()
        error = await call_error(served.stub.NodeGroupIncreaseSize, request)
        elapsed = time.monotonic() - started
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # Our status with our words, not the client's own "Deadline Exceeded".
    assert error.details() == (
        "gpufleet did not answer NodeGroupIncreaseSize for node group 'h100' within 4.0 s; "
        "the call was cancelled"
    )
    assert DEFAULT_CALL_TIMEOUT_S - 0.5 < elapsed < CA_DEADLINE_S
    assert backend.cancelled == ["increase_size"]


async def test_the_budget_follows_a_tighter_caller_deadline() -> None:
    backend = RecordingBackend()
    backend.hang.add("group_nodes")
    async with serving(backend, call_timeout_s=30.0) as served:
        request = pb.NodeGroupNodesRequest(id="h100")
        error = await call_error(served.stub.NodeGroupNodes, request, deadline_s=1.5)
    assert error.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert error.details().startswith("gpufleet did not answer NodeGroupNodes")
    assert backend.cancelled == ["group_nodes"]


# --- serving: plain, mutual TLS ---


async def test_start_server_serves_until_stopped(tmp_path: Path) -> None:
    # A unix socket: no port to pick, and start_server's own address handling is used.
    address = f"unix:{tmp_path / 'ca.sock'}"
    server = await start_server(RecordingBackend(), address=address)
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.CloudProviderStub(channel)
            label = await stub.GPULabel(pb.GPULabelRequest(), timeout=CA_DEADLINE_S)
            assert label.label == "nvidia.com/gpu.product"
    finally:
        await stop_server(server)
    async with grpc.aio.insecure_channel(address) as channel:
        error = await call_error(
            pb_grpc.CloudProviderStub(channel).GPULabel, pb.GPULabelRequest(), deadline_s=1.0
        )
    assert error.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_taken_port_is_a_clear_error(served: Served) -> None:
    server = create_server(RecordingBackend())
    with pytest.raises(
        InvalidInput, match=re.escape(f"cannot listen on '127.0.0.1:{served.port}'")
    ):
        add_port(server, address=f"127.0.0.1:{served.port}")


async def test_a_missing_tls_file_is_a_clear_error(tmp_path: Path) -> None:
    tls = TlsFiles(key=tmp_path / "nope.key", cert=tmp_path / "c.pem", cacert=tmp_path / "ca.pem")
    with pytest.raises(InvalidInput, match=r"nope\.key"):
        await start_server(RecordingBackend(), address="127.0.0.1:0", tls=tls)


@dataclass(frozen=True)
class Pki:
    server: TlsFiles
    ca_pem: bytes
    client_key: bytes
    client_cert: bytes
    stranger_key: bytes  # a client certificate from another CA
    stranger_cert: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    *,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
    usage: x509.ObjectIdentifier | None = None,
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer[0].subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=usage is None, path_length=None), critical=True)
    )
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        # CA's client checks the host part of its `address` as the TLS server name.
        san = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return builder.sign(issuer[1] if issuer else key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    folder = tmp_path_factory.mktemp("externalgrpc-pki")
    ca_key, stranger_ca_key = _key(), _key()
    ca = _cert("gpufleet test CA", ca_key)
    stranger_ca = _cert("some other CA", stranger_ca_key)
    server_key, client_key, stranger_key = _key(), _key(), _key()
    server = _cert(
        "gpufleet", server_key, issuer=(ca, ca_key), usage=ExtendedKeyUsageOID.SERVER_AUTH
    )
    client = _cert(
        "cluster-autoscaler", client_key, issuer=(ca, ca_key), usage=ExtendedKeyUsageOID.CLIENT_AUTH
    )
    stranger = _cert(
        "cluster-autoscaler",
        stranger_key,
        issuer=(stranger_ca, stranger_ca_key),
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
    )
    files = TlsFiles(key=folder / "tls.key", cert=folder / "tls.crt", cacert=folder / "ca.crt")
    files.key.write_bytes(_pem_key(server_key))
    files.cert.write_bytes(_pem(server))
    files.cacert.write_bytes(_pem(ca))
    return Pki(
        server=files,
        ca_pem=_pem(ca),
        client_key=_pem_key(client_key),
        client_cert=_pem(client),
        stranger_key=_pem_key(stranger_key),
        stranger_cert=_pem(stranger),
    )


async def test_mutual_tls_serves_a_client_with_a_certificate(pki: Pki) -> None:
    client = grpc.ssl_channel_credentials(
        root_certificates=pki.ca_pem,
        private_key=pki.client_key,
        certificate_chain=pki.client_cert,
    )
    async with serving(tls=pki.server, client=client) as served:
        answer = await served.stub.NodeGroups(pb.NodeGroupsRequest(), timeout=CA_DEADLINE_S)
    assert [g.id for g in answer.nodeGroups] == ["h100", "a100"]


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
async def test_mutual_tls_refuses_other_clients(pki: Pki, who: str) -> None:
    if who == "no certificate":
        client = grpc.ssl_channel_credentials(root_certificates=pki.ca_pem)
    else:
        client = grpc.ssl_channel_credentials(
            root_certificates=pki.ca_pem,
            private_key=pki.stranger_key,
            certificate_chain=pki.stranger_cert,
        )
    async with serving(tls=pki.server, client=client) as served:
        error = await call_error(
            served.stub.NodeGroupIncreaseSize, pb.NodeGroupIncreaseSizeRequest(id="h100", delta=1)
        )
        assert error.code() == grpc.StatusCode.UNAVAILABLE
        assert served.backend.calls == []
        assert served.backend.targets["h100"] == 2
