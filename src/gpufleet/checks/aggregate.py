"""One check run's outputs → its stored result: a verdict per node (keyed by node id), per
GPU and per HCA, the run's reasons, and what each failure says about whom.

Pure: no I/O. The runner hands in each invocation's output (``InvocationOutput``) and
the nodes it knows; ``judge_run`` parses and judges each judged invocation with
``evaluate.check_output`` and folds the verdicts onto nodes. Missing evidence fails: an
invocation that never ran, was killed at its timeout, or exited non-zero is never a pass.

Who a failure blames (``Blame``, the findings the server raises):

- a per-node invocation (dcgm-diag, gpu-burn, NCCL on one node): its node, and the GPU a
  reason names;
- a multi-node NCCL run: only a node a reason names by host (a crash on that host, a GPU
  missing there). A slow ring names nobody: localisation finds the node;
- ib_write_bw: a client → server pair on one HCA. In a ring of 3+ nodes, a node whose
  every pair on that HCA failed is blamed; a lone failed pair blames nobody (either end,
  or the cable between) and is reported as a link.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpufleet.checks.evaluate import check_output
from gpufleet.checks.models import CheckContext, CheckKind, ReasonCode
from gpufleet.checks.report import summary, verdict_dict
from gpufleet.checks.runners import CheckPlan, Invocation
from gpufleet.checks.thresholds import ThresholdTable, UnknownName, get_thresholds

RAW_LIMIT = 262_144  # characters of one invocation's output kept in ``raw_output``
_RANK = {"pass": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True, slots=True)
class InvocationOutput:
    """What one invocation left behind. ``error``: it never ran to an end anyone saw
    (not started, expired, the job died); then ``stdout`` may be empty."""

    id: str
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None
    duration_s: float | None = None


@dataclass(frozen=True, slots=True)
class NodeInfo:
    id: str
    name: str
    aliases: tuple[str, ...] = ()  # hostname, scheduler name: how outputs may name it


@dataclass(frozen=True, slots=True)
class Blame:
    """One failure pinned on a node (and GPU / HCA): what a finding is raised for."""

    node_id: str
    code: str  # a ReasonCode value
    messages: tuple[str, ...]
    gpu_index: int | None = None
    hca: str | None = None


@dataclass(slots=True)
class RunVerdict:
    outcome: str  # pass | warn | fail
    result: dict[str, Any]
    raw_output: str
    blames: list[Blame] = field(default_factory=list)
    judged_nodes: set[str] = field(default_factory=set)  # ids with a verdict of their own

    @property
    def passed(self) -> bool:
        return self.outcome != "fail"


def worst(values: Sequence[str]) -> str:
    return max(values, key=_RANK.__getitem__, default="pass")


def _fail(code: ReasonCode, message: str, node: str | None = None) -> dict[str, Any]:
    return {
        "outcome": "fail",
        "code": code.value,
        "message": message,
        "node": node,
        "gpu": None,
        "figure": None,
        "threshold": None,
        "unit": None,
    }


def judge_run(
    plan: CheckPlan,
    outputs: Mapping[str, InvocationOutput],
    *,
    nodes: Sequence[NodeInfo],
    gpu_model: str | None,
    fabric: str | None,
    expected_gpus: int | None,
    stand_in: bool = False,
    thresholds: ThresholdTable | None = None,
) -> RunVerdict:
    """Judge every judged invocation of ``plan`` and fold them onto ``nodes``.

    An invocation with no entry in ``outputs`` did not run: it fails. ``gpu_model`` or
    ``fabric`` the thresholds do not know are left unjudged (with a note), not an error.
    """
    table = thresholds or get_thresholds()
    gpu_model = _known(table.resolve_gpu_model, gpu_model)
    fabric = _known(table.resolve_fabric, fabric)
    by_name = {n.name: n for n in nodes}
    for n in nodes:
        for alias in n.aliases:
            by_name.setdefault(alias, n)
    placed = {name for inv in plan.invocations for name in inv.nodes}
    node_out: dict[str, dict[str, Any]] = {
        n.id: {"name": n.name, "outcome": "pass", "reasons": [], "figures": {}, "gpus": {}}
        for n in nodes
        if placed & {n.name, *n.aliases}
    }
    run_reasons: list[dict[str, Any]] = []
    invocations: list[dict[str, Any]] = []
    raw_parts: list[str] = []
    blames: list[Blame] = []
    judged: set[str] = set()
    ib_pairs: list[tuple[str, str, str, str, list[str]]] = []  # hca, client, server, ...
    for inv in plan.invocations:
        out = outputs.get(inv.id) or InvocationOutput(id=inv.id, error="it never started")
        raw_parts.append(_raw(inv, out))
        if not inv.judged:
            invocations.append(_inv_json(inv, out, outcome=None, summary_=None, reasons=[]))
            continue
        multi = len(inv.nodes) > 1 and inv.kind is CheckKind.NCCL
        ctx = CheckContext(
            node=inv.node,
            gpu_model=gpu_model,
            fabric=fabric,
            expected_gpus=expected_gpus,
            expected_nodes=len(inv.nodes) if multi else None,
        )
        text = out.stdout + (("\n" + out.stderr) if out.stderr else "")
        checked = check_output(inv.kind, text, context=ctx, thresholds=table)
        verdict = verdict_dict(checked.verdict)
        extra: list[dict[str, Any]] = []
        if out.error and not out.stdout.strip():
            extra.append(_fail(ReasonCode.DID_NOT_FINISH, f"{inv.id}: {out.error}"))
        elif out.timed_out:
            extra.append(
                _fail(
                    ReasonCode.DID_NOT_FINISH,
                    f"{inv.id}: killed after its {inv.timeout_s:g} s timeout",
                )
            )
        elif out.error:
            extra.append(_fail(ReasonCode.DID_NOT_FINISH, f"{inv.id}: {out.error}"))
        elif out.exit_code not in (0, None) and verdict["outcome"] != "fail":
            # A tool that failed says so in its output too (dcgmi exits non-zero on a
            # failed test); an exit status that contradicts a clean output is the news.
            extra.append(
                _fail(ReasonCode.CRASHED, f"{inv.id}: {inv.argv[0]} exited {out.exit_code}")
            )
        outcome = worst([verdict["outcome"], *(r["outcome"] for r in extra)])
        reasons = [*verdict["reasons"], *extra]
        invocations.append(
            _inv_json(inv, out, outcome=outcome, summary_=summary(checked), reasons=reasons)
        )
        if inv.kind is CheckKind.IB_WRITE_BW:
            _fold_ib(node_out, by_name, inv, outcome, reasons, summary(checked))
            if outcome == "fail" and inv.peer is not None:
                messages = [r["message"] for r in reasons if r["outcome"] == "fail"]
                ib_pairs.append((inv.hca or "?", inv.node, inv.peer, outcome, messages))
            continue
        if multi:
            _fold_multi(node_out, by_name, verdict, extra, run_reasons, blames, judged, outcome)
            continue
        node = by_name.get(inv.node)
        if node is None:
            run_reasons.extend(r for r in reasons if r["outcome"] != "pass")
            continue
        judged.add(node.id)
        _fold_single(node_out[node.id], verdict, extra, outcome)
        blames.extend(_blames_single(node.id, reasons))
    if plan.kind is CheckKind.IB_WRITE_BW:
        blames.extend(_blame_ib(ib_pairs, by_name, node_out, plan, run_reasons))
        judged.update(node_out)
    outcome = worst(
        [*(n["outcome"] for n in node_out.values()), *(r["outcome"] for r in run_reasons)]
    )
    result: dict[str, Any] = {
        "kind": plan.kind.value,
        "outcome": outcome,
        "passed": outcome != "fail",
        "stand_in": stand_in,
        "gpu_model": gpu_model,
        "fabric": fabric,
        "figures": _figures(invocations),
        "reasons": run_reasons,
        "nodes": node_out,
        "invocations": invocations,
    }
    return RunVerdict(
        outcome=outcome,
        result=result,
        raw_output="".join(raw_parts),
        blames=blames,
        judged_nodes=judged,
    )


def _known(resolve: Any, name: str | None) -> str | None:
    if name is None:
        return None
    try:
        resolved: str = resolve(name)
    except UnknownName:
        return None
    return resolved


def _raw(inv: Invocation, out: InvocationOutput) -> str:
    how = (
        f"exit {out.exit_code}"
        if out.exit_code is not None
        else "timed out"
        if out.timed_out
        else out.error or "no result"
    )
    head = f"==> {inv.id} on {inv.node}: {' '.join(inv.argv)} ({how}) <==\n"
    body = out.stdout[-RAW_LIMIT:]
    if out.stderr:
        body += ("" if body.endswith("\n") or not body else "\n") + "--- stderr ---\n"
        body += out.stderr[-RAW_LIMIT // 4 :]
    return head + body + ("" if body.endswith("\n") else "\n")


def _inv_json(
    inv: Invocation,
    out: InvocationOutput,
    *,
    outcome: str | None,
    summary_: dict[str, Any] | None,
    reasons: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "id": inv.id,
        "node": inv.node,
        "nodes": list(inv.nodes),
        "argv": list(inv.argv),
        "hca": inv.hca,
        "peer": inv.peer,
        "judged": inv.judged,
        "exit_code": out.exit_code,
        "timed_out": out.timed_out,
        "error": out.error,
        "duration_s": out.duration_s,
        "outcome": outcome,
        "summary": summary_,
        "reasons": reasons,
    }


def _fold_single(
    node: dict[str, Any], verdict: dict[str, Any], extra: list[dict[str, Any]], outcome: str
) -> None:
    node["outcome"] = worst([node["outcome"], outcome])
    for nv in verdict["nodes"]:
        node["reasons"].extend(nv["reasons"])
        for g in nv["gpus"]:
            gpu = node["gpus"].setdefault(
                str(g["index"]), {"outcome": "pass", "reasons": [], "figures": {}}
            )
            gpu["outcome"] = worst([gpu["outcome"], g["outcome"]])
            gpu["reasons"].extend(g["reasons"])
            gpu["figures"].update(g["figures"])
    node["reasons"].extend(extra)
    node["figures"].update(verdict["figures"])


def _fold_multi(
    node_out: dict[str, dict[str, Any]],
    by_name: Mapping[str, NodeInfo],
    verdict: dict[str, Any],
    extra: list[dict[str, Any]],
    run_reasons: list[dict[str, Any]],
    blames: list[Blame],
    judged: set[str],
    outcome: str,
) -> None:
    """A multi-node NCCL run: every node gets the run's outcome; only reasons that name a
    host blame it."""
    named: dict[str, list[dict[str, Any]]] = {}
    for r in [*verdict["reasons"], *extra]:
        node = by_name.get(r["node"]) if r.get("node") else None
        if node is not None:
            named.setdefault(node.id, []).append(r)
        elif r["outcome"] != "pass":
            run_reasons.append(r)
    for nv in verdict["nodes"]:
        node = by_name.get(nv["node"]) if nv["node"] else None
        if node is None:
            continue
        for g in nv["gpus"]:
            node_out[node.id]["gpus"].setdefault(
                str(g["index"]), {"outcome": g["outcome"], "reasons": [], "figures": g["figures"]}
            )
    for entry in node_out.values():
        entry["outcome"] = worst([entry["outcome"], outcome])
        entry["figures"].update(
            {k: verdict["figures"].get(k) for k in ("busbw_large", "avg_busbw", "nodes")}
        )
    for node_id, reasons in named.items():
        node_out[node_id]["reasons"].extend(reasons)
        judged.add(node_id)
        blames.extend(_blames_single(node_id, reasons))
    if outcome != "fail":
        judged.update(node_out)  # a ring that passed vouches for every node in it


def _blames_single(node_id: str, reasons: Sequence[Mapping[str, Any]]) -> list[Blame]:
    """One blame per (code, GPU) among the failing reasons."""
    grouped: dict[tuple[str, int | None], list[str]] = {}
    for r in reasons:
        if r["outcome"] != "fail":
            continue
        grouped.setdefault((str(r["code"]), r.get("gpu")), []).append(str(r["message"]))
    return [
        Blame(node_id=node_id, code=code, messages=tuple(messages), gpu_index=gpu)
        for (code, gpu), messages in grouped.items()
    ]


def _fold_ib(
    node_out: dict[str, dict[str, Any]],
    by_name: Mapping[str, NodeInfo],
    inv: Invocation,
    outcome: str,
    reasons: list[dict[str, Any]],
    figures: dict[str, Any],
) -> None:
    client = by_name.get(inv.node)
    if client is None or inv.hca is None:
        return
    entry = node_out[client.id].setdefault("hcas", {})
    entry[inv.hca] = {
        "outcome": outcome,
        "peer": inv.peer,
        "bw_avg_gbits": figures.get("bw_avg_gbits"),
        "msg_bytes": figures.get("msg_bytes"),
        "reasons": reasons,
    }


def _blame_ib(
    pairs: Sequence[tuple[str, str, str, str, list[str]]],
    by_name: Mapping[str, NodeInfo],
    node_out: dict[str, dict[str, Any]],
    plan: CheckPlan,
    run_reasons: list[dict[str, Any]],
) -> list[Blame]:
    """Per HCA: in a ring of 3+ nodes a node whose two pairs (as client and as server)
    both failed is blamed and fails; one node alone (loopback) is blamed for its pair.
    Any other failed pair is a link: a run reason (the run fails), its ends warn."""
    ring = list(dict.fromkeys(i.node for i in plan.invocations if i.judged))
    blames: list[Blame] = []
    by_hca: dict[str, list[tuple[str, str, list[str]]]] = {}
    for hca, client, server, _outcome, messages in pairs:
        by_hca.setdefault(hca, []).append((client, server, messages))
    for hca, failed in sorted(by_hca.items()):
        involved: dict[str, list[str]] = {}
        for client, server, messages in failed:
            for name in dict.fromkeys((client, server)):
                involved.setdefault(name, []).extend(messages)
        if len(ring) >= 3:
            blamed = {n for n in involved if sum(n in (c, s) for c, s, _ in failed) >= 2}
        else:
            blamed = {ring[0]} if len(ring) == 1 else set()
        for name in sorted(blamed):
            node = by_name.get(name)
            if node is None:
                continue
            node_out[node.id]["outcome"] = "fail"
            node_out[node.id]["reasons"].append(
                _fail(
                    ReasonCode.BELOW_THRESHOLD,
                    f"{hca}: every ib_write_bw pair through this node failed",
                    name,
                )
            )
            blames.append(
                Blame(
                    node_id=node.id,
                    code=ReasonCode.BELOW_THRESHOLD.value,
                    messages=tuple(involved[name]),
                    hca=hca,
                )
            )
        for client, server, messages in failed:
            if client in blamed or server in blamed:
                continue
            run_reasons.append(
                _fail(
                    ReasonCode.BELOW_THRESHOLD,
                    f"{hca}: {client} → {server} failed ({'; '.join(messages[:2])}); the "
                    "other pairs through both nodes passed or cannot tell: either end, or "
                    "the link between",
                )
            )
            for name in (client, server):
                node = by_name.get(name)
                if node is not None and node_out[node.id]["outcome"] == "pass":
                    node_out[node.id]["outcome"] = "warn"
    return blames


def _figures(invocations: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Headline figures over every judged invocation: the lowest of each bandwidth."""
    out: dict[str, Any] = {}
    for key in ("busbw_large", "avg_busbw", "bw_avg_gbits"):
        values = [
            s[key]
            for i in invocations
            if (s := i.get("summary")) and isinstance(s.get(key), int | float)
        ]
        if values:
            out[f"min_{key}"] = min(values)
    failed = [i["id"] for i in invocations if i.get("outcome") == "fail"]
    out["invocations"] = sum(1 for i in invocations if i.get("judged"))
    out["failed_invocations"] = len(failed)
    return out


__all__ = ["Blame", "InvocationOutput", "NodeInfo", "RunVerdict", "judge_run"]
