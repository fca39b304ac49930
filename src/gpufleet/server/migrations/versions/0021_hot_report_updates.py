"""hot report updates: the node and gpu tables every agent report rewrites index no
column a report writes, and on PostgreSQL leave room in each page, so a report's
updates are heap-only (no index entries, old versions pruned in place)

``ix_node_last_report_at`` made every report's node update write all eight of the node
table's indexes (the health loop's silence query reads the node table whole instead);
``ix_gpu_node_id`` doubled ``uq_gpu_node_uuid``, whose first column is the node.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLES = ("node", "gpu")
_FILLFACTOR = 50  # tables.HOT_FILLFACTOR when this was written


def upgrade() -> None:
    op.drop_index("ix_node_last_report_at", table_name="node")
    op.drop_index("ix_gpu_node_id", table_name="gpu")
    if op.get_bind().dialect.name == "postgresql":
        for table in _TABLES:  # rows written from now on; old pages as they are rewritten
            op.execute(f"ALTER TABLE {table} SET (fillfactor = {_FILLFACTOR})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in _TABLES:
            op.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    op.create_index("ix_gpu_node_id", "gpu", ["node_id"])
    op.create_index("ix_node_last_report_at", "node", ["last_report_at"])
