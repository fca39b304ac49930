"""Pure helpers of the acceptance steps: each node's verdict over its node-level checks,
the node-level checks due next, a suite check's parameters, why a cluster-wide run
failed. No I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpufleet.core.acceptance import AcceptanceSuite, SuiteCheck
from gpufleet.core.enums import AcceptanceStage, CheckStatus
from gpufleet.server.db.tables import AcceptanceRunRow, CheckRunRow
from gpufleet.server.services.acceptance_report import CheckEntry, node_results, worst
from gpufleet.server.services.checks import ENDED

PASSING = frozenset({"pass", "warn"})  # a node that passed goes in service
FAILING = "fail"  # a node that failed is cordoned (when the failure is pinned on it)


def node_level(entries: Sequence[CheckEntry]) -> list[CheckEntry]:
    return [e for e in entries if e.stage is AcceptanceStage.NODE]


def node_steps(run: AcceptanceRunRow) -> int:
    """How many node-level checks the run's suite has (a node goes through them all)."""
    return len(AcceptanceSuite.model_validate(run.suite).node_checks())


def ended(row: CheckRunRow | None) -> bool:
    """The check has its final say: it ended, and a localisation it started has ended
    too (``AcceptanceContext.check_rows`` looks at the child). Judging before that would
    blame nobody."""
    if row is None:
        return True
    return CheckStatus(row.status) in ENDED and localising(row) is None


def localising(row: CheckRunRow) -> str | None:
    """The id of the localisation run this failed multi-node NCCL run started, while its
    result still says it runs (the child writes what it pinned back when it ends)."""
    loc = (row.result or {}).get("localisation")
    if isinstance(loc, dict) and loc.get("status") in ("pending", "running"):
        return str(loc.get("run_id") or "") or None
    return None


def params_of(check: SuiteCheck, fabric: str | None) -> dict[str, Any]:
    params: dict[str, Any] = dict(check.check_params())
    if fabric is not None and check.kind in ("nccl", "ib-write-bw"):
        params.setdefault("fabric", fabric)
    return params


def excluded_of(run: AcceptanceRunRow) -> dict[str, str]:
    """Nodes of the run no check could run on (gone, in a state checks refuse): failed."""
    return {str(k): str(v) for k, v in ((run.results or {}).get("excluded") or {}).items()}


def node_outcomes(
    node_ids: Sequence[str],
    entries: Sequence[CheckEntry],
    checks: dict[str, CheckRunRow],
    excluded: dict[str, str],
    steps: int,
) -> dict[str, dict[str, Any]]:
    """Each node's verdict over its node-level checks: the worst of them once it has
    been through all ``steps`` (or failed one: it gets no further check); pending while
    one runs or is still to come."""
    out: dict[str, dict[str, Any]] = {n: {"outcome": "pending", "reasons": []} for n in node_ids}
    for node_id, why in excluded.items():
        if node_id in out:
            out[node_id] = {"outcome": "fail", "reasons": [why]}
    seen: dict[str, list[str]] = {n: [] for n in node_ids}
    done_steps: dict[str, int] = dict.fromkeys(node_ids, 0)
    waiting: set[str] = set()
    for entry in entries:
        if not entry.check_run_id:
            for node_id in entry.node_ids:
                seen.setdefault(node_id, []).append("pass")
                done_steps[node_id] = steps
            continue
        row = checks.get(entry.check_run_id)
        if row is None or CheckStatus(row.status) not in ENDED:
            waiting.update(entry.node_ids)
            continue
        for node_id, result in node_results(row).items():
            if node_id not in out:
                continue
            seen[node_id].append(str(result["outcome"]))
            done_steps[node_id] = done_steps.get(node_id, 0) + 1
            out[node_id]["reasons"].extend(result["reasons"])
    for node_id in node_ids:
        if node_id in waiting or node_id in excluded or not seen.get(node_id):
            continue
        verdict = worst(seen[node_id])
        if verdict in PASSING and done_steps.get(node_id, 0) < steps:
            continue  # its next check is still to come
        out[node_id]["outcome"] = verdict
    return out


def next_steps(
    entries: Sequence[CheckEntry], checks: dict[str, CheckRunRow], steps: int
) -> list[tuple[int, int, list[str]]]:
    """(batch, step, nodes) of the node-level checks due now: a batch's next check once
    its last one ended, for the nodes that passed every check so far."""
    batches: dict[int, list[CheckEntry]] = {}
    for entry in entries:
        batches.setdefault(entry.batch, []).append(entry)
    due = []
    for number, mine in sorted(batches.items()):
        last = max(mine, key=lambda e: e.step)
        if not last.check_run_id or last.step + 1 >= steps:
            continue
        row = checks.get(last.check_run_id)
        if row is None or CheckStatus(row.status) not in ENDED:
            continue
        results = node_results(row)
        passing = [n for n in last.node_ids if (results.get(n) or {}).get("outcome") in PASSING]
        if passing:
            due.append((number, last.step + 1, passing))
    return due


def why_failed(row: CheckRunRow) -> str:
    """A failed cluster-wide run in words: its failing reasons, what bisecting left
    unresolved."""
    result = row.result or {}
    reasons = [
        str(r.get("message"))
        for r in result.get("reasons") or []
        if isinstance(r, dict) and r.get("outcome") == "fail"
    ]
    loc = result.get("localisation") or {}
    unresolved = loc.get("unresolved") if isinstance(loc, dict) else None
    parts = [*reasons[:3], *(str(u) for u in (unresolved or [])[:2])]
    return "; ".join(parts) or row.detail or f"the check run {row.status}"
