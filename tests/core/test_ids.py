"""Ids: UUIDv7 strings, unique and ordered by creation, also within one millisecond."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from gpufleet.core import ids
from gpufleet.core.ids import is_id, new_id


def test_new_id_is_a_canonical_uuid7() -> None:
    value = new_id()
    parsed = uuid.UUID(value)
    assert str(parsed) == value
    assert len(value) == 36
    assert parsed.version == 7
    assert parsed.variant == uuid.RFC_4122


def test_ids_carry_the_creation_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    value = new_id()
    after = time.time_ns() // 1_000_000
    ms = uuid.UUID(value).int >> 80
    assert before <= ms <= after + 1


def test_ids_sort_in_creation_order_as_strings() -> None:
    made = [new_id() for _ in range(20_000)]  # many share a millisecond
    assert len(set(made)) == len(made)
    assert made == sorted(made)


def test_order_survives_the_clock_stepping_back(monkeypatch: pytest.MonkeyPatch) -> None:
    first = new_id()
    real = time.time_ns()
    monkeypatch.setattr(ids.time, "time_ns", lambda: real - 10_000_000_000)
    later = [new_id() for _ in range(5)]
    assert [first, *later] == sorted([first, *later])


def test_counter_overflow_moves_to_the_next_millisecond(monkeypatch: pytest.MonkeyPatch) -> None:
    frozen = time.time_ns() + 1_000_000_000
    # Restored afterwards, so later ids in this process do not carry the future millisecond.
    monkeypatch.setattr(ids, "_last_ms", ids._last_ms)
    monkeypatch.setattr(ids, "_seq", ids._seq)
    monkeypatch.setattr(ids.time, "time_ns", lambda: frozen)
    made = [new_id() for _ in range(5000)]  # more than the 4096 a millisecond holds
    assert made == sorted(made)
    assert len(set(made)) == len(made)


def test_ids_are_unique_and_ordered_across_threads() -> None:
    results: list[list[str]] = [[] for _ in range(8)]

    def make(out: list[str]) -> None:
        out.extend(new_id() for _ in range(2000))

    threads = [threading.Thread(target=make, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for r in results for i in r]
    assert len(set(everything)) == len(everything)
    for r in results:
        assert r == sorted(r)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("01a237be-697e-7000-9bff-8b287e325098", True),
        ("5f0c7a2e-3d1b-4c8e-9a6f-2b7d4e1c9a30", True),  # a random (v4) UUID
        ("01A237BE-697E-7000-9BFF-8B287E325098", False),  # not canonical
        ("01a237be697e70009bff8b287e325098", False),
        ("{01a237be-697e-7000-9bff-8b287e325098}", False),
        ("not-an-id", False),
        ("", False),
        ("train-000", False),
    ],
)
def test_is_id(text: str, expected: bool) -> None:
    assert is_id(text) is expected
