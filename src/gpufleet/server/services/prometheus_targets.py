"""The agents Prometheus scrapes, as its HTTP service discovery reads them.

Every node whose agent runs (from acceptance until it is removed) and that has a hostname
becomes one target ``hostname:agent_metrics_port`` labelled with the names of its
project, cluster and node. Those labels are what the per-project query proxy
(``services/prometheus_proxy.py``) filters on, so they come from the store and never
from the agent: an agent cannot claim another project's label.
"""

from __future__ import annotations

from sqlalchemy import select

from gpufleet.core.enums import NodeState
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, NodeRow, ProjectRow
from gpufleet.server.schemas.prometheus import ScrapeTargetGroup

# States in which the node's agent is running and worth scraping.
SCRAPED_NODE_STATES = tuple(
    s.value
    for s in (
        NodeState.ACCEPTANCE,
        NodeState.IN_SERVICE,
        NodeState.CORDONED,
        NodeState.DRAINING,
        NodeState.DRAINED,
        NodeState.REPAIRING,
    )
)
# Prometheus's own label for the target's address; "instance" is set from it.
PROJECT_LABEL = "project"


async def list_scrape_targets(db: Database, *, port: int) -> list[ScrapeTargetGroup]:
    """One group per scraped node, ordered by project, cluster and node name."""
    query = (
        select(ProjectRow.name, ClusterRow.name, NodeRow.name, NodeRow.hostname)
        .join(ClusterRow, NodeRow.cluster_id == ClusterRow.id)
        .join(ProjectRow, ClusterRow.project_id == ProjectRow.id)
        .where(NodeRow.state.in_(SCRAPED_NODE_STATES), NodeRow.hostname.is_not(None))
        .order_by(ProjectRow.name, ClusterRow.name, NodeRow.name)
    )
    async with db.reader() as session:
        rows = (await session.execute(query)).all()
    return [
        ScrapeTargetGroup(
            targets=[f"{_host(hostname)}:{port}"],
            labels={PROJECT_LABEL: project, "cluster": cluster, "node": node},
        )
        for project, cluster, node, hostname in rows
        if hostname
    ]


def _host(hostname: str) -> str:
    # An IPv6 literal needs brackets before the port.
    return f"[{hostname}]" if ":" in hostname and not hostname.startswith("[") else hostname
