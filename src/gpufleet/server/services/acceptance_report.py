"""Acceptance reports: what one acceptance run found, per node and per GPU, as JSON data
with a content hash, and as one self-contained HTML page.

The JSON ties the verdicts to hardware (node serials, machine ids, GPU UUIDs and serials,
the GPU model) and to the evidence (each check run's id and where its raw output is
downloaded). It holds no time of its own making, so the same run always gives the same
bytes: ``core.acceptance.canonical_json`` of it is what ``report_sha256`` hashes and what
``GET /acceptance/{id}/report.json`` serves (``ETag`` = the hash).

Reading a check run's stored result (``checks/aggregate.py`` writes it): ``result.nodes``
keyed by node id, each with ``outcome``, ``reasons`` (dicts with ``message``),
``figures``, ``gpus`` (keyed by GPU index) and, for ib_write_bw, ``hcas``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

import jinja2

from gpufleet.checks.thresholds import Limit, UnknownName, get_thresholds
from gpufleet.core.enums import AcceptanceStage, CheckStatus
from gpufleet.server.db.tables import AcceptanceRunRow, CheckRunRow, ClusterRow, GpuRow, NodeRow

SCHEMA = "gpufleet.acceptance-report/1"
TEMPLATE = "acceptance_report.html.j2"
_RANK = {"pass": 0, "warn": 1, "skipped": 1, "pending": 2, "fail": 3}


def worst(outcomes: Sequence[str]) -> str:
    return max(outcomes, key=lambda o: _RANK.get(o, 3), default="pass")


@dataclasses.dataclass(frozen=True)
class CheckEntry:
    """One check run of an acceptance run, as ``acceptance_run.results["checks"]`` keeps it."""

    check_run_id: str
    kind: str
    label: str
    stage: AcceptanceStage  # the stage it ran in: node | cluster
    node_ids: tuple[str, ...]
    # Node level: the group of nodes that arrived together, and which of the suite's
    # node-level checks this is (they run one after the other: never two on one GPU).
    batch: int = 0
    step: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "check_run_id": self.check_run_id,
            "kind": self.kind,
            "label": self.label,
            "stage": self.stage.value,
            "node_ids": list(self.node_ids),
            "batch": self.batch,
            "step": self.step,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> CheckEntry:
        return cls(
            check_run_id=str(raw["check_run_id"]),
            kind=str(raw["kind"]),
            label=str(raw.get("label", raw["kind"])),
            stage=AcceptanceStage(str(raw.get("stage", AcceptanceStage.NODE.value))),
            node_ids=tuple(str(n) for n in raw.get("node_ids", [])),
            batch=int(raw.get("batch", 0)),
            step=int(raw.get("step", 0)),
        )


def entries_of(run: AcceptanceRunRow) -> list[CheckEntry]:
    return [CheckEntry.from_json(c) for c in (run.results or {}).get("checks", [])]


def _messages(reasons: object, *, only_bad: bool = True) -> list[str]:
    out: list[str] = []
    for r in reasons if isinstance(reasons, list) else []:
        if isinstance(r, Mapping):
            if only_bad and r.get("outcome") == "pass":
                continue
            out.append(str(r.get("message", "")))
        elif isinstance(r, str):
            out.append(r)
    return [m for m in out if m]


def node_results(check: CheckRunRow) -> dict[str, dict[str, Any]]:
    """Node id → ``{"outcome", "reasons" (text), "figures", "gpus", "hcas"}`` of one
    ended check run. A run that errored, was cancelled or left a node without a verdict
    fails that node (missing evidence never passes); a node the run skipped (it ran a
    job) is ``skipped``."""
    status = CheckStatus(check.status)
    result = check.result or {}
    stored: Mapping[str, Any] = result.get("nodes") or {}
    skipped = {
        str(s.get("node_id")): str(s.get("reason", "skipped"))
        for s in check.skipped or []
        if isinstance(s, Mapping)
    }
    out: dict[str, dict[str, Any]] = {}
    for node_id in check.node_ids:
        if node_id in skipped:
            out[node_id] = _entry("skipped", [f"{check.kind}: skipped: {skipped[node_id]}"])
            continue
        if status in (CheckStatus.ERROR, CheckStatus.CANCELLED):
            why = check.detail or status.value
            out[node_id] = _entry("fail", [f"{check.kind}: the check run {status.value}: {why}"])
            continue
        mine = stored.get(node_id)
        if not isinstance(mine, Mapping):
            out[node_id] = _entry("fail", [f"{check.kind}: no verdict for this node"])
            continue
        outcome = str(mine.get("outcome", "fail"))
        reasons = _messages(mine.get("reasons"))
        if outcome == "fail" and not reasons:
            reasons = _messages(result.get("reasons")) or [f"{check.kind} failed"]
        out[node_id] = {
            "outcome": outcome if outcome in _RANK else "fail",
            "reasons": [f"{check.kind}: {m}" for m in reasons],
            "figures": dict(mine.get("figures") or {}),
            "gpus": {str(k): dict(v) for k, v in (mine.get("gpus") or {}).items()},
            "hcas": {str(k): dict(v) for k, v in (mine.get("hcas") or {}).items()},
        }
    return out


def _entry(outcome: str, reasons: list[str]) -> dict[str, Any]:
    return {"outcome": outcome, "reasons": reasons, "figures": {}, "gpus": {}, "hcas": {}}


def localised(check: CheckRunRow, names: Mapping[str, str]) -> tuple[set[str], set[str], bool]:
    """What a failed multi-node run (or its localisation) pinned: (node ids that are bad,
    node ids cleared as good, whether anything was pinned at all)."""
    by_name = {name: node_id for node_id, name in names.items()}
    result = check.result or {}
    loc = result.get("localisation") or result.get("localization") or {}
    bad: set[str] = set()
    good: set[str] = set()
    if isinstance(loc, Mapping):
        for ref in loc.get("bad_nodes") or []:
            bad.add(by_name.get(str(ref), str(ref)))
        for link in loc.get("bad_links") or []:
            for ref in link if isinstance(link, list) else []:
                bad.add(by_name.get(str(ref), str(ref)))
        for ref in loc.get("good") or []:
            good.add(by_name.get(str(ref), str(ref)))
    # Reasons that name a host blame it even without localisation (a crash on that host).
    for node_id, entry in (result.get("nodes") or {}).items():
        if isinstance(entry, Mapping) and any(
            isinstance(r, Mapping) and r.get("outcome") == "fail" and r.get("node")
            for r in entry.get("reasons") or []
        ):
            bad.add(str(node_id))
    bad &= set(check.node_ids)
    good = (good & set(check.node_ids)) - bad
    return bad, good, bool(bad)


# -- the report ---------------------------------------------------------------------------


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def build_report(
    *,
    run: AcceptanceRunRow,
    cluster: ClusterRow,
    nodes: Sequence[NodeRow],
    gpus: Mapping[str, Sequence[GpuRow]],
    checks: Sequence[tuple[CheckEntry, CheckRunRow | None]],
    outcomes: Mapping[str, Mapping[str, Any]],
    status: str,
    detail: str,
) -> dict[str, Any]:
    """The report of a finished run (JSON-ready; see the module docstring)."""
    per_check = {
        entry.check_run_id: node_results(row) if row is not None else {} for entry, row in checks
    }
    node_list = []
    counts = {"pass": 0, "warn": 0, "fail": 0, "skipped": 0, "pending": 0}
    failed_names: list[str] = []
    for node in sorted(nodes, key=lambda n: n.name):
        verdict = outcomes.get(node.id) or {"outcome": "pending", "reasons": []}
        outcome = str(verdict.get("outcome", "pending"))
        counts[outcome if outcome in counts else "fail"] += 1
        if outcome == "fail":
            failed_names.append(node.name)
        node_checks = []
        gpu_checks: dict[str, dict[str, Any]] = {}
        for entry, row in checks:
            if node.id not in entry.node_ids:
                continue
            mine = per_check[entry.check_run_id].get(node.id)
            node_checks.append(
                {
                    "check_run_id": entry.check_run_id,
                    "label": entry.label,
                    "kind": entry.kind,
                    "stage": entry.stage.value,
                    "outcome": mine["outcome"] if mine else "pending",
                    "reasons": mine["reasons"] if mine else [],
                    "figures": mine["figures"] if mine else {},
                    "hcas": _hcas(mine["hcas"]) if mine else [],
                    "status": row.status if row is not None else "missing",
                }
            )
            for index, gpu in (mine or {}).get("gpus", {}).items():
                gpu_checks.setdefault(index, {})[entry.label] = {
                    "outcome": str(gpu.get("outcome", "pass")),
                    "figures": dict(gpu.get("figures") or {}),
                    "reasons": _messages(gpu.get("reasons")),
                }
        live = sorted(gpus.get(node.id, []), key=lambda g: g.index)
        indices = sorted({*(str(g.index) for g in live), *gpu_checks}, key=_index_key)
        by_index = {str(g.index): g for g in live}
        gpu_list = []
        for index in indices:
            row_gpu = by_index.get(index)
            judged = gpu_checks.get(index, {})
            gpu_list.append(
                {
                    "index": int(index) if index.isdigit() else index,
                    "uuid": row_gpu.uuid if row_gpu else None,
                    "serial": row_gpu.serial if row_gpu else None,
                    "model": row_gpu.model if row_gpu else None,
                    "outcome": worst([c["outcome"] for c in judged.values()]) if judged else None,
                    "checks": judged,
                }
            )
        node_list.append(
            {
                "id": node.id,
                "name": node.name,
                "hostname": node.hostname,
                "serial": node.serial,
                "provider_instance_id": node.provider_instance_id,
                "rack": node.rack,
                "leaf_switch": node.leaf_switch,
                "outcome": outcome,
                "reasons": list(verdict.get("reasons") or []),
                "checks": node_checks,
                "gpus": gpu_list,
            }
        )
    check_list = []
    for entry, row in checks:
        result = (row.result or {}) if row is not None else {}
        check_list.append(
            {
                "check_run_id": entry.check_run_id,
                "label": entry.label,
                "kind": entry.kind,
                "stage": entry.stage.value,
                "status": row.status if row is not None else "missing",
                "outcome": result.get("outcome"),
                "params": dict(row.params or {}) if row is not None else {},
                "nodes": len(entry.node_ids),
                "gpu_model": result.get("gpu_model"),
                "fabric": result.get("fabric"),
                "thresholds": _thresholds(
                    entry.kind, (row.params or {}) if row is not None else {}, result
                ),
                "figures": dict(result.get("figures") or {}),
                "reasons": _messages(result.get("reasons")),
                "localisation": result.get("localisation"),
                "stand_in": bool(result.get("stand_in", False)),
                "detail": row.detail if row is not None else "the check run is gone",
                "started_at": _iso(row.started_at) if row is not None else None,
                "finished_at": _iso(row.finished_at) if row is not None else None,
                "raw_output": f"/api/v1/checks/{entry.check_run_id}/output",
            }
        )
    return {
        "schema": SCHEMA,
        "run": {
            "id": run.id,
            "trigger": run.trigger,
            "scope": run.scope,
            "status": status,
            "detail": detail,
            "repair_id": run.repair_id,
            "created_by": run.created_by,
            "created_at": _iso(run.created_at),
            "started_at": _iso(run.started_at),
        },
        "cluster": {
            "id": cluster.id,
            "name": cluster.name,
            "project_id": cluster.project_id,
            "gpu_model": cluster.gpu_model,
            "gpus_per_node": cluster.gpus_per_node,
            "scheduler": cluster.scheduler,
            "provider": cluster.provider,
        },
        "suite": run.suite,
        "summary": {
            "outcome": "pass" if status == "passed" else "fail",
            "nodes": len(node_list),
            "passed": counts["pass"],
            "warned": counts["warn"],
            "failed": counts["fail"],
            "skipped": counts["skipped"],
            "not_judged": counts["pending"],
            "failed_nodes": failed_names,
        },
        "checks": check_list,
        "nodes": node_list,
    }


def _index_key(index: str) -> tuple[int, str]:
    return (int(index), "") if index.isdigit() else (1 << 30, index)


def _hcas(hcas: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "hca": name,
            "outcome": value.get("outcome"),
            "peer": value.get("peer"),
            "bw_avg_gbits": value.get("bw_avg_gbits"),
            "msg_bytes": value.get("msg_bytes"),
        }
        for name, value in sorted(hcas.items())
    ]


def _thresholds(kind: str, params: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """The limits a check's verdicts applied, from the shipped thresholds table, for the
    GPU model and fabric the run was judged against (none: correctness only)."""
    table = get_thresholds()
    model, fabric = result.get("gpu_model"), result.get("fabric")
    try:
        if kind == "dcgm-diag":
            return {"rule": "every DCGM test must report Pass (DCGM's own limits)"}
        if kind == "gpu-burn":
            pct = table.gpu_burn.slow_gpu_below_median_pct
            return {"rule": "no faulty GPU", "slow_gpu_below_median_pct": pct}
        if kind == "nccl" and params.get("scope") == "multi-node":
            if not fabric:
                return {"rule": "completion and correctness only (no fabric given)"}
            return {"busbw_gbytes": _limit(table.nccl_multi_node(str(fabric)))}
        if kind == "nccl":
            if not model:
                return {"rule": "completion and correctness only (GPU model not in the table)"}
            return {"busbw_gbytes": _limit(table.nccl_single_node(str(model)))}
        if kind == "ib-write-bw":
            if not fabric:
                return {"rule": "completion only (no fabric given)"}
            return {"bw_avg_gbits": _limit(table.ib_write_bw(str(fabric)))}
    except UnknownName as exc:
        return {"rule": f"not judged against limits: {exc}"}
    return {}


def _limit(limit: Limit) -> dict[str, Any]:
    return {
        "expected": limit.expected,
        "warn_below": limit.warn_below,
        "fail_below": limit.fail_below,
        "source": limit.source,
    }


# -- HTML -------------------------------------------------------------------------------


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FunctionLoader(_load),
        autoescape=True,  # every value is escaped; the page has no script at all
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _load(name: str) -> str:
    return (resources.files("gpufleet.server.services") / name).read_text(encoding="utf-8")


def render_html(report: Mapping[str, Any], *, sha256: str) -> str:
    """One page, no external assets (styles inline, no scripts, no images)."""
    return _environment().get_template(TEMPLATE).render(report=report, sha256=sha256)
