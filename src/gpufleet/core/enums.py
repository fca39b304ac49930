"""Enumerations of the domain. Stored as their string values."""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """A user's role in one project."""

    ADMIN = "admin"  # control plane: clusters, node actions, repairs, policy, members
    MEMBER = "member"  # data plane: see clusters, run workloads and active checks


class SchedulerKind(StrEnum):
    SLURM = "slurm"
    KUBERNETES = "kubernetes"
    SIM = "sim"


class ProviderKind(StrEnum):
    SIM = "sim"
    STATIC = "static"
    IPMI = "ipmi"
    REDFISH = "redfish"
    SSH = "ssh"
    AWS = "aws"


# Providers whose machines come from the host inventory (docs/providers.md). A BMC or an
# SSH login cannot hand a new machine its node token (there is no user data), so a
# cluster cannot be created on them yet: their hosts can be checked
# (``gpufleet providers check``), and the install enrolls the agent.
BARE_METAL_PROVIDERS = frozenset({ProviderKind.IPMI, ProviderKind.REDFISH, ProviderKind.SSH})


class ClusterStatus(StrEnum):
    PROVISIONING = "provisioning"
    ACCEPTANCE = "acceptance"
    READY = "ready"
    DEGRADED = "degraded"
    DELETING = "deleting"
    DELETED = "deleted"
    FAILED = "failed"


class NodeState(StrEnum):
    """Where a node is in its lifecycle (not whether it is healthy: see ``Health``)."""

    PROVISIONING = "provisioning"
    ACCEPTANCE = "acceptance"
    IN_SERVICE = "in_service"
    CORDONED = "cordoned"
    DRAINING = "draining"
    DRAINED = "drained"
    REPAIRING = "repairing"
    REMOVING = "removing"
    REMOVED = "removed"
    FAILED = "failed"


class Health(StrEnum):
    """Health of a GPU, node or cluster. ``unknown`` is never shown as healthy."""

    HEALTHY = "healthy"
    DEGRADED = "degraded"
    UNHEALTHY = "unhealthy"
    UNKNOWN = "unknown"


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"
    FATAL = "fatal"


# Least to most severe: the one ranking the agent's folding, the server's findings and the
# repair policy share.
SEVERITY_ORDER: tuple[Severity, ...] = (
    Severity.INFO,
    Severity.WARNING,
    Severity.CRITICAL,
    Severity.FATAL,
)


def severity_rank(severity: Severity) -> int:
    """0 for ``info`` up to 3 for ``fatal``."""
    return SEVERITY_ORDER.index(severity)


def worse(a: Severity, b: Severity) -> Severity:
    """The more severe of the two (``a`` when they are equal)."""
    return a if severity_rank(a) >= severity_rank(b) else b


class FindingSource(StrEnum):
    KERNEL_LOG = "kernel-log"
    NVML = "nvml"
    DCGM = "dcgm"
    INFINIBAND = "infiniband"
    SCHEDULER = "scheduler"
    ACTIVE_CHECK = "active-check"
    AGENT = "agent"
    SIM = "sim"
    STACK = "stack"  # the server, from what a node runs against its cluster's stack


class RepairAction(StrEnum):
    """From least to most drastic."""

    NONE = "none"
    RESTART_WORKLOAD = "restart_workload"
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    REPROVISION = "reprovision"
    FAILOVER = "failover"
    REMOVE = "remove"


class RepairStatus(StrEnum):
    PROPOSED = "proposed"
    APPROVED = "approved"
    REJECTED = "rejected"
    SUPERSEDED = "superseded"
    RESOLVED = "resolved"
    CORDONING = "cordoning"
    DRAINING = "draining"
    ACTING = "acting"
    VERIFYING = "verifying"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    # A rollout's node let go before its reinstall (its window closed; policy release):
    # back in service on its old stack, in line for the next opening.
    RELEASED = "released"


class CheckStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    CANCELLED = "cancelled"


class AcceptanceStage(StrEnum):
    """Where an acceptance run is in its suite; stages only move forward."""

    NODE = "node"  # node-level check runs, a batch per group of nodes
    CLUSTER = "cluster"  # the cluster-wide check runs over the nodes that passed
    GATING = "gating"  # report written; the nodes and the cluster still to move
    DONE = "done"


class StartupStatus(StrEnum):
    """A node start's startup scripts (``node_startup`` row)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # superseded by a newer start of the node, or the node went


class RolloutStatus(StrEnum):
    """A stack rollout (a cluster migrated to another stack inside maintenance windows):
    scheduled (waiting for its window) ⇄ running; paused by the failure budget or an
    admin; aborting (no new node starts, those under way finish) → aborted; succeeded
    when every node runs the new stack."""

    SCHEDULED = "scheduled"
    RUNNING = "running"
    PAUSED = "paused"
    ABORTING = "aborting"
    SUCCEEDED = "succeeded"
    ABORTED = "aborted"


class RolloutNodeStatus(StrEnum):
    """One node of a rollout: pending → migrating (its repair: cordon, drain, reprovision,
    re-acceptance) → done | failed; a done or failed node an admin rolls back migrates
    again, to the stack it came from (rolling_back → rolled_back | failed). A node that
    leaves the cluster before its turn is skipped."""

    PENDING = "pending"
    MIGRATING = "migrating"
    DONE = "done"
    FAILED = "failed"
    ROLLING_BACK = "rolling_back"
    ROLLED_BACK = "rolled_back"
    SKIPPED = "skipped"


class WindowClose(StrEnum):
    """What happens to a node not yet reinstalled when its window closes."""

    WAIT = "wait"  # it stays cordoned (drained once its jobs end) for the next opening
    RELEASE = "release"  # back in service on its old stack, in line for the next opening


class EventKind(StrEnum):
    CLUSTER_CREATED = "cluster.created"
    CLUSTER_STATUS = "cluster.status"
    CLUSTER_HEALTH = "cluster.health"
    NODE_CREATED = "node.created"
    NODE_STATE = "node.state"
    NODE_HEALTH = "node.health"
    NODE_PROVISIONED = "node.provisioned"
    NODE_REGISTERED = "node.registered"
    NODE_GPUS_CHANGED = "node.gpus_changed"
    NODE_BOOTED = "node.booted"  # the agent reported a new kernel boot id
    NODE_SOFTWARE = "node.software"  # the agent reported other software (driver, Slurm...)
    NODE_TOKEN_ISSUED = "node.token_issued"  # noqa: S105 - an event kind; the token is never in it
    NODE_ENROLLED = "node.enrolled"  # a bare-metal machine's agent enrolled as the node
    CLUSTER_ENROLL_TOKEN = "cluster.enroll_token"  # noqa: S105 - an event kind; never the token
    FINDING_OPENED = "finding.opened"
    FINDING_CLEARED = "finding.cleared"
    FAULT_INJECTED = "fault.injected"  # a simulated fault, by hand (gpufleet inject)
    FAULT_CLEARED = "fault.cleared"
    PROVIDER_ERROR = "provider.error"
    PROJECT_CREATED = "project.created"
    REPAIR_PROPOSED = "repair.proposed"
    REPAIR_UPDATED = "repair.updated"  # escalated in place, or new findings behind it
    REPAIR_STATUS = "repair.status"
    REPAIR_STEP = "repair.step"  # progress inside a step: waiting for a job, action asked
    INCIDENT_OPENED = "incident.opened"
    BREAKER_TRIPPED = "repair.breaker_tripped"
    BREAKER_RESET = "repair.breaker_reset"
    NODE_ACTION = "node.action"  # an admin's cordon / uncordon / drain
    NODE_DAEMON = "node.daemon"  # from the agent: slurmd / munge restarted, or given up on
    NODE_CLEANUP = "node.cleanup"  # from the Slurm epilog: a finished job's leftovers killed
    NODE_GPU_STATE = "node.gpu_state"  # from the agent: scheduler's GPU view vs the hardware
    NODE_ACCESS = "node.access"  # from the agent: sudoers / Slurm AdminLevels applied or refused
    NODE_STARTUP_SCRIPT = "node.startup_script"  # a startup script ran: exit code, output tail
    STARTUP_STATUS = "startup.status"  # a node start's scripts all ran, one failed, or cancelled
    CLUSTER_UPDATED = "cluster.updated"  # an admin changed the spec (suite, scripts, bounds)
    ACCEPTANCE_OPT_OUT = "cluster.acceptance_opt_out"  # acceptance tests turned off (or on)
    ACCEPTANCE_STARTED = "acceptance.started"
    ACCEPTANCE_FINISHED = "acceptance.finished"  # passed, or failed naming the nodes
    ACCEPTANCE_STATUS = "acceptance.status"  # a run started (its checks were queued)
    ACCEPTANCE_STAGE = "acceptance.stage"  # a run moved on: node → cluster → gating → done
    CHECK_REQUESTED = "check.requested"  # an active check run was asked for
    CHECK_STATUS = "check.status"  # a check run started, was skipped on a node, or ended
    NODE_COMMAND = "node.command"  # a command for the node's agent: queued, sent, ended
    HOST_STATE = "host.state"  # an inventory host: in service, spare, claimed, out of service
    AUTOSCALE_STATUS = "autoscale.status"  # a change of size began, ended or failed
    AUTOSCALE_STEP = "autoscale.step"  # within one: a node held, removed, or kept (took work)
    AUTOSCALE_DECISION = "autoscale.decision"  # the policy asked for a change, or was refused
    AUTOSCALE_UPDATED = "autoscale.updated"  # an admin changed a cluster's autoscaling
    ROLLOUT_CREATED = "rollout.created"  # an admin scheduled a cluster's migration
    ROLLOUT_STATUS = "rollout.status"  # a rollout started, waited, paused, ended
    ROLLOUT_NODE = "rollout.node"  # a node of a rollout began migrating, ended, rolled back
    ROLLOUT_STEP = "rollout.step"  # within one: its maintenance reservation booked or dropped
