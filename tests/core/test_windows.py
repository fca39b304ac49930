"""Maintenance windows and rollout pacing (``gpufleet.core.windows``): one-off and
recurring openings with their edges, daylight-saving nights in Europe/Berlin, the CLI
text forms and their errors, max unavailable, and properties over generated windows."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gpufleet.core.errors import InvalidInput
from gpufleet.core.windows import (
    WEEKDAYS,
    Window,
    format_duration,
    max_unavailable_count,
    next_batch,
    parse_duration,
    parse_max_unavailable,
    parse_window,
)

UTC = dt.UTC
H = dt.timedelta(hours=1)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)


# One-off


def test_one_off_start_inclusive_end_exclusive() -> None:
    w = Window(start=utc(2026, 12, 6, 2), duration_s=7200)
    span = (utc(2026, 12, 6, 2), utc(2026, 12, 6, 4))
    assert w.open_at(utc(2026, 12, 6, 1, 59, 59)) is None
    assert w.open_at(utc(2026, 12, 6, 2)) == span
    assert w.open_at(utc(2026, 12, 6, 3, 59, 59)) == span
    assert w.open_at(utc(2026, 12, 6, 4)) is None


def test_one_off_next_opening_before_inside_after() -> None:
    w = Window(start=utc(2026, 12, 6, 2), duration_s=7200)
    span = (utc(2026, 12, 6, 2), utc(2026, 12, 6, 4))
    assert w.next_opening(utc(2026, 12, 1)) == span
    assert w.next_opening(utc(2026, 12, 6, 3)) == span
    assert w.next_opening(utc(2026, 12, 6, 4)) is None


def test_one_off_start_stored_in_utc_and_described_in_its_zone() -> None:
    berlin = dt.datetime(2026, 12, 6, 2, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    w = Window(start=berlin, tz="Europe/Berlin", duration_s=7200)
    assert w.start == utc(2026, 12, 6, 1)
    assert w.start is not None and w.start.tzinfo is UTC
    assert w.describe() == "2026-12-06 02:00 Europe/Berlin for 2h"
    assert Window(start=utc(2026, 12, 6, 2), duration_s=7200).describe() == (
        "2026-12-06 02:00 UTC for 2h"
    )


def test_naive_now_is_refused() -> None:
    w = Window(start=utc(2026, 12, 6, 2), duration_s=3600)
    with pytest.raises(ValueError, match="timezone-aware"):
        w.open_at(dt.datetime(2026, 12, 6, 2))


# Recurring


def test_weekly_across_midnight() -> None:
    w = Window(days=["sat"], at="23:00", duration_s=4 * 3600)  # 2026-12-05 is a Saturday
    span = (utc(2026, 12, 5, 23), utc(2026, 12, 6, 3))
    assert w.open_at(utc(2026, 12, 5, 22, 59)) is None
    assert w.open_at(utc(2026, 12, 5, 23)) == span
    assert w.open_at(utc(2026, 12, 6, 1)) == span  # sunday, opened the day before
    assert w.open_at(utc(2026, 12, 6, 3)) is None
    assert w.open_at(utc(2026, 12, 12, 22)) is None  # the next saturday, before 23:00
    assert w.next_opening(utc(2026, 12, 6, 3)) == (utc(2026, 12, 12, 23), utc(2026, 12, 13, 3))
    assert w.next_opening(utc(2026, 12, 6, 1)) == span


def test_several_days_in_local_time() -> None:
    w = Window(days=["fri", "mon", "wed"], at="22:00", tz="America/New_York", duration_s=10800)
    assert w.days == ["mon", "wed", "fri"]
    # Wednesday 2026-12-09 22:00 EST is 2026-12-10 03:00 UTC.
    assert w.open_at(utc(2026, 12, 10, 4)) == (utc(2026, 12, 10, 3), utc(2026, 12, 10, 6))
    assert w.open_at(utc(2026, 12, 11, 4)) is None  # thursday night
    assert w.next_opening(utc(2026, 12, 11, 4)) == (utc(2026, 12, 12, 3), utc(2026, 12, 12, 6))
    assert w.describe() == "mon,wed,fri 22:00 for 3h (America/New_York)"


def test_daily() -> None:
    w = Window(at="01:00", duration_s=5400)
    assert w.open_at(utc(2026, 7, 1, 1, 30)) == (utc(2026, 7, 1, 1), utc(2026, 7, 1, 2, 30))
    assert w.open_at(utc(2026, 7, 1, 2, 30)) is None
    assert w.next_opening(utc(2026, 7, 1, 2, 30)) == (utc(2026, 7, 2, 1), utc(2026, 7, 2, 2, 30))
    assert w.next_opening(utc(2026, 7, 1, 0, 30)) == (utc(2026, 7, 1, 1), utc(2026, 7, 1, 2, 30))
    assert w.describe() == "daily 01:00 for 1h30m (UTC)"


def test_daily_for_a_full_day_is_always_open() -> None:
    w = Window(at="00:00", duration_s=86400)
    assert w.open_at(utc(2026, 7, 1, 23, 59, 59)) == (utc(2026, 7, 1), utc(2026, 7, 2))
    assert w.open_at(utc(2026, 7, 2)) == (utc(2026, 7, 2), utc(2026, 7, 3))


def test_berlin_spring_forward_starts_at_end_of_gap() -> None:
    # 2026-03-29 02:00 CET jumps to 03:00 CEST (01:00 UTC): 02:30 does not exist that day.
    w = Window(at="02:30", tz="Europe/Berlin", duration_s=3600)
    assert w.open_at(utc(2026, 3, 28, 1, 45)) == (utc(2026, 3, 28, 1, 30), utc(2026, 3, 28, 2, 30))
    day = (utc(2026, 3, 29, 1), utc(2026, 3, 29, 2))  # 03:00-04:00 CEST
    assert w.open_at(utc(2026, 3, 29, 0, 59)) is None
    assert w.open_at(utc(2026, 3, 29, 1)) == day
    assert w.next_opening(utc(2026, 3, 28, 12)) == day
    assert w.open_at(utc(2026, 3, 30, 0, 45)) == (utc(2026, 3, 30, 0, 30), utc(2026, 3, 30, 1, 30))


def test_berlin_fall_back_opens_once_for_real_duration() -> None:
    # 2026-10-25 03:00 CEST falls back to 02:00 CET (01:00 UTC): 02:30 happens twice.
    w = Window(at="02:30", tz="Europe/Berlin", duration_s=7200)
    first = (utc(2026, 10, 25, 0, 30), utc(2026, 10, 25, 2, 30))  # 02:30 CEST, two real hours
    assert w.open_at(utc(2026, 10, 25, 0, 29)) is None
    assert w.open_at(utc(2026, 10, 25, 0, 30)) == first
    assert w.open_at(utc(2026, 10, 25, 1, 30)) == first  # the second 02:30 opens nothing new
    assert w.open_at(utc(2026, 10, 25, 2, 30)) is None  # 03:30 CET
    assert w.next_opening(utc(2026, 10, 25, 2, 30)) == (
        utc(2026, 10, 26, 1, 30),
        utc(2026, 10, 26, 3, 30),
    )


# Validation and JSON


def test_validation_messages() -> None:
    cases: list[tuple[dict[str, object], str]] = [
        ({"duration_s": 3600}, "exactly one of 'start'"),
        ({"start": utc(2026, 1, 1), "at": "02:00", "duration_s": 3600}, "exactly one"),
        ({"start": dt.datetime(2026, 1, 1), "duration_s": 3600}, "no time zone"),
        ({"at": "25:00", "duration_s": 3600}, "'25:00'"),
        ({"at": "02:00", "days": ["sat", "caturday"], "duration_s": 3600}, "'caturday'"),
        ({"at": "02:00", "tz": "Mars/Olympus", "duration_s": 3600}, "'Mars/Olympus'"),
        ({"at": "02:00", "duration_s": 59}, "at least 1m"),
        ({"start": utc(2026, 1, 1), "duration_s": 8 * 86400}, "at most 7d"),
        ({"at": "02:00", "duration_s": 86401}, "overlap"),
        ({"at": "02:00", "days": ["mon", "tue"], "duration_s": 2 * 86400}, "overlap"),
        ({"start": utc(2026, 1, 1), "days": ["mon"], "duration_s": 3600}, "'days'"),
        ({"at": "02:00", "duration_s": 3600, "bogus": 1}, "bogus"),
    ]
    for data, needle in cases:
        with pytest.raises(ValidationError) as info:
            Window.model_validate(data)
        assert needle in str(info.value), (data, str(info.value))


def test_gap_between_openings_bounds_the_duration() -> None:
    assert Window(at="02:00", days=["sat"], duration_s=7 * 86400).duration_s == 7 * 86400
    assert Window(at="02:00", days=["mon", "thu"], duration_s=3 * 86400).describe() == (
        "mon,thu 02:00 for 3d (UTC)"
    )


def test_days_deduplicated_in_week_order() -> None:
    w = Window(at="2:05", days=["Sun", "sat", "sat", "mon"], duration_s=86400)
    assert w.days == ["mon", "sat", "sun"]
    assert w.at == "02:05"


@pytest.mark.parametrize(
    "window",
    [
        Window(start=utc(2026, 12, 6, 2), tz="Europe/Berlin", duration_s=7200),
        Window(days=["sat"], at="02:00", tz="Europe/Berlin", duration_s=4 * 3600),
        Window(at="01:00", duration_s=5400),
    ],
)
def test_json_round_trip(window: Window) -> None:
    assert Window.model_validate_json(window.model_dump_json()) == window


# Text forms


def test_parse_one_off_local_and_offset() -> None:
    w = parse_window("2026-12-06T02:00/2h", tz="Europe/Berlin")
    assert w.start == utc(2026, 12, 6, 1)
    assert w.duration_s == 7200
    assert w.describe() == "2026-12-06 02:00 Europe/Berlin for 2h"
    w = parse_window("2026-12-06T02:00+02:00/2h", tz="Europe/Berlin")
    assert w.start == utc(2026, 12, 6, 0)
    assert parse_window("2026-12-06T02:00/2h").describe() == "2026-12-06 02:00 UTC for 2h"
    # A start in the spring-forward gap starts when the gap ends.
    assert parse_window("2026-03-29T02:30/1h", tz="Europe/Berlin").start == utc(2026, 3, 29, 1)


def test_parse_recurring_forms() -> None:
    assert parse_window("sat 02:00/4h", tz="Europe/Berlin") == Window(
        days=["sat"], at="02:00", tz="Europe/Berlin", duration_s=14400
    )
    assert parse_window("sat 02:00/4h", tz="Europe/Berlin").describe() == (
        "sat 02:00 for 4h (Europe/Berlin)"
    )
    assert parse_window("mon,wed,fri 22:00/3h").days == ["mon", "wed", "fri"]
    daily = parse_window("  daily 01:00/90m ")
    assert daily.days == []
    assert daily.at == "01:00"
    assert daily.duration_s == 5400


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("1d", 86400), ("60s", 60), ("7d", 604800)],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert parse_duration(format_duration(seconds)) == seconds


@pytest.mark.parametrize(
    ("text", "tz", "needle"),
    [
        ("sat 02:00", "UTC", "no '/duration'"),
        ("sat 02:00/45s", "UTC", "'45s'"),
        ("sat 02:00/2x", "UTC", "'2x'"),
        ("sat 02:00/", "UTC", "bad duration ''"),
        ("sat 02:00/8d", "UTC", "at most 7d"),
        ("caturday 02:00/1h", "UTC", "'caturday'"),
        ("sat,,sun 02:00/1h", "UTC", "'sat,,sun'"),
        ("sat 2am/1h", "UTC", "'2am'"),
        ("sat/1h", "UTC", "days then a start time"),
        ("2026-13-06T02:00/2h", "UTC", "'2026-13-06T02:00'"),
        ("sat 02:00/1h", "Mars/Olympus", "'Mars/Olympus'"),
        ("daily 02:00/2d", "UTC", "overlap"),
    ],
)
def test_parse_window_errors_name_the_bad_part(text: str, tz: str, needle: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_window(text, tz=tz)
    assert needle in info.value.message, info.value.message


def test_parse_window_error_lists_accepted_forms() -> None:
    with pytest.raises(InvalidInput) as info:
        parse_window("whenever")
    assert "sat 02:00/4h" in info.value.message
    assert info.value.field == "window"


# Max unavailable and batches


@pytest.mark.parametrize(
    ("spec", "total", "count"),
    [("25%", 3, 1), ("50%", 16, 8), ("25%", 10, 2), ("100%", 5, 5), ("1%", 0, 1), ("2", 16, 2)],
)
def test_max_unavailable_count(spec: str, total: int, count: int) -> None:
    assert max_unavailable_count(spec, total) == count


def test_parse_max_unavailable_canonical() -> None:
    assert parse_max_unavailable(" 25 % ") == "25%"
    assert parse_max_unavailable("02") == "2"


@pytest.mark.parametrize("text", ["0", "0%", "-1", "101%", "abc", "", "1.5", "25%%"])
def test_parse_max_unavailable_rejects(text: str) -> None:
    with pytest.raises(InvalidInput) as info:
        parse_max_unavailable(text)
    assert repr(text) in info.value.message
    assert info.value.field == "max_unavailable"


@pytest.mark.parametrize(
    ("in_flight", "other", "limit", "expected"),
    [
        (0, 0, 2, ["a", "b"]),
        (1, 0, 2, ["a"]),
        (0, 1, 2, ["a"]),
        (1, 1, 2, []),
        (0, 3, 2, []),  # already over the limit for other reasons: nothing starts
        (0, 0, 10, ["a", "b", "c"]),
        (0, 0, 0, []),
    ],
)
def test_next_batch(in_flight: int, other: int, limit: int, expected: list[str]) -> None:
    assert next_batch(
        ["a", "b", "c"], in_flight=in_flight, unavailable_other=other, limit=limit
    ) == (expected)


def test_next_batch_refuses_negatives() -> None:
    with pytest.raises(ValueError, match="negative"):
        next_batch(["a"], in_flight=-1, unavailable_other=0, limit=1)


# Properties

ZONES = [
    "UTC",
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",  # a 30-minute DST shift
    "America/Havana",  # DST changes at midnight
    "America/Santiago",  # DST changes at 24:00, southern hemisphere
    "Asia/Kolkata",
]


@st.composite
def recurring_windows(draw: st.DrawFn) -> Window:
    days = draw(st.lists(st.sampled_from(WEEKDAYS), unique=True, max_size=7))
    probe = Window(days=days, at="00:00", duration_s=60)
    hour = draw(st.integers(0, 23))
    minute = draw(st.integers(0, 59))
    duration = draw(st.integers(60, probe._min_gap_s()))
    return Window(
        days=days,
        at=f"{hour:02d}:{minute:02d}",
        tz=draw(st.sampled_from(ZONES)),
        duration_s=duration,
    )


instants = st.datetimes(
    min_value=dt.datetime(2020, 1, 1), max_value=dt.datetime(2035, 12, 31), timezones=st.just(UTC)
)


@settings(max_examples=300, deadline=None)
@given(recurring_windows(), instants)
def test_openings_contain_now_and_last_the_duration(window: Window, now: dt.datetime) -> None:
    check_openings(window, now)


@settings(max_examples=300, deadline=None)
@given(recurring_windows(), instants, st.integers(-7200, 7200))
def test_openings_near_their_edges(window: Window, base: dt.datetime, delta_s: int) -> None:
    upcoming = window.next_opening(base)
    assert upcoming is not None
    start, end = upcoming
    check_openings(window, start + dt.timedelta(seconds=delta_s))
    check_openings(window, end + dt.timedelta(seconds=delta_s))


def check_openings(window: Window, now: dt.datetime) -> None:
    """open_at(now) contains now and lasts the duration; next_opening(now) is that
    opening, or the first one after now with nothing open in between."""
    length = dt.timedelta(seconds=window.duration_s)
    current = window.open_at(now)
    if current is not None:
        start, end = current
        assert start <= now < end
        assert end - start == length
    upcoming = window.next_opening(now)
    assert upcoming is not None
    start, end = upcoming
    assert end - start == length
    if current is not None:
        assert upcoming == current
    else:
        assert start > now
        assert start - now <= dt.timedelta(days=8)
        # Nothing opens in between: just before the next start it is still closed.
        assert window.open_at(start - dt.timedelta(microseconds=1)) is None
        assert window.open_at(start) == upcoming
