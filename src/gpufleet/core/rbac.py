"""Who may do what, as data. The server enforces it through one dependency per route
(``server/deps.py`` ``Allow``); the console and the CLI read the same table.

Roles are per project (``core.enums.Role``). The platform owner is global: every
permission in every project, plus the few that belong to no project (``OWNER_ONLY``).
A project-scoped token caps its holder to that project and, if it says so, to member.
"""

from __future__ import annotations

from enum import StrEnum

from gpufleet.core.enums import Role


class Permission(StrEnum):
    PROJECT_READ = "project.read"
    CLUSTER_READ = "cluster.read"
    CLUSTER_CREATE = "cluster.create"
    CLUSTER_DELETE = "cluster.delete"
    NODE_READ = "node.read"
    NODE_ACTION = "node.action"
    EVENT_READ = "event.read"
    FINDING_READ = "finding.read"
    REPAIR_READ = "repair.read"
    REPAIR_APPROVE = "repair.approve"
    POLICY_MANAGE = "policy.manage"  # the project's repair policy; the breaker reset
    CHECK_READ = "check.read"
    CHECK_RUN = "check.run"
    USAGE_READ = "usage.read"
    VOLUME_READ = "volume.read"
    VOLUME_MANAGE = "volume.manage"
    MEMBER_READ = "member.read"
    MEMBER_MANAGE = "member.manage"
    TOKEN_CREATE = "token.create"  # noqa: S105 - a permission name: one's own tokens
    TOKEN_MANAGE = "token.manage"  # noqa: S105 - list and revoke others' project tokens
    AUDIT_READ = "audit.read"
    # The management plane: BMC addresses, host keys, and secrets that reach them.
    HOST_READ = "host.read"
    HOST_MANAGE = "host.manage"
    CREDENTIAL_MANAGE = "credential.manage"
    # Outside any project: the platform owner's alone.
    PROJECT_CREATE = "project.create"
    USER_READ = "user.read"
    USER_MANAGE = "user.manage"
    STACK_MANAGE = "stack.manage"  # the platform's software stacks (everyone reads them)
    # Every project's nodes, findings and repairs as numbers: /metrics.
    METRICS_READ = "metrics.read"


DESCRIPTIONS: dict[Permission, str] = {
    Permission.PROJECT_READ: "see the project",
    Permission.CLUSTER_READ: "see its clusters and their status",
    Permission.CLUSTER_CREATE: "create clusters and change their settings",
    Permission.CLUSTER_DELETE: "delete clusters",
    Permission.NODE_READ: "see nodes and GPUs",
    Permission.NODE_ACTION: "node actions (cordon, drain, reboot...), commands, acceptance runs",
    Permission.EVENT_READ: "see the timeline",
    Permission.FINDING_READ: "see findings",
    Permission.REPAIR_READ: "see repairs, the breaker, the repair policy; replay it",
    Permission.REPAIR_APPROVE: "approve, dismiss and force repairs",
    Permission.POLICY_MANAGE: "set the repair policy, reset the breaker",
    Permission.CHECK_READ: "see active check runs",
    Permission.CHECK_RUN: "run active checks on idle nodes",
    Permission.USAGE_READ: "see GPU-hours",
    Permission.VOLUME_READ: "see storage volumes",
    Permission.VOLUME_MANAGE: "create, resize, delete, attach and detach volumes",
    Permission.MEMBER_READ: "see who is in the project",
    Permission.MEMBER_MANAGE: "add, change and remove members",
    Permission.TOKEN_CREATE: "create personal API tokens for themselves",
    Permission.TOKEN_MANAGE: "list and revoke anyone's tokens for the project",
    Permission.AUDIT_READ: "read the project's audit log",
    Permission.HOST_READ: "see the host inventory (BMC addresses, racks, spares)",
    Permission.HOST_MANAGE: "import hosts, bind nodes to hosts",
    Permission.CREDENTIAL_MANAGE: "store, list and delete BMC/SSH/cloud credentials (write-only)",
    Permission.PROJECT_CREATE: "create projects and name their first admin",
    Permission.USER_READ: "list every user",
    Permission.USER_MANAGE: "create users, set their Unix names",
    Permission.STACK_MANAGE: "define software stacks and mark the latest",
    Permission.METRICS_READ: "scrape the fleet-wide Prometheus metrics (/metrics)",
}

# Actions outside any one project: only the platform owner has them.
OWNER_ONLY = frozenset(
    {
        Permission.PROJECT_CREATE,
        Permission.USER_READ,
        Permission.USER_MANAGE,
        Permission.STACK_MANAGE,
        Permission.METRICS_READ,
    }
)

# Members work in the project: they see all of it, run checks and make their own tokens.
_MEMBER = frozenset(
    {
        Permission.PROJECT_READ,
        Permission.CLUSTER_READ,
        Permission.NODE_READ,
        Permission.EVENT_READ,
        Permission.FINDING_READ,
        Permission.REPAIR_READ,
        Permission.CHECK_READ,
        Permission.CHECK_RUN,
        Permission.USAGE_READ,
        Permission.VOLUME_READ,
        Permission.MEMBER_READ,
        Permission.TOKEN_CREATE,
    }
)

ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.MEMBER: _MEMBER,
    Role.ADMIN: frozenset(Permission) - OWNER_ONLY,
}


def is_allowed(*, role: Role | None, is_owner: bool, permission: Permission) -> bool:
    """True when a caller with ``role`` in the project (or the owner) has ``permission``."""
    if is_owner:
        return True
    if role is None:
        return False
    return permission in ROLE_PERMISSIONS[role]


def roles_with(permission: Permission) -> list[str]:
    """Who holds ``permission``, as the docs' table lists it: roles, then "owner"."""
    holders = [role.value for role in Role if permission in ROLE_PERMISSIONS[role]]
    return [*holders, "owner"]


def markdown_table() -> str:
    """The permission matrix as docs/auth.md shows it (a test keeps the two equal)."""
    lines = ["| Permission | What it allows | member | admin | owner |", "|---|---|:-:|:-:|:-:|"]
    for permission in Permission:
        marks = [
            "✓" if permission in ROLE_PERMISSIONS[Role.MEMBER] else "",
            "✓" if permission in ROLE_PERMISSIONS[Role.ADMIN] else "",
            "✓",
        ]
        lines.append(f"| `{permission.value}` | {DESCRIPTIONS[permission]} | {' | '.join(marks)} |")
    return "\n".join(lines) + "\n"
