"""Maintenance windows and rollout pacing for stack migrations
(``gpufleet clusters migrate CLUSTER --to STACK --window ... --tz ...``).

A **window** says when a migration may take nodes out of service. It is either one-off
(``start`` plus a duration) or recurring (a local start time ``at`` on some weekdays, or
every day, in an IANA time zone ``tz``). Recurring openings are computed in the zone's
local time, so "sat 02:00" stays 02:00 on the wall clock across daylight-saving changes;
the duration is always elapsed real time (a 2 h window over a fall-back night ends two
real hours later, which the wall clock shows as one hour later).

Daylight-saving rules, decided here once:

- A local start time that does not exist (it falls in a spring-forward gap, e.g. 02:30
  in Europe/Berlin on 2026-03-29) starts at the first instant after the gap (03:00 local
  time that day): the window opens as close to the asked time as the clock allows.
- A local start time that happens twice (a fall-back night, e.g. 02:30 on 2026-10-25 in
  Europe/Berlin) opens once, at its first occurrence (``fold=0``).

**Max unavailable** caps how many nodes are out of service at once during a migration:
a count (``"2"``) or a share of the cluster (``"25%"``, rounded down but never below one
node, like Kubernetes' ``maxUnavailable``). ``next_batch`` applies it.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from typing import Annotated, Self
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    ValidationError,
    field_validator,
    model_validator,
)

from gpufleet.core.errors import InvalidInput

WEEKDAYS: tuple[str, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MIN_DURATION_S = 60  # shorter than a node's drain is no window
MAX_DURATION_S = 7 * 86400  # longer is not a window but a policy change
_DAY_S = 86400
# How far around "now" the recurring search looks: a week of openings, the longest
# duration, and a day either side for zones whose offset moves the local date.
_SEARCH_DAYS = 9

WINDOW_FORMS = (
    "one-off '2026-12-06T02:00/2h' (local time in the zone; an offset such as "
    "'2026-12-06T02:00+01:00/2h' is honoured), recurring 'sat 02:00/4h', "
    "'mon,wed,fri 22:00/3h' or 'daily 01:00/90m'; durations like '90m', '2h', '1h30m', "
    "'1d' (at least 1m, at most 7d)"
)
_AT_RE = re.compile(r"^(\d{1,2}):(\d{2})$")
_DURATION_RE = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_ONE_OFF_RE = re.compile(r"^\d{4}-\d{2}-\d{2}[T ]")
_MAX_UNAVAILABLE_RE = re.compile(r"^(\d+)\s*(%?)$")


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(
            f"unknown time zone {name!r}: give an IANA name such as 'UTC' or 'Europe/Berlin'"
        ) from None


def format_duration(seconds: int) -> str:
    """``5400`` → ``"1h30m"``; the form ``parse_duration`` reads back."""
    parts: list[str] = []
    for unit, size in (("d", _DAY_S), ("h", 3600), ("m", 60), ("s", 1)):
        n, seconds = divmod(seconds, size)
        if n:
            parts.append(f"{n}{unit}")
    return "".join(parts) or "0s"


def parse_duration(text: str) -> int:
    """``"90m"``, ``"2h"``, ``"1h30m"``, ``"1d"`` → seconds. Raises ``InvalidInput``
    naming the text when it is not such a form or is outside 1m..7d."""
    match = _DURATION_RE.match(text.strip().lower())
    if not text.strip() or match is None:
        raise InvalidInput(
            f"bad duration {text!r}: write it like '90m', '2h', '1h30m' or '1d'",
            field="window",
        )
    d, h, m, s = (int(g) if g else 0 for g in match.groups())
    seconds = d * _DAY_S + h * 3600 + m * 60 + s
    if not MIN_DURATION_S <= seconds <= MAX_DURATION_S:
        raise InvalidInput(
            f"duration {text!r} is out of range: a window lasts at least 1m and at most 7d",
            field="window",
        )
    return seconds


def _resolve_local(naive: dt.datetime, zone: ZoneInfo) -> dt.datetime:
    """The UTC instant of a local wall-clock time in ``zone``: its first occurrence when
    it happens twice, the end of the gap when it does not happen (see module doc)."""
    first = naive.replace(tzinfo=zone, fold=0).astimezone(dt.UTC)
    if first.astimezone(zone).replace(tzinfo=None) == naive:
        return first
    # In a gap: fold=0 and fold=1 map it with the offsets either side of the transition,
    # so the transition lies between them. Find it (to the second) by bisection.
    other = naive.replace(tzinfo=zone, fold=1).astimezone(dt.UTC)
    lo, hi = min(first, other), max(first, other)
    after = hi.astimezone(zone).utcoffset()
    while (hi - lo) > dt.timedelta(seconds=1):
        mid = lo + dt.timedelta(seconds=(hi - lo).total_seconds() // 2)
        if mid.astimezone(zone).utcoffset() == after:
            hi = mid
        else:
            lo = mid
    return hi


class Window(BaseModel):
    """When a migration may take nodes out of service. Exactly one of ``start``
    (one-off) and ``at`` (recurring) is set. Stored as JSON and returned by the API."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    start: dt.datetime | None = None  # one-off: its start, stored in UTC
    days: list[str] = []  # recurring: weekdays mon..sun in week order; empty: every day
    at: str | None = None  # recurring: local start time "HH:MM" in tz
    tz: str = "UTC"  # IANA zone: where "at" is read, and how the window is shown
    duration_s: int  # elapsed real time from each start

    @field_validator("start")
    @classmethod
    def _start_aware(cls, value: dt.datetime | None) -> dt.datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(
                f"start {value.isoformat()} has no time zone: give an offset or a zone"
            )
        return value.astimezone(dt.UTC)

    @field_validator("days")
    @classmethod
    def _days_known(cls, value: list[str]) -> list[str]:
        wanted = {d.strip().lower() for d in value}
        unknown = sorted(wanted - set(WEEKDAYS))
        if unknown:
            raise ValueError(
                f"unknown weekday {', '.join(map(repr, unknown))}: use {','.join(WEEKDAYS)}"
            )
        return [d for d in WEEKDAYS if d in wanted]

    @field_validator("at")
    @classmethod
    def _at_clock(cls, value: str | None) -> str | None:
        if value is None:
            return None
        match = _AT_RE.match(value.strip())
        if match is None or int(match[1]) > 23 or int(match[2]) > 59:
            raise ValueError(f"bad start time {value!r}: write it as HH:MM, e.g. 02:00")
        return f"{int(match[1]):02d}:{match[2]}"

    @field_validator("tz")
    @classmethod
    def _tz_known(cls, value: str) -> str:
        _zone(value)
        return value

    @field_validator("duration_s")
    @classmethod
    def _duration_range(cls, value: int) -> int:
        if not MIN_DURATION_S <= value <= MAX_DURATION_S:
            raise ValueError(
                f"duration {value}s is out of range: a window lasts at least 1m and at most 7d"
            )
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> Self:
        if (self.start is None) == (self.at is None):
            raise ValueError("a window needs exactly one of 'start' (one-off) and 'at' (recurring)")
        if self.start is not None and self.days:
            raise ValueError("'days' is for a recurring window ('at'), not a one-off 'start'")
        if self.at is not None and self.duration_s > self._min_gap_s():
            raise ValueError(
                f"duration {format_duration(self.duration_s)} is longer than the "
                f"{format_duration(self._min_gap_s())} between two openings of "
                f"'{self._schedule()}': openings would overlap"
            )
        return self

    def _min_gap_s(self) -> int:
        indices = [WEEKDAYS.index(d) for d in self.days] or list(range(7))
        gaps = [(b - a) % 7 or 7 for a, b in zip(indices, indices[1:] + indices[:1], strict=True)]
        return min(gaps) * _DAY_S

    def _schedule(self) -> str:
        if not self.days or len(self.days) == len(WEEKDAYS):
            return f"daily {self.at}"
        return f"{','.join(self.days)} {self.at}"

    def _openings(self, at: str, around: dt.datetime, offsets: range) -> list[dt.datetime]:
        """UTC starts of the recurring openings at local time ``at`` on the local dates
        ``around``'s date plus each of ``offsets`` (in days), in that order."""
        zone = _zone(self.tz)
        today = around.astimezone(zone).date()
        clock = dt.time.fromisoformat(at)
        starts: list[dt.datetime] = []
        for k in offsets:
            day = today + dt.timedelta(days=k)
            if self.days and WEEKDAYS[day.weekday()] not in self.days:
                continue
            starts.append(_resolve_local(dt.datetime.combine(day, clock), zone))
        return starts

    def open_at(self, now: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
        """The (start, end) in UTC of the opening that contains ``now`` (start inclusive,
        end exclusive), or None while the window is closed. ``now`` must be aware."""
        now = _aware(now)
        length = dt.timedelta(seconds=self.duration_s)
        if self.at is None:
            if self.start is None:  # pragma: no cover - the model validator forbids it
                return None
            end = self.start + length
            return (self.start, end) if self.start <= now < end else None
        # Latest start first: on a day DST shortens, a full-gap opening may touch the next.
        for start in self._openings(self.at, now, range(1, -_SEARCH_DAYS, -1)):
            if start <= now < start + length:
                return start, start + length
        return None

    def next_opening(self, now: dt.datetime) -> tuple[dt.datetime, dt.datetime] | None:
        """The opening that contains ``now``, else the next one to come, as (start, end)
        in UTC; None for a one-off window that has ended."""
        now = _aware(now)
        current = self.open_at(now)
        if current is not None:
            return current
        length = dt.timedelta(seconds=self.duration_s)
        if self.at is None:
            if self.start is None or now >= self.start:
                return None
            return self.start, self.start + length
        for start in self._openings(self.at, now, range(-1, _SEARCH_DAYS)):
            if start > now:
                return start, start + length
        raise AssertionError("a recurring window opens at least once a week")  # pragma: no cover

    def describe(self) -> str:
        """Text for people: ``"sat 02:00 for 4h (Europe/Berlin)"``,
        ``"2026-12-06 02:00 UTC for 2h"`` (a one-off shown in its zone's local time)."""
        length = format_duration(self.duration_s)
        if self.start is not None:
            local = self.start.astimezone(_zone(self.tz))
            return f"{local:%Y-%m-%d %H:%M} {self.tz} for {length}"
        return f"{self._schedule()} for {length} ({self.tz})"


def _aware(now: dt.datetime) -> dt.datetime:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware (a naive time has no instant)")
    return now


def _validation_message(exc: ValidationError) -> str:
    messages = []
    for error in exc.errors():
        ctx = error.get("ctx") or {}
        cause = ctx.get("error")
        messages.append(str(cause) if cause is not None else error["msg"])
    return "; ".join(messages)


def parse_window(text: str, *, tz: str = "UTC") -> Window:
    """A ``Window`` from the CLI/API text forms (see ``WINDOW_FORMS``), a one-off start
    without an offset read as local time in ``tz``. Raises ``InvalidInput`` saying what
    was wrong and which forms are accepted."""
    try:
        zone = _zone(tz)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="tz") from None
    raw = text.strip()
    when, slash, length = raw.rpartition("/")
    if not slash or not when.strip():
        raise InvalidInput(
            f"window {text!r} has no '/duration': accepted forms are {WINDOW_FORMS}",
            field="window",
        )
    duration_s = parse_duration(length)
    when = when.strip()
    try:
        if _ONE_OFF_RE.match(when):
            try:
                start = dt.datetime.fromisoformat(when)
            except ValueError:
                raise InvalidInput(
                    f"bad start {when!r}: write it as YYYY-MM-DDTHH:MM; "
                    f"accepted forms are {WINDOW_FORMS}",
                    field="window",
                ) from None
            if start.tzinfo is None:
                start = _resolve_local(start, zone)
            return Window(start=start, tz=tz, duration_s=duration_s)
        parts = when.split()
        if len(parts) != 2:
            raise InvalidInput(
                f"bad window {text!r}: expected days then a start time before the '/'; "
                f"accepted forms are {WINDOW_FORMS}",
                field="window",
            )
        day_text, at = parts
        days = [] if day_text.lower() == "daily" else day_text.split(",")
        if any(not d.strip() for d in days):
            raise InvalidInput(
                f"bad days {day_text!r}: a comma list of {','.join(WEEKDAYS)}, or 'daily'",
                field="window",
            )
        return Window(days=days, at=at, tz=tz, duration_s=duration_s)
    except ValidationError as exc:
        raise InvalidInput(
            f"bad window {text!r}: {_validation_message(exc)}", field="window"
        ) from None


def _check_max_unavailable(text: str) -> str:
    match = _MAX_UNAVAILABLE_RE.match(text.strip())
    if match is None:
        raise ValueError(
            f"bad max unavailable {text!r}: give a node count such as '2' or a share such as '25%'"
        )
    number, percent = int(match[1]), match[2]
    if number < 1:
        raise ValueError(f"max unavailable {text!r} must be at least 1 node or 1%")
    if percent and number > 100:
        raise ValueError(f"max unavailable {text!r} is over 100%")
    return f"{number}{percent}"


def parse_max_unavailable(text: str) -> str:
    """The canonical spec (``"2"`` or ``"25%"``) from user text. Raises ``InvalidInput``
    for zero, negatives, over 100 %, or anything else."""
    try:
        return _check_max_unavailable(text)
    except ValueError as exc:
        raise InvalidInput(str(exc), field="max_unavailable") from None


# For pydantic request bodies and stored settings: a string validated as above.
MaxUnavailable = Annotated[str, AfterValidator(_check_max_unavailable)]


def max_unavailable_count(spec: str, total: int) -> int:
    """How many of ``total`` nodes may be out of service at once: the count as given, or
    the share rounded down but never below 1, so a migration always makes progress.
    A count is not capped at ``total`` (taking more than there are is just all)."""
    canonical = parse_max_unavailable(spec)
    if canonical.endswith("%"):
        return max(1, total * int(canonical[:-1]) // 100)
    return int(canonical)


def next_batch(
    pending: Sequence[str], *, in_flight: int, unavailable_other: int, limit: int
) -> list[str]:
    """The nodes to start migrating now: the prefix of ``pending`` (in the order they
    should go) that keeps migrations in flight plus nodes already out of service for
    other reasons (down, in repair, cordoned) at or under ``limit``. Empty when the
    cluster is already at or over it."""
    if min(in_flight, unavailable_other, limit) < 0:
        raise ValueError("in_flight, unavailable_other and limit must not be negative")
    room = max(0, limit - in_flight - unavailable_other)
    return list(pending[:room])
