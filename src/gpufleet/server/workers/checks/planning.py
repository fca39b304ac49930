"""Pure helpers of the check-run steps: the plan a run's nodes get, the backend job, the
fabric and stand-in that apply, and the output tails kept as findings' evidence. No I/O."""

from __future__ import annotations

import datetime as dt

from gpufleet.checks.aggregate import InvocationOutput
from gpufleet.checks.runners import CheckPlan, Launcher, NodeTarget, plan_check, stand_in
from gpufleet.core.enums import ProviderKind
from gpufleet.server.db.tables import NodeRow
from gpufleet.server.services.check_backends.base import BackendJob
from gpufleet.server.workers.checks.context import CheckSettings, Loaded

EVIDENCE_TAIL = 2000


def ordered_nodes(loaded: Loaded) -> list[NodeRow]:
    """The run's nodes in the order it names them (gone ones left out)."""
    return [loaded.nodes[n] for n in loaded.run.node_ids if n in loaded.nodes]


def stand_in_of(loaded: Loaded, settings: CheckSettings) -> list[str] | None:
    table = settings.stand_ins or {}
    kind = loaded.run.kind
    return table.get(f"{loaded.cluster.id}/{kind}") or table.get(kind) or None


def fabric_of(loaded: Loaded, settings: CheckSettings) -> str | None:
    labels = loaded.cluster.labels or {}
    fabric = loaded.run.params.get("fabric") or labels.get("fabric") or settings.fabric
    if fabric is None and loaded.cluster.provider == ProviderKind.SIM.value:
        fabric = "NDR"  # the sim models 8 × NDR per node
    return str(fabric) if fabric else None


def names_of(node: NodeRow) -> tuple[str, ...]:
    """The names a check's invocations may give the node: gpufleet's, and the
    scheduler's (a bare-metal node of a Slurm cluster is its host's Slurm node)."""
    return tuple(dict.fromkeys(n for n in (node.name, node.scheduler_name) if n))


def ids_by_name(loaded: Loaded) -> dict[str, str]:
    """Node id by every name a check's invocations may give the node."""
    return {name: n.id for n in loaded.nodes.values() for name in names_of(n)}


def target_of(loaded: Loaded, node: NodeRow) -> NodeTarget:
    """The node as its check's plan places it: by its scheduler's name (what srun -w and
    a reservation take), reached at its host."""
    return NodeTarget(
        name=node.scheduler_name or node.name,
        host=node.hostname or node.scheduler_name or node.name,
        gpus=node.expected_gpus or loaded.cluster.gpus_per_node,
    )


def plan_for(
    loaded: Loaded, *, targets: list[NodeTarget], launcher: Launcher, stand: list[str] | None
) -> CheckPlan:
    plan = plan_check(loaded.kind, nodes=targets, params=loaded.run.params, launcher=launcher)
    if stand:
        plan = CheckPlan(
            kind=plan.kind,
            params=plan.params,
            invocations=tuple(stand_in(i, stand) for i in plan.invocations),
        )
    return plan


def rebuild_plan(loaded: Loaded, launcher: Launcher) -> CheckPlan:
    """The plan a running run was started with, from what its row recorded."""
    by_name = {n.name: n for n in loaded.nodes.values()}
    names = loaded.progress.get("nodes") or [n.name for n in ordered_nodes(loaded)]
    targets = [target_of(loaded, by_name[n]) for n in names if n in by_name]
    stored = loaded.progress.get("launcher")
    return plan_for(
        loaded,
        targets=targets,
        launcher=Launcher(stored) if stored else launcher,
        stand=loaded.progress.get("stand_in"),
    )


def job_of(loaded: Loaded, *, plan: CheckPlan, now: dt.datetime) -> BackendJob:
    return BackendJob(
        run_id=loaded.run.id,
        cluster_id=loaded.cluster.id,
        plan=plan,
        node_ids=ids_by_name(loaded),
        forced=loaded.run.forced,
        now=now,
    )


def evidence_tails(
    loaded: Loaded, *, plan: CheckPlan, outputs: dict[str, InvocationOutput]
) -> dict[str, str]:
    """The end of each judged node's output, by node id."""
    by_name = ids_by_name(loaded)
    tails: dict[str, str] = {}
    for inv in plan.invocations:
        out = outputs.get(inv.id)
        if out is None or not inv.judged:
            continue
        text = (out.stdout + ("\n" + out.stderr if out.stderr else ""))[-EVIDENCE_TAIL:]
        for name in inv.nodes if len(inv.nodes) > 1 else (inv.node,):
            node_id = by_name.get(name)
            if node_id is not None:
                tails[node_id] = (tails.get(node_id, "") + text)[-EVIDENCE_TAIL:]
    return tails
