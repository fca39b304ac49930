"""Findings (read side). Detection and folding arrive with the passive-health work."""

from __future__ import annotations

from sqlalchemy import Select, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import FindingSource, Severity
from gpufleet.core.errors import InvalidInput
from gpufleet.core.ids import is_id
from gpufleet.core.models import Finding, Page
from gpufleet.server.db.tables import ClusterRow, FindingRow
from gpufleet.server.services.auth import Caller


def finding_row_to_finding(row: FindingRow) -> Finding:
    return Finding(
        id=row.id,
        cluster_id=row.cluster_id,
        node_id=row.node_id,
        gpu_uuid=row.gpu_uuid,
        gpu_index=row.gpu_index,
        pci_bus_id=row.pci_bus_id,
        component=row.component,
        signature_id=row.signature_id,
        title=row.title,
        severity=Severity(row.severity),
        source=FindingSource(row.source),
        evidence=row.evidence,
        count=row.count,
        first_seen=row.first_seen,
        last_seen=row.last_seen,
        cleared_at=row.cleared_at,
    )


async def list_findings(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str | None = None,
    node_id: str | None = None,
    gpu_uuid: str | None = None,
    signature_id: str | None = None,
    is_open: bool | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> Page[Finding]:
    """Newest first; ``cursor`` is the last finding id of the previous page."""
    if cursor is not None and not is_id(cursor):
        raise InvalidInput("cursor is not one this server issued", field="cursor")
    query: Select[FindingRow] = select(FindingRow).join(
        ClusterRow, ClusterRow.id == FindingRow.cluster_id
    )
    visible = caller.visible_project_ids()
    if visible is not None:
        query = query.where(ClusterRow.project_id.in_(visible))
    if cluster_id:
        query = query.where(FindingRow.cluster_id == cluster_id)
    if node_id:
        query = query.where(FindingRow.node_id == node_id)
    if gpu_uuid:
        query = query.where(FindingRow.gpu_uuid == gpu_uuid)
    if signature_id:
        query = query.where(FindingRow.signature_id == signature_id)
    if is_open is True:
        query = query.where(FindingRow.cleared_at.is_(None))
    elif is_open is False:
        query = query.where(FindingRow.cleared_at.is_not(None))
    if cursor:
        query = query.where(FindingRow.id < cursor)
    rows = (await session.scalars(query.order_by(FindingRow.id.desc()).limit(limit + 1))).all()
    items = [finding_row_to_finding(r) for r in rows[:limit]]
    return Page[Finding](items=items, next_cursor=items[-1].id if len(rows) > limit else None)
