"""Acceptance tests as data: the per-cluster suite, the run's read model, the report hash.

A cluster's suite is a list of active checks, each at node scope (every node judged on its
own: DCGM diag, single-node NCCL over NVLink, ib_write_bw per HCA) or cluster scope (one
run across every node that passed the node-level checks: multi-node NCCL all-reduce).
Pure: no I/O. The server runs the suite (``server/services/acceptance.py``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from enum import StrEnum
from functools import cache
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.core.enums import AcceptanceStage

# The active checks a suite may name, as ``gpufleet checks`` spells them.
CheckName = Literal["dcgm-diag", "nccl", "ib-write-bw", "gpu-burn"]
ParamValue: TypeAlias = int | float | str | bool | list[str]
MAX_SUITE_CHECKS = 16


class AcceptanceScope(StrEnum):
    NODE = "node"  # each node on its own
    CLUSTER = "cluster"  # one run across the nodes (multi-node NCCL)


class AcceptanceTrigger(StrEnum):
    PROVISIONING = "provisioning"  # a new cluster (or new nodes) came up
    REPAIR = "repair"  # re-acceptance of a repaired node before it takes work
    MANUAL = "manual"  # an admin asked for it


class AcceptanceStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    PASSED = "passed"
    FAILED = "failed"  # a check failed on at least one node (the run names it)
    ERROR = "error"  # the suite could not be carried out (timed out, no check backend)
    CANCELLED = "cancelled"


OPEN_STATUSES = frozenset({AcceptanceStatus.PENDING, AcceptanceStatus.RUNNING})


class SuiteCheck(BaseModel):
    """One check of the suite. ``params`` go to the check run as given (e.g. ``level``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    kind: CheckName
    scope: AcceptanceScope = AcceptanceScope.NODE
    params: Annotated[
        dict[Annotated[str, Field(max_length=40)], ParamValue], Field(max_length=16)
    ] = {}

    @model_validator(mode="after")
    def _cluster_scope_is_nccl(self) -> SuiteCheck:
        if self.scope is AcceptanceScope.CLUSTER and self.kind != "nccl":
            raise ValueError(
                f"{self.kind} runs per node; only nccl runs at cluster scope (multi-node)"
            )
        if "scope" in self.params:
            raise ValueError("give the scope as the check's scope (node | cluster), not a param")
        return self

    def check_params(self) -> dict[str, ParamValue]:
        """The check run's parameters: ``params`` plus, for nccl, its scope."""
        out = dict(self.params)
        if self.kind == "nccl":
            cluster = self.scope is AcceptanceScope.CLUSTER
            out["scope"] = "multi-node" if cluster else "per-node"
        return out

    @property
    def label(self) -> str:
        """Short and stable: ``dcgm-diag (level 3)``, ``nccl (cluster)``."""
        shown = ", ".join(f"{k} {v}" for k, v in sorted(self.params.items()))
        where = "cluster" if self.scope is AcceptanceScope.CLUSTER else ""
        inner = "; ".join(x for x in (where, shown) if x)
        return f"{self.kind} ({inner})" if inner else self.kind


class AcceptanceSuite(BaseModel):
    """What a cluster must pass before it is ready and a node before it takes work."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    checks: Annotated[list[SuiteCheck], Field(min_length=1, max_length=MAX_SUITE_CHECKS)]
    # A run not finished within this is an error (a hung check never passes).
    timeout_s: Annotated[float, Field(gt=0, le=2 * 86400)] = 3600.0
    # The fabric ib_write_bw and the cluster-wide NCCL are judged against (NDR, HDR,
    # EDR). None: HDR for A100 clusters, NDR for the rest; "none": bandwidth not judged.
    fabric: Annotated[str, Field(min_length=1, max_length=32)] | None = None

    def fabric_for(self, gpu_model: str) -> str | None:
        if self.fabric is not None:
            return None if self.fabric.lower() == "none" else self.fabric
        return "HDR" if "A100" in gpu_model else "NDR"

    def node_checks(self) -> list[SuiteCheck]:
        return [c for c in self.checks if c.scope is AcceptanceScope.NODE]

    def cluster_checks(self) -> list[SuiteCheck]:
        return [c for c in self.checks if c.scope is AcceptanceScope.CLUSTER]


# nccl is all_reduce_perf: at node scope one run per node over NVLink, at cluster scope
# one run across the nodes over the fabric. ib-write-bw tests every HCA of each node
# (client of one neighbour, server of the other).
@cache
def default_suite() -> AcceptanceSuite:
    """The suite a cluster runs until it sets its own (built on first use: building it
    at import would build the models' validators in every process that imports them,
    the CLI's included)."""
    return AcceptanceSuite(
        checks=[
            SuiteCheck(kind="dcgm-diag", params={"level": 3}),
            SuiteCheck(kind="nccl"),
            SuiteCheck(kind="ib-write-bw"),
            SuiteCheck(kind="nccl", scope=AcceptanceScope.CLUSTER),
        ]
    )


def suite_or_default(value: dict[str, Any] | None) -> AcceptanceSuite:
    """The stored suite (JSON), or the default for a cluster that never set one."""
    return default_suite() if not value else AcceptanceSuite.model_validate(value)


class AcceptanceNode(BaseModel):
    """One node's result in a run, as the run list shows it (the report has the figures)."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    node_id: str
    name: str
    outcome: str  # pending | pass | warn | fail | skipped
    reasons: list[str] = []


class AcceptanceRun(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)

    id: str
    cluster_id: str
    scope: AcceptanceScope
    trigger: AcceptanceTrigger
    status: AcceptanceStatus
    stage: AcceptanceStage
    node_ids: list[str]
    check_run_ids: list[str]
    repair_id: str | None
    detail: str
    failed_nodes: list[str]  # names of the nodes that did not pass
    nodes: list[AcceptanceNode] | None = None  # on show
    suite: AcceptanceSuite
    report_sha256: str | None
    created_by: str
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


def canonical_json(value: Any) -> bytes:
    """The one byte form of a report that its hash is taken over: sorted keys, no spaces,
    UTF-8, no NaN. Parsing it and calling this again gives the same bytes."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def content_hash(value: Any) -> str:
    """SHA-256 (hex) of ``canonical_json(value)``."""
    return hashlib.sha256(canonical_json(value)).hexdigest()
