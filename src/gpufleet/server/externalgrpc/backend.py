"""What the externalgrpc servicer asks of gpufleet: node groups, their sizes, their nodes.

The servicer (``service.py``) turns Cluster Autoscaler's RPCs into calls on a
``NodeGroupBackend`` and its answers back into protobuf; a backend knows nothing of gRPC.
Inputs and outputs are frozen dataclasses. Failures are gpufleet's own errors
(``gpufleet.core.errors``), which the servicer maps to gRPC status codes:

- ``NotFound``: unknown group, or a node that is not in the group → NOT_FOUND;
- ``InvalidInput``: a delta of the wrong sign or size → INVALID_ARGUMENT;
- ``Conflict``: refused in the current state (over max size, a node that may not be
  removed now) → FAILED_PRECONDITION;
- ``OutOfCapacity``: stockout or quota → RESOURCE_EXHAUSTED;
- ``DriverError``, ``Unavailable``: the provider or gpufleet cannot do it now → UNAVAILABLE.

Every call runs under CA's deadline (5 s by default), and the servicer cancels a call
that runs past its own, shorter budget (4 s by default). So a mutating call records the
change and returns (provisioning and teardown go on in the background and show in
``group_nodes``), and it makes the change in one step: a cancel must leave all of it
or none of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol


class InstanceState(StrEnum):
    """Where an instance of a group is in its life, as CA sees it."""

    RUNNING = "running"
    CREATING = "creating"
    DELETING = "deleting"


class ErrorClass(IntEnum):
    """CA's class of an instance error; the values are the wire values."""

    # Stockout or quota: CA backs off the group and may try another one.
    OUT_OF_RESOURCES = 1
    OTHER = 99


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A node group CA may scale. CA caches min and max size per group until it sees
    the group anew after a Refresh, so change them together with a refresh."""

    id: str
    min_size: int
    max_size: int
    debug: str = ""  # free text for CA's logs


@dataclass(frozen=True, slots=True)
class InstanceError:
    """Why an instance failed (or is failing) to come up."""

    code: str  # provider-specific, never empty (CA reads "" as "no error")
    message: str
    error_class: ErrorClass


@dataclass(frozen=True, slots=True)
class GroupInstance:
    """One machine of a group. ``id`` is the provider id the Kubernetes node will carry
    in ``spec.providerID`` (``<provider>://<id>``), so CA can match the two."""

    id: str
    state: InstanceState
    error: InstanceError | None = None


@dataclass(frozen=True, slots=True)
class NodeRef:
    """A Kubernetes node as CA describes it."""

    provider_id: str  # spec.providerID; may be empty for a node not (yet) matched
    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GroupOptions:
    """Per-group autoscaling options. ``None`` keeps CA's default for that option (the
    servicer fills it from the defaults CA sent); durations are in seconds."""

    scale_down_utilization_threshold: float | None = None
    scale_down_gpu_utilization_threshold: float | None = None
    zero_or_max_node_scaling: bool | None = None
    ignore_daemon_sets_utilization: bool | None = None
    scale_down_unneeded_s: float | None = None
    scale_down_unready_s: float | None = None
    # GPU bare metal often takes longer to come up than CA's 15 min default.
    max_node_provision_s: float | None = None
    max_node_startup_s: float | None = None
    allow_non_atomic_scale_up_to_max: bool | None = None


class NodeGroupBackend(Protocol):
    """The node groups gpufleet offers to Cluster Autoscaler."""

    # The node label that carries the GPU type, e.g. "nvidia.com/gpu.product". CA asks
    # for it once and caches it for the life of its process.
    gpu_label: str

    async def gpu_types(self) -> list[str]:
        """The GPU types the groups can make (values of ``gpu_label``).

        CA asks once and caches the answer for the life of its process.
        """
        ...

    async def refresh(self) -> None:
        """Called before each CA loop: bring cached state up to date.

        Raises:
            Unavailable: gpufleet cannot read its state now.
        """
        ...

    async def node_groups(self) -> list[GroupInfo]:
        """Every group CA may scale. An error here looks to CA like "no groups"."""
        ...

    async def group_for_node(self, node: NodeRef) -> GroupInfo | None:
        """The group a node belongs to.

        Returns:
            The group, or ``None`` for a node gpufleet does not let CA manage (CA then
            leaves it alone).
        """
        ...

    async def target_size(self, group_id: str) -> int:
        """The size the group is heading for: creating instances count, deleting ones
        do not.

        Raises:
            NotFound: no such group.
        """
        ...

    async def increase_size(self, group_id: str, delta: int) -> None:
        """Raise the target size by ``delta`` (> 0) and start provisioning. Returns once
        the target has moved; the instances show as CREATING until they run.

        Raises:
            NotFound: no such group.
            InvalidInput: ``delta`` is not positive.
            Conflict: the new size would pass the group's max size.
            OutOfCapacity: the provider has no capacity or quota for it now.
        """
        ...

    async def delete_nodes(self, group_id: str, nodes: Sequence[NodeRef]) -> None:
        """Remove exactly these nodes and lower the target size by their number.
        Nothing is removed if any node cannot be. Jobs on them are already drained by
        CA; the machines are torn down in the background (DELETING meanwhile).

        Raises:
            NotFound: no such group, or a node that is not in it.
            Conflict: a node that may not be removed now (e.g. held for a repair), or
                the size would fall under the group's min size.
        """
        ...

    async def decrease_target_size(self, group_id: str, delta: int) -> None:
        """Lower the target size by ``-delta`` (``delta`` < 0) by giving up requests
        not yet fulfilled; never removes an instance that exists.

        Raises:
            NotFound: no such group.
            InvalidInput: ``delta`` is not negative.
            Conflict: fewer unfulfilled requests than ``-delta``.
        """
        ...

    async def group_nodes(self, group_id: str) -> list[GroupInstance]:
        """Every instance of the group, including ones still being created or deleted
        and ones that failed to come up (with their error).

        Raises:
            NotFound: no such group.
        """
        ...

    async def group_options(self, group_id: str) -> GroupOptions | None:
        """Per-group autoscaling options.

        Returns:
            The options, or ``None`` when the group has none of its own (CA then uses
            its defaults).

        Raises:
            NotFound: no such group.
        """
        ...
