"""Named leases in the store: which replica runs a loop, until when.

Portable compare-and-swap on one row (works the same on SQLite and PostgreSQL): take a
lease that is free, expired or already ours; renew only while our token still holds it.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import CursorResult, delete, select, update
from sqlalchemy.exc import IntegrityError

from gpufleet.core.ids import new_id
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import LeaseRow


async def acquire_lease(
    db: Database, *, name: str, owner: str, ttl_s: float, now: dt.datetime
) -> str | None:
    """Take or renew the lease ``name`` for ``owner``. Returns the lease token, or None
    when another live owner holds it."""
    expires = now + dt.timedelta(seconds=ttl_s)
    async with db.transaction() as session:
        row = await session.scalar(select(LeaseRow).where(LeaseRow.name == name))
        if row is None:
            token = new_id()
            session.add(
                LeaseRow(name=name, owner=owner, token=token, acquired_at=now, expires_at=expires)
            )
            try:
                await session.flush()
            except IntegrityError:
                return None  # another replica inserted it first
            return token
        if row.owner != owner and row.expires_at > now:
            return None
        token = row.token if row.owner == owner else new_id()
        result = await session.execute(
            update(LeaseRow)
            .where(LeaseRow.name == name, LeaseRow.token == row.token)
            .values(
                owner=owner,
                token=token,
                expires_at=expires,
                acquired_at=row.acquired_at if row.owner == owner else now,
            )
        )
        assert isinstance(result, CursorResult)
        return token if result.rowcount == 1 else None


async def release_lease(db: Database, *, name: str, token: str) -> None:
    async with db.transaction() as session:
        await session.execute(
            delete(LeaseRow).where(LeaseRow.name == name, LeaseRow.token == token)
        )


async def lease_holder(db: Database, *, name: str) -> tuple[str, dt.datetime] | None:
    async with db.session() as session:
        row = await session.scalar(select(LeaseRow).where(LeaseRow.name == name))
        return None if row is None else (row.owner, row.expires_at)
