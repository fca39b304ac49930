"""core.credentials: what a credential may mint and revoke, as a table."""

from __future__ import annotations

import datetime as dt

import pytest

from gpufleet.core.credentials import Limits, Power, check_mint, check_revoke, inherit_limits
from gpufleet.core.enums import Role
from gpufleet.core.errors import Forbidden

NOW = dt.datetime(2026, 12, 3, tzinfo=dt.UTC)
DAY = NOW + dt.timedelta(days=1)
WEEK = NOW + dt.timedelta(days=7)
M, A = Role.MEMBER, Role.ADMIN


@pytest.mark.parametrize(
    ("holder", "wanted", "field"),
    [
        (Limits("p", M, DAY), Limits("p", M, DAY), None),
        (Limits("p", M, DAY), Limits("p", M, NOW), None),
        (Limits("p", None, None), Limits("p", A, WEEK), None),
        (Limits(None, None, None), Limits(None, None, None), None),
        (Limits("p", M, DAY), Limits("p", A, DAY), "role"),
        (Limits("p", M, DAY), Limits("p", None, DAY), "role"),
        (Limits("p", A, None), Limits("p", None, None), "role"),
        (Limits("p", M, DAY), Limits("p", M, WEEK), "expires_in_days"),
        (Limits("p", M, DAY), Limits("p", M, None), "expires_in_days"),
        (Limits("p", None, None), Limits("q", None, None), "project"),
        (Limits("p", None, None), Limits(None, None, None), "project"),
    ],
)
def test_mint(holder: Limits, wanted: Limits, field: str | None) -> None:
    if field is None:
        check_mint(holder, wanted)
        return
    with pytest.raises(Forbidden) as refused:
        check_mint(holder, wanted)
    assert refused.value.field == field


def test_what_a_request_leaves_out_is_inherited() -> None:
    holder = Limits("p", M, DAY)
    got = inherit_limits(holder, project_id=None, role=None, expires_at=None)
    assert got == holder
    assert inherit_limits(holder, project_id="p", role=M, expires_at=NOW).expires_at == NOW


@pytest.mark.parametrize(
    ("holder", "holder_power", "target", "target_power", "allowed"),
    [
        (Limits("p", M, DAY), Power.MEMBER, Limits("p", M, DAY), Power.MEMBER, True),
        (Limits("p", M, DAY), Power.MEMBER, Limits("p", None, None), Power.ADMIN, False),
        (Limits("p", M, WEEK), Power.MEMBER, Limits("p", None, DAY), Power.MEMBER, True),
        (Limits("p", None, DAY), Power.ADMIN, Limits("p", None, None), Power.ADMIN, False),
        (Limits("p", None, DAY), Power.ADMIN, Limits("p", M, WEEK), Power.MEMBER, False),
        (Limits(None, None, None), Power.OWNER, Limits("p", None, None), Power.ADMIN, True),
        (Limits("p", None, None), Power.ADMIN, Limits(None, None, None), Power.OWNER, False),
    ],
)
def test_revoke(
    holder: Limits, holder_power: Power, target: Limits, target_power: Power, allowed: bool
) -> None:
    def attempt() -> None:
        check_revoke(
            holder=holder, holder_power=holder_power, target=target, target_power=target_power
        )

    if allowed:
        attempt()
    else:
        with pytest.raises(Forbidden, match="revoke"):
            attempt()
