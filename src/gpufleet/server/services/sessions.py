"""Console sessions: a random secret in an HttpOnly cookie, its SHA-256 in the store.

A session authenticates the API like a token (same ``Caller``, same permission checks).
Because a browser sends cookies on its own, a state-changing request authenticated by
the cookie must also carry the session's CSRF token in a header. That token is an HMAC
of the session secret: only someone holding the cookie can compute it, a cross-site page
can neither read the cookie nor the ``/auth/me`` answer, and nothing extra is stored.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.enums import Role
from gpufleet.core.errors import Forbidden, InvalidInput, Unauthorized
from gpufleet.core.ids import new_id
from gpufleet.server.db.tables import ApiTokenRow, UserRow, WebSessionRow
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import (
    Caller,
    generate_token,
    hash_token,
    load_memberships,
    resolve_caller,
)

SESSION_PREFIX = "gpfs_"  # a prefix, not a secret
SESSION_COOKIE = "gpufleet_session"
CSRF_COOKIE = "gpufleet_csrf"
CSRF_HEADER = "X-CSRF-Token"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


@dataclass(frozen=True)
class CreatedSession:
    secret: str  # goes into the cookie, never into the store or a log
    session_id: str
    expires_at: dt.datetime

    @property
    def csrf_token(self) -> str:
        return csrf_token_for(self.secret)


def csrf_token_for(secret: str) -> str:
    """The CSRF token of a session: HMAC-SHA256 keyed by the session secret."""
    return hmac.new(secret.encode(), b"gpufleet-csrf-v1", hashlib.sha256).hexdigest()


def check_csrf(*, secret: str, header: str | None) -> None:
    """Raise ``Forbidden`` unless ``header`` is this session's CSRF token."""
    if not header:
        raise Forbidden(
            f"a request authenticated by the session cookie must send the {CSRF_HEADER} "
            f"header (the value of the {CSRF_COOKIE} cookie, or csrf_token from /auth/me)",
            field=CSRF_HEADER,
        )
    if not hmac.compare_digest(header.encode(), csrf_token_for(secret).encode()):
        raise Forbidden(f"the {CSRF_HEADER} header does not match this session", field=CSRF_HEADER)


async def create_web_session(
    session: AsyncSession,
    *,
    user: UserRow,
    now: dt.datetime,
    lifetime_s: float,
    source_ip: str | None,
) -> CreatedSession:
    secret = generate_token(SESSION_PREFIX)
    row = WebSessionRow(
        id=new_id(),
        user_id=user.id,
        token_hash=hash_token(secret),
        source_ip=source_ip,
        created_at=now,
        expires_at=now + dt.timedelta(seconds=lifetime_s),
        revoked_at=None,
        last_used_at=None,
    )
    session.add(row)
    record_audit(
        session,
        actor=f"user:{user.name}",
        action="session.create",
        object_type="web_session",
        object_id=row.id,
        project_id=None,
        source_ip=source_ip,
        detail={"expires_at": row.expires_at.isoformat()},
    )
    return CreatedSession(secret=secret, session_id=row.id, expires_at=row.expires_at)


async def create_web_session_from_token(
    session: AsyncSession,
    *,
    token: str,
    now: dt.datetime,
    lifetime_s: float,
    source_ip: str | None,
) -> CreatedSession:
    """A console login with a personal API token (the console's token form).

    The session sees exactly what the token may see: it keeps the token's project and
    role, ends when the token is revoked, and never outlives the token's expiry.
    Raises ``Unauthorized`` for anything but a valid API token (node tokens included).
    """
    caller = await resolve_caller(session, token=token, source_ip=source_ip)
    user = await session.get(UserRow, caller.user_id)
    token_row = await session.get(ApiTokenRow, caller.token_id)
    if user is None or token_row is None:  # deleted between the two reads
        raise Unauthorized("invalid or revoked token")
    expires_at = now + dt.timedelta(seconds=lifetime_s)
    if token_row.expires_at is not None:
        expires_at = min(expires_at, token_row.expires_at)
    secret = generate_token(SESSION_PREFIX)
    row = WebSessionRow(
        id=new_id(),
        user_id=user.id,
        token_hash=hash_token(secret),
        source_ip=source_ip,
        api_token_id=token_row.id,
        created_at=now,
        expires_at=expires_at,
        revoked_at=None,
        last_used_at=None,
    )
    session.add(row)
    record_audit(
        session,
        actor=f"user:{user.name}",
        action="session.create",
        object_type="web_session",
        object_id=row.id,
        project_id=token_row.project_id,
        source_ip=source_ip,
        detail={
            "expires_at": expires_at.isoformat(),
            "via": "api_token",
            "api_token_id": token_row.id,
            "project_id": token_row.project_id,
            "role": token_row.role,
        },
    )
    return CreatedSession(secret=secret, session_id=row.id, expires_at=expires_at)


async def resolve_session_caller(
    session: AsyncSession, *, secret: str, now: dt.datetime, source_ip: str | None
) -> Caller:
    """The caller behind a session cookie, or ``Unauthorized``."""
    if not secret.startswith(SESSION_PREFIX):
        raise Unauthorized("the session cookie is not a gpufleet session; log in again")
    row = await session.scalar(
        select(WebSessionRow).where(WebSessionRow.token_hash == hash_token(secret))
    )
    if row is None or row.revoked_at is not None:
        raise Unauthorized("session ended; log in again")
    if row.expires_at <= now:
        raise Unauthorized("session expired; log in again")
    user = await session.get(UserRow, row.user_id)
    if user is None:
        raise Unauthorized("the session's user no longer exists")
    token_project_id: str | None = None
    token_role: Role | None = None
    # A login through the IdP is the user's full session; one opened with an API token
    # is that token's stand-in, with its scope, cap and expiry.
    token_expires_at: dt.datetime | None = None
    if row.api_token_id is not None:
        # Opened with an API token: the token's scope, for as long as the token is good.
        token = await session.get(ApiTokenRow, row.api_token_id)
        if token is None or token.revoked_at is not None:
            raise Unauthorized("the API token this session was opened with was revoked")
        if token.expires_at is not None and token.expires_at <= now:
            raise Unauthorized("the API token this session was opened with expired")
        token_project_id = token.project_id
        token_role = Role(token.role) if token.role else None
        token_expires_at = token.expires_at
    if row.last_used_at is None or (now - row.last_used_at) > dt.timedelta(minutes=1):
        await session.execute(
            update(WebSessionRow).where(WebSessionRow.id == row.id).values(last_used_at=now)
        )
    return Caller(
        user_id=user.id,
        user_name=user.name,
        is_owner=user.is_owner,
        token_id=row.id,
        token_project_id=token_project_id,
        token_role=token_role,
        memberships=await load_memberships(session, user_id=user.id),
        source_ip=source_ip,
        auth_method="session",
        token_expires_at=token_expires_at,
    )


async def get_session_expiry(session: AsyncSession, *, session_id: str) -> dt.datetime | None:
    row = await session.get(WebSessionRow, session_id)
    return row.expires_at if row is not None else None


async def revoke_web_session(session: AsyncSession, *, caller: Caller, now: dt.datetime) -> None:
    """End the caller's console session (logout); API tokens are revoked elsewhere."""
    if caller.auth_method != "session":
        raise InvalidInput(
            "logout ends a console session; this request came with an API token "
            "(revoke a token with DELETE /api/v1/tokens/{id})"
        )
    await session.execute(
        update(WebSessionRow)
        .where(WebSessionRow.id == caller.token_id, WebSessionRow.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    record_audit(
        session,
        actor=caller.actor,
        action="session.revoke",
        object_type="web_session",
        object_id=caller.token_id,
        project_id=None,
        source_ip=caller.source_ip,
    )
