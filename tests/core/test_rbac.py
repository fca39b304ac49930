"""RBAC as data: members read, admins do everything in their project, the owner everything."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.enums import Role
from gpufleet.core.rbac import (
    OWNER_ONLY,
    ROLE_PERMISSIONS,
    Permission,
    is_allowed,
    markdown_table,
    roles_with,
)

MEMBER_MAY = {
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


def test_every_role_has_a_row() -> None:
    assert set(ROLE_PERMISSIONS) == set(Role)


def test_admin_has_every_project_permission() -> None:
    assert ROLE_PERMISSIONS[Role.ADMIN] == frozenset(Permission) - OWNER_ONLY
    assert {
        Permission.PROJECT_CREATE,
        Permission.USER_READ,
        Permission.USER_MANAGE,
        Permission.STACK_MANAGE,
        Permission.METRICS_READ,
    } == OWNER_ONLY


def test_member_permissions_are_a_subset_of_admin() -> None:
    assert ROLE_PERMISSIONS[Role.MEMBER] < ROLE_PERMISSIONS[Role.ADMIN]


@pytest.mark.parametrize("permission", list(Permission))
def test_member(permission: Permission) -> None:
    allowed = is_allowed(role=Role.MEMBER, is_owner=False, permission=permission)
    assert allowed is (permission in MEMBER_MAY)


@pytest.mark.parametrize(
    "permission",
    [
        Permission.CLUSTER_CREATE,
        Permission.CLUSTER_DELETE,
        Permission.NODE_ACTION,
        Permission.MEMBER_MANAGE,
        Permission.REPAIR_APPROVE,
        Permission.POLICY_MANAGE,
        Permission.VOLUME_MANAGE,
        Permission.TOKEN_MANAGE,
        Permission.AUDIT_READ,
    ],
)
def test_member_cannot_change_the_control_plane(permission: Permission) -> None:
    assert not is_allowed(role=Role.MEMBER, is_owner=False, permission=permission)
    assert is_allowed(role=Role.ADMIN, is_owner=False, permission=permission)


@pytest.mark.parametrize("permission", list(Permission))
def test_no_role_means_nothing_and_owner_means_everything(permission: Permission) -> None:
    assert not is_allowed(role=None, is_owner=False, permission=permission)
    assert is_allowed(role=None, is_owner=True, permission=permission)
    assert is_allowed(role=Role.MEMBER, is_owner=True, permission=permission)


@pytest.mark.parametrize("permission", sorted(OWNER_ONLY))
def test_owner_only_permissions_are_no_role_s(permission: Permission) -> None:
    for role in Role:
        assert not is_allowed(role=role, is_owner=False, permission=permission)
    assert roles_with(permission) == ["owner"]


def test_roles_with_lists_roles_then_owner() -> None:
    assert roles_with(Permission.CLUSTER_READ) == ["admin", "member", "owner"]
    assert roles_with(Permission.CLUSTER_DELETE) == ["admin", "owner"]


def test_the_docs_show_this_matrix() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs" / "auth.md").read_text()
    start = docs.index("<!-- rbac-table")
    table = docs[docs.index("\n", start) + 1 : docs.index("<!-- /rbac-table -->")]
    assert table == markdown_table(), "regenerate docs/auth.md's table: core.rbac.markdown_table()"
