"""The words gpufleet writes on a node it holds in its scheduler: the drain reason.

Every drain gpufleet makes carries a reason that starts with ``DRAIN_REASON_PREFIX``,
and gpufleet only ever undoes a drain whose reason does (DESIGN.md "Safety rails"): an
operator's drain, NHC's, Slurm's own ``Not responding`` are never ours. The reason is
also what a person reads in ``sinfo -R``, so each hold says who holds the node and why:

- a repair: ``gpufleet: <repair id> <signature, or the action when there is none>``;
- acceptance: ``gpufleet: acceptance tests running`` (older servers wrote
  ``gpufleet: acceptance``);
- an admin's node action: ``gpufleet: <cordon|drain> by <actor>: <their reason>``;
- the agent's Slurm HealthCheckProgram: ``gpufleet: healthcheck <signature> ...``;
- the autoscaler taking an idle node away: ``gpufleet: autoscale <action id> scale-down``.

Manual and healthcheck reasons are cut to ``MAX_REASON_CHARS``. Any other text after the
prefix (written by hand, or by a newer version) is still ours: ``HoldKind.OTHER``.

Pure and standard-library only: the agent's Slurm hooks import it and must start fast.
Building reasons happens here and nowhere else (tests/server/test_lifecycle_owners.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

DRAIN_REASON_PREFIX = "gpufleet:"
HEALTHCHECK_REASON = f"{DRAIN_REASON_PREFIX} healthcheck"
ACCEPTANCE_REASON = f"{DRAIN_REASON_PREFIX} acceptance tests running"
# Slurm keeps a reason of any length, but ``sinfo -R`` and the console show one line.
MAX_REASON_CHARS = 200

# A repair id: a canonical UUID string (``core.ids``; not imported, it loads ``uuid``).
_REPAIR_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_MANUAL = re.compile(r"(?P<action>cordon|drain) by (?P<actor>\S+?): (?P<note>.*)", re.DOTALL)


class HoldKind(StrEnum):
    REPAIR = "repair"
    ACCEPTANCE = "acceptance"
    MANUAL = "manual"
    HEALTHCHECK = "healthcheck"
    AUTOSCALE = "autoscale"
    OTHER = "other"  # ours (the prefix), in no shape this version writes


@dataclass(frozen=True, slots=True)
class HoldReason:
    """One of gpufleet's drain reasons: ``text`` is what the scheduler shows; the other
    fields are read from it (those that do not apply to ``kind`` are empty)."""

    kind: HoldKind
    text: str
    repair_id: str | None = None
    subject: str | None = None  # repair: the signature, or the action
    action: str | None = None  # manual: cordon | drain
    actor: str | None = None  # manual: who
    note: str | None = None  # manual: their reason
    signatures: tuple[str, ...] = ()  # healthcheck
    action_id: str | None = None  # autoscale: the action that takes the node away

    def __str__(self) -> str:
        return self.text


def is_gpufleet_reason(reason: str | None) -> bool:
    """True when the reason is one of ours: gpufleet may undo that drain, never another."""
    return reason is not None and reason.startswith(DRAIN_REASON_PREFIX)


def parse_hold_reason(reason: str | None) -> HoldReason | None:
    """What one of our reasons says; None for a reason that is not ours (an operator's,
    Slurm's) or no reason at all."""
    if reason is None or not is_gpufleet_reason(reason):
        return None
    rest = reason[len(DRAIN_REASON_PREFIX) :].strip()
    head, _, tail = rest.partition(" ")
    if head == "acceptance":
        return HoldReason(HoldKind.ACCEPTANCE, reason)
    if head == "autoscale":
        action_id, _, _ = tail.partition(" ")
        return HoldReason(HoldKind.AUTOSCALE, reason, action_id=action_id or None)
    if head == "healthcheck":
        return HoldReason(HoldKind.HEALTHCHECK, reason, signatures=tuple(tail.split()))
    manual = _MANUAL.fullmatch(rest)
    if manual is not None:
        return HoldReason(
            HoldKind.MANUAL,
            reason,
            action=manual["action"],
            actor=manual["actor"],
            note=manual["note"],
        )
    if _REPAIR_ID.fullmatch(head):
        return HoldReason(HoldKind.REPAIR, reason, repair_id=head, subject=tail.strip() or None)
    return HoldReason(HoldKind.OTHER, reason)


def repair_hold(repair_id: str, *, signature_id: str | None, action: str) -> HoldReason:
    """The reason a repair drains its node with (and downs it with, when forced)."""
    return _ours(f"{DRAIN_REASON_PREFIX} {repair_id} {signature_id or action}")


def acceptance_hold() -> HoldReason:
    """The reason a node under acceptance is drained with; undone when it passes."""
    return _ours(ACCEPTANCE_REASON)


def manual_hold(*, action: str, actor: str, note: str) -> HoldReason:
    """The reason an admin's cordon or drain puts on the node."""
    return _ours(f"{DRAIN_REASON_PREFIX} {action} by {actor}: {note}"[:MAX_REASON_CHARS])


def healthcheck_hold(signatures: Iterable[str]) -> HoldReason:
    """The reason the agent's Slurm HealthCheckProgram drains its node with."""
    return _ours(f"{HEALTHCHECK_REASON} {' '.join(signatures)}"[:MAX_REASON_CHARS])


def autoscale_hold(action_id: str) -> HoldReason:
    """The reason a node the autoscaler removes is drained with while it checks that no
    job landed there; undone when one did (the node stays)."""
    return _ours(f"{DRAIN_REASON_PREFIX} autoscale {action_id} scale-down")


def _ours(text: str) -> HoldReason:
    parsed = parse_hold_reason(text)
    assert parsed is not None, text  # every builder starts with the prefix
    return parsed
