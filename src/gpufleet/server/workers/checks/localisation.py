"""Localisation runs: bisect a failed multi-node all-reduce down to the node (or link).

A failed multi-node NCCL run (not itself part of a localisation) starts a localisation
run over its nodes (``start_localisation``). That run has no commands of its own: its
``progress["localiser"]`` holds the search state (``checks/localise.py``), and each round
its step (``localise``) starts one multi-node NCCL run per probe (children:
``purpose = "localisation"``, ``parent_id`` = the localisation run), waits for all of
them, and feeds their outcomes back. State and the round's child ids are written in one
transaction with the children themselves, so a restart resumes the round. The named node
gets a ``check-nccl-busbw-low`` finding with the probes as evidence; the failed run's
result gets the report under ``localisation``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.checks.aggregate import Blame
from gpufleet.checks.localise import Localiser, Probe
from gpufleet.checks.models import CheckKind, ReasonCode
from gpufleet.checks.runners import NcclScope
from gpufleet.core.enums import CheckStatus
from gpufleet.server.db.tables import CheckRunRow, ClusterRow, NodeRow
from gpufleet.server.services.check_findings import apply_check_findings
from gpufleet.server.services.checks import ENDED, create_check_run, switch_check_status
from gpufleet.server.workers.base import Step
from gpufleet.server.workers.checks.context import ACTOR, Loaded, RunContext, Tx, ended

_PASSED_ON = ("scope", "min_bytes", "max_bytes", "fabric", "timeout_s")


async def start_localisation(
    session: AsyncSession, *, failed: CheckRunRow, cluster: ClusterRow, now: dt.datetime
) -> CheckRunRow:
    """The localisation run for ``failed`` (a multi-node NCCL run that failed)."""
    names = list((failed.progress or {}).get("nodes") or [])
    ids = await _ids(session, cluster.id, names)
    params = {k: v for k, v in (failed.params or {}).items() if k in _PASSED_ON}
    params.update(scope=NcclScope.MULTI_NODE.value, localise=False)
    known_good = list((failed.params or {}).get("known_good") or [])
    if known_good:
        params["known_good"] = known_good
    run = await create_check_run(
        session,
        actor=ACTOR,
        cluster=cluster,
        kind=CheckKind.NCCL,
        node_ids=[ids[n] for n in names],
        params=params,
        force=failed.forced,
        purpose="localisation",
        parent_id=failed.id,
        now=now,
    )
    run.progress = {
        "localiser": Localiser.start(names, known_good=known_good).to_json(),
        "history": [],
    }
    return run


async def localise(ctx: RunContext, loaded: Loaded) -> None:
    """A localisation run's one step, pending or running: read the round's probe runs
    once they all ended, then start the next round or name the culprit."""
    run = loaded.run
    progress = dict(run.progress or {})
    state = Localiser.from_json(progress["localiser"])
    round_runs: dict[str, str] = dict(progress.get("round") or {})
    history: list[dict[str, Any]] = list(progress.get("history") or [])
    async with ctx.locked() as tx:
        if tx is None:
            return
        children = {
            c.id: c
            for c in await tx.session.scalars(
                select(CheckRunRow).where(CheckRunRow.id.in_(list(round_runs.values())))
            )
        }
        if progress.get("cancel"):
            for child in children.values():
                _cancel_child(tx, child)
            ended(tx, CheckStatus.CANCELLED, str(progress["cancel"]))
            return
        if round_runs:
            waiting = [c for c in children.values() if CheckStatus(c.status) not in ENDED]
            if waiting:
                tx.run.detail = (
                    f"round {state.rounds + 1}: {len(waiting)} of {len(round_runs)} "
                    "probe run(s) still running"
                )
                return
            broken = [
                c
                for c in children.values()
                if c.status not in (CheckStatus.PASSED.value, CheckStatus.FAILED.value) or c.skipped
            ]
            if broken or len(children) != len(round_runs):
                why = "; ".join(f"{c.id}: {c.status} ({c.detail})" for c in broken)
                ended(tx, CheckStatus.ERROR, f"a probe run could not run: {why or 'missing'}")
                return
            outcome = {
                p: children[c].status == CheckStatus.FAILED.value for p, c in round_runs.items()
            }
            by_id = {p.id: p for p in state.probes}
            for probe_id, child_id in round_runs.items():
                child = children[child_id]
                history.append(
                    {
                        "round": state.rounds + 1,
                        "nodes": list(by_id[probe_id].nodes),
                        "run_id": child_id,
                        "failed": outcome[probe_id],
                        "busbw": (child.result or {}).get("figures", {}).get("min_busbw_large"),
                    }
                )
            state.record(outcome)
            round_runs = {}
        probes = state.plan_round()
        if not probes:
            await _finish(ctx, tx, state=state, history=history)
            return
        ids = await _ids(tx.session, tx.cluster.id, [n for p in probes for n in p.nodes])
        params = {k: v for k, v in (tx.run.params or {}).items() if k in _PASSED_ON}
        params.update(scope=NcclScope.MULTI_NODE.value, localise=False)
        for probe in probes:
            child = await create_check_run(
                tx.session,
                actor=ACTOR,
                cluster=tx.cluster,
                kind=CheckKind.NCCL,
                node_ids=[ids[n] for n in probe.nodes],
                params=params,
                force=tx.run.forced,
                purpose="localisation",
                parent_id=tx.run.id,
                now=tx.now,
            )
            round_runs[probe.id] = child.id
        tx.run.progress = {
            **progress,
            "localiser": state.to_json(),
            "round": round_runs,
            "history": history,
        }
        reason = f"round {state.rounds + 1}: {len(probes)} probe(s): " + "; ".join(
            _describe(p) for p in probes
        )
        if tx.run.status == CheckStatus.PENDING.value:
            switch_check_status(
                tx.session,
                run=tx.run,
                project_id=tx.cluster.project_id,
                target=CheckStatus.RUNNING,
                actor=ACTOR,
                reason=reason,
                now=tx.now,
            )
        else:
            tx.run.detail = reason
            tx.run.updated_at = tx.now


async def _finish(
    ctx: RunContext, tx: Tx, *, state: Localiser, history: list[dict[str, Any]]
) -> None:
    report = state.report()
    found = bool(report.bad_nodes or report.bad_links)
    target = (
        CheckStatus.FAILED
        if found
        else CheckStatus.PASSED
        if not report.unresolved
        else CheckStatus.ERROR
    )
    ids = await _ids(tx.session, tx.cluster.id, [*report.bad_nodes, *report.good])
    nodes_json: dict[str, dict[str, Any]] = {
        ids[n]: {
            "name": n,
            "outcome": "fail" if n in report.bad_nodes else "pass",
            "reasons": [],
            "figures": {},
            "gpus": {},
        }
        for n in [*report.bad_nodes, *report.good]
        if n in ids
    }
    summary = {**report.to_json(), "run_id": tx.run.id, "history": history}
    tx.run.result = {
        "kind": CheckKind.NCCL.value,
        "outcome": "fail" if found else "pass",
        "passed": not found,
        "localisation": summary,
        "nodes": nodes_json,
        "reasons": [],
        "figures": {"rounds": report.rounds},
    }
    tx.run.progress = {**(tx.run.progress or {}), "localiser": state.to_json(), "round": {}}
    blames = [
        Blame(
            node_id=ids[n],
            code=ReasonCode.BELOW_THRESHOLD.value,
            messages=(_evidence(n, tx.run.id, report.rounds, history),),
        )
        for n in report.bad_nodes
        if n in ids
    ]
    await apply_check_findings(
        tx.session,
        cluster=tx.cluster,
        kind=CheckKind.NCCL,
        run_id=tx.run.id,
        blames=blames,
        judged=[b.node_id for b in blames],
        evidence_tail={},
        now=tx.now,
        staleness_s=ctx.settings.staleness_s,
    )
    if tx.run.parent_id is not None:
        parent = await tx.session.get(CheckRunRow, tx.run.parent_id, with_for_update=True)
        if parent is not None:
            parent.result = {
                **(parent.result or {}),
                "localisation": {**report.to_json(), "run_id": tx.run.id, "status": target.value},
            }
    words = []
    if report.bad_nodes:
        words.append(f"bad node(s) {', '.join(report.bad_nodes)}")
    if report.bad_links:
        words.append("bad link(s) " + ", ".join(f"{a}–{b}" for a, b in report.bad_links))
    if report.unresolved:
        words.append(f"unresolved: {'; '.join(report.unresolved)}")
    ended(
        tx,
        target,
        f"after {report.rounds} round(s): " + ("; ".join(words) or "no failure reproduced"),
    )


def _evidence(node: str, run_id: str, rounds: int, history: Sequence[dict[str, Any]]) -> str:
    mine = [h for h in history if node in h["nodes"]]
    shown = "; ".join(
        f"round {h['round']} {'+'.join(h['nodes'][:4])}{'…' if len(h['nodes']) > 4 else ''}: "
        f"{'failed' if h['failed'] else 'passed'}"
        + (f" ({h['busbw']:.1f} GB/s)" if isinstance(h.get("busbw"), int | float) else "")
        for h in mine
    )
    return (
        f"named by localisation run {run_id} after {rounds} round(s): every all-reduce "
        f"with {node} failed, the rest passed: {shown}"
    )


def _cancel_child(tx: Tx, child: CheckRunRow) -> None:
    status = CheckStatus(child.status)
    if status is CheckStatus.PENDING:
        switch_check_status(
            tx.session,
            run=child,
            project_id=tx.cluster.project_id,
            target=CheckStatus.CANCELLED,
            actor=ACTOR,
            reason=f"its localisation run {tx.run.id} was cancelled",
            now=tx.now,
        )
    elif status is CheckStatus.RUNNING:
        child.progress = {**(child.progress or {}), "cancel": f"localisation {tx.run.id} cancelled"}


def _describe(probe: Probe) -> str:
    names = "+".join(probe.nodes[:4]) + ("…" if len(probe.nodes) > 4 else "")
    return f"{names} ({len(probe.nodes)} nodes)"


async def _ids(session: AsyncSession, cluster_id: str, names: Sequence[str]) -> dict[str, str]:
    if not names:
        return {}
    rows = await session.execute(
        select(NodeRow.name, NodeRow.id).where(
            NodeRow.cluster_id == cluster_id, NodeRow.name.in_(list(set(names)))
        )
    )
    return {name: node_id for name, node_id in rows}


# A localisation run's steps, by status: the same step, pending or running.
LOCALISATION_STEPS: dict[CheckStatus, Step[RunContext, Loaded]] = {
    CheckStatus.PENDING: localise,
    CheckStatus.RUNNING: localise,
}
