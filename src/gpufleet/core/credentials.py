"""What a credential may do to other credentials: never give more than it holds.

A personal credential (an API token, or a console session opened with one) carries
three limits on top of its user's roles: a project scope, a role cap and an expiry. A
credential can create a token only within all three, and can revoke a token only when
it holds at least that token's power and life. Without these rules a token capped at
``member`` for a day could mint its user an uncapped token that never expires.

Minting compares *caps*, which are durable: a new token's cap never exceeds its
creator's, so promoting the user later cannot lift the new token above the one that
made it. Revoking compares *power now* (the cap applied to the user's current role),
because revocation happens once, against what the target can do at that moment.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import IntEnum

from gpufleet.core.enums import Role
from gpufleet.core.errors import Forbidden


class Power(IntEnum):
    """What a credential can do in one project, weakest first."""

    NONE = 0
    MEMBER = 1
    ADMIN = 2
    OWNER = 3  # the platform owner's global power (an unscoped, uncapped owner token)


def power_of(role: Role | None) -> Power:
    if role is None:
        return Power.NONE
    return Power.ADMIN if role is Role.ADMIN else Power.MEMBER


_CAP_RANK: dict[Role | None, int] = {Role.MEMBER: 0, Role.ADMIN: 1, None: 2}


def _cap_name(role: Role | None) -> str:
    return f"capped at {role.value}" if role is not None else "not capped"


def _life_name(expires_at: dt.datetime | None) -> str:
    return "never expires" if expires_at is None else f"expires at {expires_at.isoformat()}"


@dataclass(frozen=True)
class Limits:
    """A credential's own limits; None means "none" for each."""

    project_id: str | None  # scoped to this project, or not scoped
    role: Role | None  # the role cap
    expires_at: dt.datetime | None


def inherit_limits(
    holder: Limits,
    *,
    project_id: str | None,
    role: Role | None,
    expires_at: dt.datetime | None,
) -> Limits:
    """The limits of a token ``holder`` asks for, what it left out taken from ``holder``:
    a request that names no project, role or expiry gets the creator's."""
    return Limits(
        project_id=project_id if project_id is not None else holder.project_id,
        role=role if role is not None else holder.role,
        expires_at=expires_at if expires_at is not None else holder.expires_at,
    )


def check_mint(holder: Limits, wanted: Limits) -> None:
    """Raise ``Forbidden`` (naming the limit) when ``wanted`` exceeds ``holder``."""
    if holder.project_id is not None and wanted.project_id != holder.project_id:
        raise Forbidden(
            "this token is scoped to one project; it cannot create a token for another "
            "project or for none",
            field="project",
        )
    if _CAP_RANK[wanted.role] > _CAP_RANK[holder.role]:
        raise Forbidden(
            f"this token is {_cap_name(holder.role)}; it cannot create a token that is "
            f"{_cap_name(wanted.role)} (leave role out to get this token's cap)",
            field="role",
        )
    if holder.expires_at is not None and (
        wanted.expires_at is None or wanted.expires_at > holder.expires_at
    ):
        raise Forbidden(
            f"this token {_life_name(holder.expires_at)}; it cannot create a token that "
            f"outlives it (leave expires_in_days out to get this token's expiry)",
            field="expires_in_days",
        )


def check_revoke(
    *, holder: Limits, holder_power: Power, target: Limits, target_power: Power
) -> None:
    """Raise ``Forbidden`` unless the holder has at least the target's power and life.

    ``*_power``: what each credential can do now in the target's project (for an
    unscoped target, everywhere it reaches).
    """
    if target.project_id is None and holder.project_id is not None:
        raise Forbidden(
            "this token is scoped to one project; it cannot revoke a token that is not",
            field="token_id",
        )
    if holder_power < target_power:
        raise Forbidden(
            f"this token has {holder_power.name.lower()} power here and the token to revoke "
            f"has {target_power.name.lower()} power; revoke it with a credential at least as "
            "strong (an uncapped token, or a console login)",
            field="token_id",
        )
    if holder.expires_at is not None and (
        target.expires_at is None or target.expires_at > holder.expires_at
    ):
        raise Forbidden(
            f"this token {_life_name(holder.expires_at)} and the token to revoke "
            f"{_life_name(target.expires_at)}; a token cannot revoke one that outlives it",
            field="token_id",
        )
