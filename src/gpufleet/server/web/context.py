"""What every cluster page shows around its tab: the cluster, its project, what the
viewer may do there, and the tab bar. Built from the same service functions as the API."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.models import Cluster, Project
from gpufleet.core.rbac import Permission
from gpufleet.server.services.auth import Caller
from gpufleet.server.services.console import load_cluster_header
from gpufleet.server.web.session import WebUser


@dataclass(frozen=True)
class Tab:
    slug: str
    label: str


TABS = (
    Tab("health", "Health"),
    Tab("utilization", "Utilization"),
    Tab("reliability", "Reliability"),
    Tab("events", "Events"),
    Tab("configuration", "Configuration"),
    Tab("nodes", "Nodes"),
    Tab("repairs", "Repairs"),
    Tab("checks", "Checks"),
    Tab("rollouts", "Rollouts"),
)


def permissions(caller: Caller, project_id: str) -> dict[str, bool]:
    """What the page offers; the services check again on every action."""
    return {
        "act": caller.can(Permission.NODE_ACTION, project_id),
        "approve": caller.can(Permission.REPAIR_APPROVE, project_id),
        "edit": caller.can(Permission.CLUSTER_CREATE, project_id),
        "run_check": caller.can(Permission.CHECK_RUN, project_id),
        "members": caller.can(Permission.MEMBER_READ, project_id),
        "manage_members": caller.can(Permission.MEMBER_MANAGE, project_id),
        "policy": caller.can(Permission.POLICY_MANAGE, project_id),
    }


@dataclass(frozen=True)
class ClusterPage:
    cluster: Cluster  # without node counts: tabs that need them load their own
    project: Project
    can: dict[str, bool]
    pending_repairs: int
    versions: dict[str, str]

    def context(self, user: WebUser, tab: str, **extra: Any) -> dict[str, Any]:
        return {
            "user": user,
            "cluster": self.cluster,
            "project": self.project,
            "can": self.can,
            "tabs": TABS,
            "tab": tab,
            "pending_repairs": self.pending_repairs,
            "versions": self.versions,
            "base": f"/clusters/{self.cluster.id}",
            **extra,
        }


async def load_cluster_page(
    session: AsyncSession, *, user: WebUser, cluster_id: str
) -> ClusterPage:
    """NotFound for a cluster the viewer cannot see (the same answer as a missing one)."""
    header = await load_cluster_header(session, caller=user.caller, cluster_id=cluster_id)
    return ClusterPage(
        cluster=header.cluster,
        project=header.project,
        can=permissions(user.caller, header.cluster.project_id),
        pending_repairs=header.pending_repairs,
        versions=header.versions,
    )
