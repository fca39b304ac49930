"""Who may do what, as data. The server enforces it through one dependency per route.

The full RBAC/OIDC work extends this matrix; routes only ever ask ``is_allowed``.
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
    TOKEN_CREATE = "token.create"  # noqa: S105 - a permission name
    MEMBER_MANAGE = "member.manage"
    REPAIR_READ = "repair.read"
    REPAIR_APPROVE = "repair.approve"
    POLICY_MANAGE = "policy.manage"  # the project's repair policy; the breaker reset
    CHECK_RUN = "check.run"


_READ = frozenset(
    {
        Permission.PROJECT_READ,
        Permission.CLUSTER_READ,
        Permission.NODE_READ,
        Permission.EVENT_READ,
        Permission.FINDING_READ,
        Permission.REPAIR_READ,
    }
)

ROLE_PERMISSIONS: dict[Role, frozenset[Permission]] = {
    Role.MEMBER: _READ | {Permission.CHECK_RUN, Permission.TOKEN_CREATE},
    Role.ADMIN: frozenset(Permission),
}

# Actions outside any one project: only the platform owner has them.
GLOBAL_OWNER_ONLY = frozenset({"project.create", "project.list_all", "user.create"})


def is_allowed(*, role: Role | None, is_owner: bool, permission: Permission) -> bool:
    """True when a caller with ``role`` in the project (or the owner) has ``permission``."""
    if is_owner:
        return True
    if role is None:
        return False
    return permission in ROLE_PERMISSIONS[role]
