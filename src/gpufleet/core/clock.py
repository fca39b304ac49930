"""Time. Everything gpufleet stores is a timezone-aware UTC datetime.

Code that needs "now" takes a ``Clock`` so tests can move time instead of sleeping.
"""

from __future__ import annotations

import datetime as dt
from typing import Protocol


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime) -> dt.datetime:
    """Make a datetime aware UTC; SQLite returns naive datetimes that are UTC by contract."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


class Clock(Protocol):
    def now(self) -> dt.datetime: ...


class SystemClock:
    def now(self) -> dt.datetime:
        return utcnow()


class FakeClock:
    """A clock that moves only when told to."""

    def __init__(self, start: dt.datetime | None = None) -> None:
        self._now = start or dt.datetime(2026, 1, 1, tzinfo=dt.UTC)

    def now(self) -> dt.datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += dt.timedelta(seconds=seconds)
