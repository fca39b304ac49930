"""Findings from active checks: a failed check opens one on the failing node (and GPU /
HCA), so the repair planner recommends a repair with the check's output as evidence; a
later run that passes on the node clears them.

Entries are the catalog's ``source = "active-check"`` signatures (``CheckRule``); which
one a failure raises follows its reason code and whether it names a GPU
(``signature_for``). A finding's fold key is ``check:<signature>:<gpu>:<hca>``, so the
same failure seen again folds into the open finding (count + 1: a failing run is one
more occurrence) instead of a second one; ``services/findings.py`` writes them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.checks.aggregate import Blame
from gpufleet.checks.models import CheckKind
from gpufleet.core.enums import FindingSource
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.models import CheckRule, Signature
from gpufleet.server.db.tables import ClusterRow, GpuRow, NodeRow
from gpufleet.server.services.findings import (
    Sighting,
    clear_finding,
    open_findings,
    open_or_fold_finding,
)
from gpufleet.server.services.node_health import refresh_node_health

ACTOR = "system:checks"
EVIDENCE_LIMIT = 4000  # characters of evidence kept on a finding


def check_signatures(kind: CheckKind) -> list[Signature]:
    return [
        s
        for s in get_catalog().signatures
        if isinstance(s.match, CheckRule) and s.match.check == kind.value
    ]


def signature_for(kind: CheckKind, *, code: str, gpu: bool) -> Signature:
    """The catalog entry a failure raises: one that lists ``code`` before one that takes
    the rest, a GPU-scoped one for a failure that names a GPU."""
    entries = check_signatures(kind)
    if not entries:
        raise LookupError(f"the catalog has no active-check entry for {kind.value}")
    scope = "gpu" if gpu else "node"

    def rank(s: Signature) -> tuple[int, int]:
        rule = s.match
        assert isinstance(rule, CheckRule)
        return (
            0 if code in rule.codes else 1 if not rule.codes else 9,
            0 if rule.scope == scope else 1,
        )

    best = min(entries, key=rank)
    if rank(best)[0] == 9:
        raise LookupError(f"no active-check entry of {kind.value} takes {code}")
    return best


def fold_key(signature_id: str, *, gpu: int | None, hca: str | None) -> str:
    return f"check:{signature_id}:{'' if gpu is None else gpu}:{hca or ''}"


async def apply_check_findings(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    kind: CheckKind,
    run_id: str,
    blames: Sequence[Blame],
    judged: Iterable[str],
    evidence_tail: Mapping[str, str],
    now: dt.datetime,
    staleness_s: float,
) -> list[str]:
    """Open (or fold) a finding per blame and clear this check's open findings on judged
    nodes that this run no longer blames. Returns the ids of findings opened or folded.

    ``judged``: node ids this run has a verdict for; ``evidence_tail``: node id → the
    end of its output, appended to the evidence."""
    nodes = {
        n.id: n
        for n in await session.scalars(
            select(NodeRow).where(NodeRow.id.in_({b.node_id for b in blames} | set(judged)))
        )
    }
    wanted: dict[tuple[str, str], tuple[Signature, Blame]] = {}
    for blame in blames:
        sig = signature_for(kind, code=blame.code, gpu=blame.gpu_index is not None)
        key = fold_key(sig.id, gpu=blame.gpu_index, hca=blame.hca)
        earlier = wanted.get((blame.node_id, key))
        if earlier is not None:
            merged = Blame(
                node_id=blame.node_id,
                code=earlier[1].code,
                messages=earlier[1].messages + blame.messages,
                gpu_index=blame.gpu_index,
                hca=blame.hca,
            )
            wanted[(blame.node_id, key)] = (sig, merged)
        else:
            wanted[(blame.node_id, key)] = (sig, blame)
    open_rows = await open_findings(
        session, node_ids=nodes.keys(), signature_ids=[s.id for s in check_signatures(kind)]
    )
    by_key = {(r.node_id, r.fold_key): r for r in open_rows}
    out: list[str] = []
    for (node_id, key), (sig, blame) in wanted.items():
        node = nodes.get(node_id)
        if node is None:
            continue
        sighting = Sighting(
            key=key,
            signature_id=sig.id,
            title=sig.title,
            severity=sig.severity,
            source=FindingSource.ACTIVE_CHECK,
            evidence=_evidence(kind, run_id, node.name, blame, evidence_tail.get(node_id, "")),
            first_seen=now,
            last_seen=now,
            running_count=None,  # a failing run is one more occurrence
            gpu_uuid=await _gpu_uuid(session, node_id, blame.gpu_index),
            gpu_index=blame.gpu_index,
            component=blame.hca,
        )
        row = open_or_fold_finding(
            session,
            node=node,
            project_id=cluster.project_id,
            open_row=by_key.get((node_id, key)),
            sighting=sighting,
            actor=ACTOR,
            now=now,
            context=f"check run {run_id}",
            data={"check_run_id": run_id},
        )
        out.append(row.id)
    judged_ids = set(judged)
    for row in open_rows:
        if row.node_id not in judged_ids or (row.node_id, row.fold_key) in wanted:
            continue
        clear_finding(
            session,
            row=row,
            node=nodes[row.node_id],
            project_id=cluster.project_id,
            at=now,
            actor=ACTOR,
            why=f"check run {run_id} passed there",
            data={"check_run_id": run_id},
        )
    for node in nodes.values():
        await refresh_node_health(
            session,
            node=node,
            project_id=cluster.project_id,
            actor=ACTOR,
            now=now,
            staleness_s=staleness_s,
        )
    return out


async def _gpu_uuid(session: AsyncSession, node_id: str, index: int | None) -> str | None:
    if index is None:
        return None
    found: str | None = await session.scalar(
        select(GpuRow.uuid).where(
            GpuRow.node_id == node_id, GpuRow.index == index, GpuRow.removed_at.is_(None)
        )
    )
    return found


def _evidence(kind: CheckKind, run_id: str, node: str, blame: Blame, tail: str) -> str:
    head = f"check run {run_id} ({kind.value}) on {node}: " + "; ".join(blame.messages[:6])
    if len(blame.messages) > 6:
        head += f"; and {len(blame.messages) - 6} more"
    text = head
    if tail.strip():
        text += "\n--- output (end) ---\n" + tail[-(EVIDENCE_LIMIT - len(head) - 30) :]
    return text[:EVIDENCE_LIMIT]
