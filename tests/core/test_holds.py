"""The drain-reason grammar: what gpufleet writes on a node it holds, and reading it back.
An operator's drain is never ours; reasons older servers wrote still read as ours."""

from __future__ import annotations

import pytest

from gpufleet.core.holds import (
    DRAIN_REASON_PREFIX,
    MAX_REASON_CHARS,
    HoldKind,
    HoldReason,
    acceptance_hold,
    healthcheck_hold,
    is_gpufleet_reason,
    manual_hold,
    parse_hold_reason,
    repair_hold,
)
from gpufleet.core.ids import new_id
from gpufleet.schedulers.base import DRAIN_REASON_PREFIX as DRIVER_PREFIX

REPAIR_ID = "0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b"


def test_a_repair_reason_round_trips() -> None:
    reason = repair_hold(REPAIR_ID, signature_id="xid-79", action="reboot")
    assert reason.text == f"gpufleet: {REPAIR_ID} xid-79"  # what sinfo -R showed before
    assert parse_hold_reason(reason.text) == reason
    assert (reason.kind, reason.repair_id, reason.subject) == (
        HoldKind.REPAIR,
        REPAIR_ID,
        "xid-79",
    )


def test_a_repair_without_a_signature_names_its_action() -> None:
    repair_id = new_id()
    reason = repair_hold(repair_id, signature_id=None, action="reprovision")
    assert reason.text == f"gpufleet: {repair_id} reprovision"
    assert parse_hold_reason(reason.text) == reason
    assert (reason.repair_id, reason.subject) == (repair_id, "reprovision")


def test_the_acceptance_reason_round_trips() -> None:
    reason = acceptance_hold()
    assert reason.text == "gpufleet: acceptance tests running"
    assert parse_hold_reason(reason.text) == reason
    assert reason.kind is HoldKind.ACCEPTANCE


def test_a_manual_reason_round_trips_with_an_actor_that_has_a_colon() -> None:
    reason = manual_hold(action="drain", actor="user:alice", note="fan noise: rack 4")
    assert reason.text == "gpufleet: drain by user:alice: fan noise: rack 4"
    assert parse_hold_reason(reason.text) == reason
    assert (reason.kind, reason.action, reason.actor, reason.note) == (
        HoldKind.MANUAL,
        "drain",
        "user:alice",
        "fan noise: rack 4",
    )


def test_a_long_manual_reason_is_cut_and_still_ours() -> None:
    reason = manual_hold(action="cordon", actor="user:bob", note="x" * 500)
    assert len(reason.text) == MAX_REASON_CHARS
    parsed = parse_hold_reason(reason.text)
    assert parsed == reason and parsed.kind is HoldKind.MANUAL
    assert parsed.note == "x" * (MAX_REASON_CHARS - len("gpufleet: cordon by user:bob: "))


def test_the_healthcheck_reason_round_trips() -> None:
    reason = healthcheck_hold(["ib-link-down", "xid-79"])
    assert reason.text == "gpufleet: healthcheck ib-link-down xid-79"  # as the agent wrote
    assert parse_hold_reason(reason.text) == reason
    assert reason.signatures == ("ib-link-down", "xid-79")
    long = healthcheck_hold(f"sig-{i:03d}" for i in range(100))
    assert len(long.text) == MAX_REASON_CHARS and long.kind is HoldKind.HEALTHCHECK


@pytest.mark.parametrize(
    "reason",
    [
        "ops: bad cable",
        "Not responding",
        "Kill task failed",
        "NHC: check_hw_ib failed",
        "gres/gpu count reported lower than configured (7 < 8)",
        " gpufleet: leading space is someone imitating us",
        "GPUFLEET: another case",
        "bob says gpufleet: acceptance",
        "",
    ],
)
def test_an_operators_drain_is_never_ours(reason: str) -> None:
    assert not is_gpufleet_reason(reason)
    assert parse_hold_reason(reason) is None


def test_no_reason_is_not_ours() -> None:
    assert not is_gpufleet_reason(None)
    assert parse_hold_reason(None) is None


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("gpufleet: acceptance", HoldKind.ACCEPTANCE),  # before "tests running" was added
        ("gpufleet: healthcheck", HoldKind.HEALTHCHECK),  # no signature
        (f"gpufleet: {REPAIR_ID}", HoldKind.REPAIR),  # cut before the signature
        ("gpufleet: test", HoldKind.OTHER),  # by hand, or a newer server
        ("gpufleet: repair r1", HoldKind.OTHER),
        ("gpufleet:", HoldKind.OTHER),
        ("gpufleet: drain by user:alice", HoldKind.OTHER),  # cut inside the actor
    ],
)
def test_every_reason_with_the_prefix_is_ours(text: str, kind: HoldKind) -> None:
    parsed = parse_hold_reason(text)
    assert parsed is not None and (parsed.kind, parsed.text) == (kind, text)
    assert is_gpufleet_reason(text)


def test_every_built_reason_starts_with_the_prefix_the_drivers_check() -> None:
    built: list[HoldReason] = [
        repair_hold(REPAIR_ID, signature_id="s", action="reboot"),
        acceptance_hold(),
        manual_hold(action="cordon", actor="user:a", note="n"),
        healthcheck_hold(["s"]),
    ]
    assert DRIVER_PREFIX == DRAIN_REASON_PREFIX == "gpufleet:"
    assert all(r.text.startswith(DRIVER_PREFIX) and str(r) == r.text for r in built)
