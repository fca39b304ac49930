"""Cluster Autoscaler's ``externalgrpc`` CloudProvider service over a ``NodeGroupBackend``.

``CloudProviderService`` answers every RPC of ``externalgrpc.proto``: it turns requests
into backend calls (``backend.py``) and the answers back into protobuf, and maps
gpufleet's errors to gRPC status codes. ``start_server`` serves it with grpc.aio,
insecure or with mutual TLS (CA's cloud-config ``key``/``cert``/``cacert``).

Deadlines: CA puts every call under one deadline (cloud-config ``grpc_timeout``, 5 s by
default) and on a timeout knows nothing of what happened. So each backend call gets a
budget (4 s by default, and never past the caller's own deadline less a margin); a call
that runs over is cancelled and answered DEADLINE_EXCEEDED with a message saying so,
which CA logs, rather than CA's bare client-side timeout.

Status details carry gpufleet's own error messages (written for a person to act on) and
nothing else: an unexpected exception is logged here with its traceback and answered
INTERNAL with a generic message.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeAlias, TypeVar

import grpc
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2

from gpufleet.core.errors import (
    Conflict,
    DriverError,
    GpufleetError,
    InvalidInput,
    NotFound,
    OutOfCapacity,
    Unavailable,
)
from gpufleet.server.externalgrpc import externalgrpc_pb2 as pb
from gpufleet.server.externalgrpc import externalgrpc_pb2_grpc as pb_grpc
from gpufleet.server.externalgrpc.backend import (
    GroupInfo,
    GroupInstance,
    GroupOptions,
    InstanceState,
    NodeGroupBackend,
    NodeRef,
)

log = logging.getLogger(__name__)

T = TypeVar("T")
Context: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"

# CA's default grpc_timeout is 5 s; answering within 4 s leaves a second for the network
# and for CA's own bookkeeping, so CA sees gpufleet's status rather than its own timeout.
DEFAULT_CALL_TIMEOUT_S = 4.0
# A caller with a deadline tighter than the budget gets our answer this long before it.
DEADLINE_MARGIN_S = 0.25
# In-flight calls get this long to finish on stop; longer than a call's budget.
DEFAULT_STOP_GRACE_S = 5.0

# First match wins, so a subclass comes before its base (OutOfCapacity is a DriverError).
_STATUS_FOR_ERROR: tuple[tuple[type[GpufleetError], grpc.StatusCode], ...] = (
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (Conflict, grpc.StatusCode.FAILED_PRECONDITION),
    (OutOfCapacity, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (Unavailable, grpc.StatusCode.UNAVAILABLE),
    (DriverError, grpc.StatusCode.UNAVAILABLE),
)
_INTERNAL_DETAILS = "internal error in gpufleet's autoscaler service; see the gpufleet server log"

_STATE_TO_PB = {
    InstanceState.RUNNING: pb.InstanceStatus.instanceRunning,
    InstanceState.CREATING: pb.InstanceStatus.instanceCreating,
    InstanceState.DELETING: pb.InstanceStatus.instanceDeleting,
}


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """PEM files for mutual TLS: the server's key and certificate, and the CA that signed
    the clients' certificates (Cluster Autoscaler's ``cert``). The server certificate must
    name the host part of CA's ``address`` (CA checks it as the TLS server name)."""

    key: Path
    cert: Path
    cacert: Path


async def _abort(context: Context, code: grpc.StatusCode, details: str) -> NoReturn:
    await context.abort(code, details)
    raise AssertionError("grpc.aio's abort() always raises")  # for the type checker


def _status_for(error: GpufleetError) -> grpc.StatusCode | None:
    for kind, code in _STATUS_FOR_ERROR:
        if isinstance(error, kind):
            return code
    return None


def _where(group: str) -> str:
    return f" for node group {group!r}" if group else ""


class CloudProviderService(pb_grpc.CloudProviderServicer):
    """The servicer: one method per RPC, each a thin translation over the backend.

    gRPC calls every method with (request, context), by position; an argument a method
    does not use is named with a leading underscore.
    """

    def __init__(
        self, backend: NodeGroupBackend, *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    ) -> None:
        if call_timeout_s <= 0:
            raise InvalidInput(
                f"call_timeout_s must be positive, got {call_timeout_s}", field="call_timeout_s"
            )
        self._backend = backend
        self._call_timeout_s = call_timeout_s

    def _budget_s(self, context: Context) -> float:
        remaining: float | None = context.time_remaining()
        if remaining is None:  # the caller set no deadline
            return self._call_timeout_s
        return max(0.0, min(self._call_timeout_s, remaining - DEADLINE_MARGIN_S))

    async def _run(
        self,
        context: Context,
        method: str,
        call: Callable[[], Awaitable[T]],
        *,
        group: str = "",
        delta: int | None = None,
    ) -> T:
        """Run one backend call under the budget; answer the RPC with an error status
        (and never return) when it fails or runs over."""
        log.debug("externalgrpc %s group=%r delta=%s", method, group, delta)
        budget = self._budget_s(context)
        scope = asyncio.timeout(budget)
        try:
            async with scope:
                return await call()
        except TimeoutError:
            if scope.expired():
                log.warning("externalgrpc %s%s: no answer in %.1f s", method, _where(group), budget)
                await _abort(
                    context,
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"gpufleet did not answer {method}{_where(group)} within {budget:.1f} s; "
                    "the call was cancelled",
                )
            # The backend's own timeout, not wrapped in a DriverError: unexpected.
            log.exception("externalgrpc %s%s failed", method, _where(group))
            await _abort(context, grpc.StatusCode.INTERNAL, _INTERNAL_DETAILS)
        except GpufleetError as exc:
            code = _status_for(exc)
            if code is not None:
                log.info("externalgrpc %s%s: %s: %s", method, _where(group), code.name, exc)
                await _abort(context, code, exc.message)
            log.exception("externalgrpc %s%s failed", method, _where(group))
            await _abort(context, grpc.StatusCode.INTERNAL, _INTERNAL_DETAILS)
        except Exception:
            log.exception("externalgrpc %s%s failed", method, _where(group))
            await _abort(context, grpc.StatusCode.INTERNAL, _INTERNAL_DETAILS)

    # --- provider-wide calls ---

    async def NodeGroups(
        self,
        _request: pb.NodeGroupsRequest,
        context: Context,
    ) -> pb.NodeGroupsResponse:
        groups = await self._run(context, "NodeGroups", self._backend.node_groups)
        return pb.NodeGroupsResponse(nodeGroups=[_group_to_pb(g) for g in groups])

    async def NodeGroupForNode(
        self, request: pb.NodeGroupForNodeRequest, context: Context
    ) -> pb.NodeGroupForNodeResponse:
        if not request.HasField("node"):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "NodeGroupForNode needs a node")
        node = _node_from_pb(request.node)
        group = await self._run(
            context, "NodeGroupForNode", lambda: self._backend.group_for_node(node)
        )
        # An empty id tells CA that gpufleet does not manage this node.
        return pb.NodeGroupForNodeResponse(
            nodeGroup=_group_to_pb(group) if group is not None else pb.NodeGroup(id="")
        )

    async def PricingNodePrice(
        self,
        _request: pb.PricingNodePriceRequest,
        context: Context,
    ) -> pb.PricingNodePriceResponse:
        await self._unimplemented(context, "PricingNodePrice", "gpufleet has no price model")

    async def PricingPodPrice(
        self,
        _request: pb.PricingPodPriceRequest,
        context: Context,
    ) -> pb.PricingPodPriceResponse:
        await self._unimplemented(context, "PricingPodPrice", "gpufleet has no price model")

    async def GPULabel(
        self, _request: pb.GPULabelRequest, _context: Context
    ) -> pb.GPULabelResponse:
        log.debug("externalgrpc GPULabel")
        return pb.GPULabelResponse(label=self._backend.gpu_label)

    async def GetAvailableGPUTypes(
        self,
        _request: pb.GetAvailableGPUTypesRequest,
        context: Context,
    ) -> pb.GetAvailableGPUTypesResponse:
        types = await self._run(context, "GetAvailableGPUTypes", self._backend.gpu_types)
        # CA reads only the keys; the value names the type again for readers like grpcurl.
        return pb.GetAvailableGPUTypesResponse(gpuTypes={t: _gpu_type_to_any(t) for t in types})

    async def Cleanup(self, _request: pb.CleanupRequest, _context: Context) -> pb.CleanupResponse:
        # CA is shutting its cloud provider down; gpufleet holds nothing open for it.
        log.info("externalgrpc Cleanup: Cluster Autoscaler is stopping its cloud provider")
        return pb.CleanupResponse()

    async def Refresh(self, _request: pb.RefreshRequest, context: Context) -> pb.RefreshResponse:
        await self._run(context, "Refresh", self._backend.refresh)
        return pb.RefreshResponse()

    # --- per-group calls ---

    async def NodeGroupTargetSize(
        self, request: pb.NodeGroupTargetSizeRequest, context: Context
    ) -> pb.NodeGroupTargetSizeResponse:
        group = request.id
        size = await self._run(
            context, "NodeGroupTargetSize", lambda: self._backend.target_size(group), group=group
        )
        return pb.NodeGroupTargetSizeResponse(targetSize=size)

    async def NodeGroupIncreaseSize(
        self, request: pb.NodeGroupIncreaseSizeRequest, context: Context
    ) -> pb.NodeGroupIncreaseSizeResponse:
        group, delta = request.id, request.delta
        if delta <= 0:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"NodeGroupIncreaseSize needs a positive delta, got {delta}",
            )
        await self._run(
            context,
            "NodeGroupIncreaseSize",
            lambda: self._backend.increase_size(group, delta),
            group=group,
            delta=delta,
        )
        return pb.NodeGroupIncreaseSizeResponse()

    async def NodeGroupDeleteNodes(
        self, request: pb.NodeGroupDeleteNodesRequest, context: Context
    ) -> pb.NodeGroupDeleteNodesResponse:
        group = request.id
        if not request.nodes:
            await _abort(
                context, grpc.StatusCode.INVALID_ARGUMENT, "NodeGroupDeleteNodes names no nodes"
            )
        nodes = tuple(_node_from_pb(n) for n in request.nodes)
        log.debug("externalgrpc NodeGroupDeleteNodes nodes=%s", [n.name for n in nodes])
        await self._run(
            context,
            "NodeGroupDeleteNodes",
            lambda: self._backend.delete_nodes(group, nodes),
            group=group,
            delta=-len(nodes),
        )
        return pb.NodeGroupDeleteNodesResponse()

    async def NodeGroupDecreaseTargetSize(
        self, request: pb.NodeGroupDecreaseTargetSizeRequest, context: Context
    ) -> pb.NodeGroupDecreaseTargetSizeResponse:
        group, delta = request.id, request.delta
        if delta >= 0:
            await _abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"NodeGroupDecreaseTargetSize needs a negative delta, got {delta}",
            )
        await self._run(
            context,
            "NodeGroupDecreaseTargetSize",
            lambda: self._backend.decrease_target_size(group, delta),
            group=group,
            delta=delta,
        )
        return pb.NodeGroupDecreaseTargetSizeResponse()

    async def NodeGroupNodes(
        self, request: pb.NodeGroupNodesRequest, context: Context
    ) -> pb.NodeGroupNodesResponse:
        group = request.id
        instances = await self._run(
            context, "NodeGroupNodes", lambda: self._backend.group_nodes(group), group=group
        )
        return pb.NodeGroupNodesResponse(instances=[_instance_to_pb(i) for i in instances])

    async def NodeGroupTemplateNodeInfo(
        self,
        _request: pb.NodeGroupTemplateNodeInfoRequest,
        context: Context,
    ) -> pb.NodeGroupTemplateNodeInfoResponse:
        # A template needs a v1.Node in Kubernetes' protobuf encoding; without it CA models
        # a group on one of its running nodes (so no scale-up from zero).
        await self._unimplemented(
            context, "NodeGroupTemplateNodeInfo", "gpufleet does not build node templates"
        )

    async def NodeGroupGetOptions(
        self, request: pb.NodeGroupAutoscalingOptionsRequest, context: Context
    ) -> pb.NodeGroupAutoscalingOptionsResponse:
        group = request.id
        options = await self._run(
            context, "NodeGroupGetOptions", lambda: self._backend.group_options(group), group=group
        )
        if options is None:
            await self._unimplemented(
                context,
                "NodeGroupGetOptions",
                f"node group {group!r} has no options of its own; use the defaults",
            )
        return pb.NodeGroupAutoscalingOptionsResponse(
            nodeGroupAutoscalingOptions=_options_to_pb(options, defaults=request.defaults)
        )

    async def _unimplemented(self, context: Context, method: str, why: str) -> NoReturn:
        log.debug("externalgrpc %s: UNIMPLEMENTED (%s)", method, why)
        await _abort(context, grpc.StatusCode.UNIMPLEMENTED, why)


# --- protobuf <-> backend types ---


def _group_to_pb(group: GroupInfo) -> pb.NodeGroup:
    return pb.NodeGroup(
        id=group.id, minSize=group.min_size, maxSize=group.max_size, debug=group.debug
    )


def _node_from_pb(node: pb.ExternalGrpcNode) -> NodeRef:
    return NodeRef(
        provider_id=node.providerID,
        name=node.name,
        labels=dict(node.labels),
        annotations=dict(node.annotations),
    )


def _instance_to_pb(instance: GroupInstance) -> pb.Instance:
    status = pb.InstanceStatus(instanceState=_STATE_TO_PB[instance.state])
    if instance.error is not None:
        status.errorInfo.CopyFrom(
            pb.InstanceErrorInfo(
                errorCode=instance.error.code,
                errorMessage=instance.error.message,
                instanceErrorClass=int(instance.error.error_class),
            )
        )
    return pb.Instance(id=instance.id, status=status)


def _gpu_type_to_any(gpu_type: str) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(wrappers_pb2.StringValue(value=gpu_type))
    return packed


def _set_duration(target: duration_pb2.Duration, seconds: float) -> None:
    target.FromNanoseconds(round(seconds * 1_000_000_000))


def _options_to_pb(
    options: GroupOptions, *, defaults: pb.NodeGroupAutoscalingOptions
) -> pb.NodeGroupAutoscalingOptions:
    """CA takes every field of the answer as the group's option (an unset duration reads
    as 0 s), so start from the defaults it sent and change only what the group sets."""
    out = pb.NodeGroupAutoscalingOptions()
    out.CopyFrom(defaults)
    if options.scale_down_utilization_threshold is not None:
        out.scaleDownUtilizationThreshold = options.scale_down_utilization_threshold
    if options.scale_down_gpu_utilization_threshold is not None:
        out.scaleDownGpuUtilizationThreshold = options.scale_down_gpu_utilization_threshold
    if options.zero_or_max_node_scaling is not None:
        out.zeroOrMaxNodeScaling = options.zero_or_max_node_scaling
    if options.ignore_daemon_sets_utilization is not None:
        out.ignoreDaemonSetsUtilization = options.ignore_daemon_sets_utilization
    if options.allow_non_atomic_scale_up_to_max is not None:
        out.allowNonAtomicScaleUpToMax = options.allow_non_atomic_scale_up_to_max
    if options.scale_down_unneeded_s is not None:
        _set_duration(out.scaleDownUnneededDuration, options.scale_down_unneeded_s)
    if options.scale_down_unready_s is not None:
        _set_duration(out.scaleDownUnreadyDuration, options.scale_down_unready_s)
    if options.max_node_provision_s is not None:
        _set_duration(out.MaxNodeProvisionDuration, options.max_node_provision_s)
    if options.max_node_startup_s is not None:
        _set_duration(out.maxNodeStartupDuration, options.max_node_startup_s)
    return out


# --- the server ---


def _read_pem(path: Path, *, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InvalidInput(
            f"cannot read the externalgrpc TLS {what} {str(path)!r}: {exc.strerror}", field=what
        ) from exc


def _server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    return grpc.ssl_server_credentials(
        [(_read_pem(tls.key, what="key"), _read_pem(tls.cert, what="cert"))],
        root_certificates=_read_pem(tls.cacert, what="cacert"),
        require_client_auth=True,
    )


def _is_local(address: str) -> bool:
    if address.startswith("unix:"):
        return True
    host = address.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def create_server(
    backend: NodeGroupBackend, *, call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
) -> grpc.aio.Server:
    """A grpc.aio server with the CloudProvider service registered, listening nowhere
    yet (``add_port``, then ``await server.start()``)."""
    # No SO_REUSEPORT: a second gpufleet on the same port must fail to start, not quietly
    # take half of CA's calls.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    service = CloudProviderService(backend, call_timeout_s=call_timeout_s)
    pb_grpc.add_CloudProviderServicer_to_server(service, server)
    return server


def add_port(server: grpc.aio.Server, *, address: str, tls: TlsFiles | None = None) -> int:
    """Listen on ``address`` ("host:port", port 0 picks a free one; or "unix:PATH"),
    with mutual TLS when ``tls`` is given: clients without a certificate signed by
    ``tls.cacert`` are refused.

    Returns:
        The port bound (0 for a unix socket).

    Raises:
        InvalidInput: a TLS file cannot be read, or the address cannot be listened on.
    """
    credentials = None if tls is None else _server_credentials(tls)
    if credentials is None and not _is_local(address):
        # CA's README recommends mTLS: these calls create and delete machines.
        log.warning(
            "externalgrpc on %s without TLS: anyone who reaches it can add and remove "
            "nodes; give it key, cert and cacert files",
            address,
        )
    try:
        if credentials is None:
            port: int = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
    except RuntimeError as exc:  # grpc's "Failed to bind to address ..."
        raise InvalidInput(
            f"cannot listen on {address!r} for Cluster Autoscaler: {exc}", field="address"
        ) from exc
    return port


async def start_server(
    backend: NodeGroupBackend,
    *,
    address: str,
    tls: TlsFiles | None = None,
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S,
) -> grpc.aio.Server:
    """Serve the CloudProvider service on ``address`` (see ``add_port``): insecure
    without ``tls``, mutual TLS with it. Stop it with ``stop_server``.

    Raises:
        InvalidInput: a TLS file cannot be read, or the address cannot be listened on.
    """
    server = create_server(backend, call_timeout_s=call_timeout_s)
    port = add_port(server, address=address, tls=tls)
    await server.start()
    log.info(
        "serving Cluster Autoscaler's externalgrpc CloudProvider on %s (port %d, %s)",
        address,
        port,
        "mutual TLS" if tls is not None else "no TLS",
    )
    return server


async def stop_server(server: grpc.aio.Server, *, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
    """Stop taking calls; calls in flight get ``grace_s`` to finish, then are cancelled."""
    await server.stop(grace_s)
    log.info("stopped the externalgrpc CloudProvider service")
