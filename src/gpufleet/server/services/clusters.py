"""Clusters: create, list, show, update (PATCH), status, delete."""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Sequence

from sqlalchemy import Select, bindparam, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.checks.models import CheckKind
from gpufleet.checks.runners import normalise_params
from gpufleet.checks.thresholds import UnknownName, get_thresholds
from gpufleet.core.acceptance import AcceptanceSuite, suite_or_default
from gpufleet.core.clock import utcnow
from gpufleet.core.enums import (
    ClusterStatus,
    EventKind,
    Health,
    NodeState,
    ProviderKind,
    SchedulerKind,
)
from gpufleet.core.errors import Conflict, InvalidInput, NotFound
from gpufleet.core.gpu_models import GPU_MODELS
from gpufleet.core.health import shown_health
from gpufleet.core.ids import is_id, new_id
from gpufleet.core.models import Cluster, NodeCounts, Page, SchedulerConfig
from gpufleet.core.providers import ProviderConfig
from gpufleet.core.rbac import Permission
from gpufleet.core.transitions import CLUSTER
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import ClusterRow, GpuRow, NodeRow, ProjectRow
from gpufleet.server.drivers import DriverRegistry
from gpufleet.server.schemas.clusters import CreateClusterRequest, UpdateClusterRequest
from gpufleet.server.services.audit import record_audit
from gpufleet.server.services.auth import Caller, require
from gpufleet.server.services.events import record_event
from gpufleet.server.services.keyring import Keyring
from gpufleet.server.services.kube_clusters import (
    KubeAccess,
    audited_request,
    check_kube_fields,
    describe_kube_access,
    reach_kube_api,
    store_kube_access,
)
from gpufleet.server.services.kube_schedulers import scheduler_config_of
from gpufleet.server.services.projects import get_project_row_or_error
from gpufleet.server.services.provider_configs import check_provider_config
from gpufleet.server.services.stacks import stack_for_new_cluster
from gpufleet.server.services.transitions import Subject, transition


def node_name(cluster: ClusterRow, slot: int) -> str:
    """Stable per slot, so a re-run of provisioning finds the row it made before."""
    prefix = cluster.node_prefix if cluster.node_prefix is not None else f"{cluster.name}-"
    return f"{prefix}{cluster.first_node_index + slot:03d}"


def cluster_row_to_cluster(row: ClusterRow, *, counts: NodeCounts | None = None) -> Cluster:
    return Cluster(
        id=row.id,
        project_id=row.project_id,
        name=row.name,
        scheduler=SchedulerKind(row.scheduler),
        provider=ProviderKind(row.provider),
        gpu_model=row.gpu_model,
        gpus_per_node=row.gpus_per_node,
        size=row.size,
        status=ClusterStatus(row.status),
        health=Health(row.health),
        acceptance_tests=row.acceptance_tests,
        startup_scripts=list(row.startup_scripts),
        autoscale_min=row.autoscale_min,
        autoscale_max=row.autoscale_max,
        labels=dict(row.labels),
        stack=row.stack,
        node_prefix=row.node_prefix if row.node_prefix is not None else f"{row.name}-",
        first_node_index=row.first_node_index,
        created_at=row.created_at,
        updated_at=row.updated_at,
        nodes=counts,
        acceptance_suite=suite_or_default(row.acceptance_suite),
        status_detail=row.status_detail or "",
        scheduler_config=scheduler_config_of(row),
    )


# Built once; each node's live GPUs in the same statement: one round trip for every cluster.
_NODE_COUNTS = select(
    NodeRow.cluster_id,
    NodeRow.state,
    NodeRow.health,
    NodeRow.last_report_at,
    select(func.count(GpuRow.id))
    .where(GpuRow.node_id == NodeRow.id, GpuRow.removed_at.is_(None))
    .correlate(NodeRow)
    .scalar_subquery(),
).where(
    NodeRow.cluster_id.in_(bindparam("cluster_ids", expanding=True)),
    NodeRow.state != NodeState.REMOVED.value,
)


async def count_nodes(
    session: AsyncSession, *, cluster_ids: Sequence[str], staleness_s: float, now: dt.datetime
) -> dict[str, NodeCounts]:
    """Node counts by state and by (effective) health, and live GPUs, per cluster."""
    by_state: dict[str, dict[str, int]] = {c: {} for c in cluster_ids}
    by_health: dict[str, dict[str, int]] = {c: {} for c in cluster_ids}
    totals = dict.fromkeys(cluster_ids, 0)
    gpus = dict.fromkeys(cluster_ids, 0)
    if not cluster_ids:
        return {}
    rows = await session.execute(_NODE_COUNTS, {"cluster_ids": list(cluster_ids)})
    for cluster_id, state, health, last_report_at, node_gpus in rows:
        h = shown_health(
            Health(health), last_report_at=last_report_at, now=now, staleness_s=staleness_s
        ).value
        by_state[cluster_id][state] = by_state[cluster_id].get(state, 0) + 1
        by_health[cluster_id][h] = by_health[cluster_id].get(h, 0) + 1
        totals[cluster_id] += 1
        gpus[cluster_id] += int(node_gpus)
    return {
        c: NodeCounts(total=totals[c], by_state=by_state[c], by_health=by_health[c], gpus=gpus[c])
        for c in cluster_ids
    }


async def get_cluster_row_or_error(
    session: AsyncSession, *, caller: Caller, cluster_id: str
) -> ClusterRow:
    row = await session.get(ClusterRow, cluster_id) if is_id(cluster_id) else None
    if row is None or not caller.can(Permission.CLUSTER_READ, row.project_id):
        raise NotFound(f"cluster {cluster_id!r} not found", field="cluster_id")
    return row


async def get_cluster_or_error(
    session: AsyncSession, *, caller: Caller, cluster_id: str
) -> Cluster:
    """A cluster the caller may see, without node counts (cheaper than ``get_cluster``)."""
    row = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    return cluster_row_to_cluster(row)


async def check_cluster_access(
    db: Database,
    *,
    caller: Caller,
    request: CreateClusterRequest,
    drivers: DriverRegistry,
    keyring: Keyring,
) -> KubeAccess | None:
    """What a create must check on the network, before its transaction: for a kubernetes
    cluster, that its API server answers with the kubeconfig given (``None`` for the
    other schedulers). Everything ``create_cluster`` checks without the network is
    checked first, so a bad request is refused before anything is dialled."""
    if request.scheduler is not SchedulerKind.KUBERNETES:
        return None
    async with db.session() as session:
        await _check_create(session, caller=caller, request=request, drivers=drivers)
    return await reach_kube_api(request, drivers=drivers, keyring=keyring)


async def create_cluster(
    session: AsyncSession,
    *,
    caller: Caller,
    request: CreateClusterRequest,
    drivers: DriverRegistry,
    keyring: Keyring | None = None,
    kube: KubeAccess | None = None,
) -> Cluster:
    """Record the cluster and one node row per slot; the provisioning loop does the rest.

    A kubernetes cluster needs ``kube`` (``check_cluster_access``, made before this
    transaction) and the ``keyring`` that seals its kubeconfig, stored in this same
    transaction.
    """
    project, provider_config = await _check_create(
        session, caller=caller, request=request, drivers=drivers
    )
    if request.scheduler is not SchedulerKind.KUBERNETES:
        kube = None
    elif kube is None or keyring is None:
        raise InvalidInput(
            "scheduler: a kubernetes cluster is created with its API server checked first "
            "(POST /api/v1/clusters with kubeconfig or kube_in_cluster)",
            field="scheduler",
        )
    now = utcnow()
    row = ClusterRow(
        id=new_id(),
        project_id=project.id,
        name=request.name,
        scheduler=request.scheduler.value,
        provider=request.provider.value,
        gpu_model=request.gpu_model,
        gpus_per_node=request.gpus_per_node,
        size=request.size,
        status=ClusterStatus.PROVISIONING.value,
        health=Health.UNKNOWN.value,
        acceptance_tests=request.acceptance_tests,
        acceptance_suite=(
            request.acceptance_suite.model_dump(mode="json") if request.acceptance_suite else None
        ),
        status_detail="",
        startup_scripts=list(request.startup_scripts),
        autoscale_min=request.autoscale_min,
        autoscale_max=request.autoscale_max,
        labels=dict(request.labels),
        provider_config=provider_config.model_dump(mode="json"),
        node_prefix=request.node_prefix,
        first_node_index=request.first_node_index,
        stack=await stack_for_new_cluster(session, request.stack),
        created_at=now,
        updated_at=now,
        deleted_at=None,
    )
    scheduler_config: SchedulerConfig | None = None
    if kube is not None and keyring is not None:
        scheduler_config = store_kube_access(
            session, access=kube, cluster_id=row.id, project_id=project.id, caller=caller,
            keyring=keyring, now=now,
        )  # fmt: skip
        row.scheduler_config = scheduler_config.model_dump(mode="json")
    session.add(row)
    session.add_all(new_node_rows(row, slots=range(request.size), now=now))
    record_event(
        session,
        kind=EventKind.CLUSTER_CREATED,
        message=(
            f"cluster {row.name} created: {row.size} × {row.gpus_per_node} {row.gpu_model}, "
            f"provider {row.provider}, scheduler {row.scheduler}"
            + (f" ({describe_kube_access(kube)})" if kube is not None else "")
        ),
        project_id=project.id,
        cluster_id=row.id,
        actor=caller.actor,
        ts=now,
    )
    record_audit(
        session,
        actor=caller.actor,
        action="cluster.create",
        object_type="cluster",
        object_id=row.id,
        project_id=project.id,
        source_ip=caller.source_ip,
        detail=audited_request(request, scheduler_config),
    )
    if not request.acceptance_tests:
        _record_opt_out(
            session, cluster=row, caller=caller, reason="at creation", now=now, audit=False
        )
    try:
        await session.flush()
    except IntegrityError as exc:  # a concurrent create won the race for the name
        raise Conflict(
            f"project {project.name} already has a cluster named {request.name!r}", field="name"
        ) from exc
    counts = NodeCounts(
        total=row.size,
        by_state={NodeState.PROVISIONING.value: row.size},
        by_health={Health.UNKNOWN.value: row.size},
        gpus=0,
    )
    return cluster_row_to_cluster(row, counts=counts)


async def _check_create(
    session: AsyncSession, *, caller: Caller, request: CreateClusterRequest, drivers: DriverRegistry
) -> tuple[ProjectRow, ProviderConfig]:
    """Every check of a create that needs no network: the caller's role, the node spec,
    the drivers, the provider's configuration, bounds, suite, a free name."""
    project = await get_project_row_or_error(session, caller=caller, ref=request.project)
    require(caller, Permission.CLUSTER_CREATE, project.id)
    check_kube_fields(request)
    if request.gpu_model not in GPU_MODELS:
        known = "; ".join(sorted(GPU_MODELS))
        raise InvalidInput(
            f"unknown gpu_model {request.gpu_model!r} (known: {known})", field="gpu_model"
        )
    drivers.check_provider(request.provider.value)
    drivers.check_scheduler(request.scheduler.value)
    provider_config = await check_provider_config(
        session, project_id=project.id, kind=request.provider, raw=request.provider_config
    )
    _check_bounds(size=request.size, lo=request.autoscale_min, hi=request.autoscale_max)
    check_suite(request.acceptance_suite)
    if await _live_cluster_named(session, project_id=project.id, name=request.name):
        raise Conflict(
            f"project {project.name} already has a cluster named {request.name!r}", field="name"
        )
    return project, provider_config


def _check_bounds(*, size: int, lo: int | None, hi: int | None) -> None:
    if lo is not None and hi is not None and lo > hi:
        raise InvalidInput("autoscale_min must not exceed autoscale_max", field="autoscale_min")
    if hi is not None and size > hi:
        raise InvalidInput("size must not exceed autoscale_max", field="size")
    if lo is not None and size < lo:
        raise InvalidInput("size must not be below autoscale_min", field="size")


def check_suite(suite: AcceptanceSuite | None) -> None:
    """Every check's parameters as the check runner takes them, and a fabric the
    thresholds know (422 naming the one that is wrong)."""
    if suite is None:
        return
    if suite.fabric is not None and suite.fabric.lower() != "none":
        try:
            get_thresholds().resolve_fabric(suite.fabric)
        except UnknownName as exc:
            raise InvalidInput(
                f"acceptance_suite.fabric: {exc} (or none: bandwidth not judged)",
                field="acceptance_suite.fabric",
            ) from None
    for i, check in enumerate(suite.checks):
        try:
            normalise_params(CheckKind(check.kind), check.check_params(), nodes=2)
        except InvalidInput as exc:
            raise InvalidInput(
                f"acceptance_suite.checks[{i}] ({check.kind}): {exc.message}",
                field=f"acceptance_suite.checks[{i}].{exc.field or 'params'}",
            ) from None


def _record_opt_out(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    caller: Caller,
    reason: str,
    now: dt.datetime,
    audit: bool = True,
) -> None:
    """Acceptance tests turned off (or back on): an event on the timeline and an audit row
    (at creation the ``cluster.create`` row is that row: its detail has the opt-out)."""
    on = cluster.acceptance_tests
    what = "turned back on" if on else "turned off (opt-out): nodes skip the suite"
    record_event(
        session,
        kind=EventKind.ACCEPTANCE_OPT_OUT,
        message=f"cluster {cluster.name}: acceptance tests {what}"
        + (f": {reason}" if reason else ""),
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        actor=caller.actor,
        data={"acceptance_tests": on, "reason": reason},
        ts=now,
    )
    if not audit:
        return
    record_audit(
        session,
        actor=caller.actor,
        action="cluster.acceptance_opt_in" if on else "cluster.acceptance_opt_out",
        object_type="cluster",
        object_id=cluster.id,
        project_id=cluster.project_id,
        source_ip=caller.source_ip,
        detail={"acceptance_tests": on, "reason": reason},
    )


async def update_cluster(
    session: AsyncSession,
    *,
    caller: Caller,
    cluster_id: str,
    request: UpdateClusterRequest,
    staleness_s: float,
    now: dt.datetime,
) -> Cluster:
    """Change what a cluster runs at node start and before it takes work, and its
    autoscaling bounds (admins). Only the fields the body names change; a new suite or new
    scripts apply from the next run or node start, never to one under way."""
    row = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    require(caller, Permission.CLUSTER_CREATE, row.project_id)
    if ClusterStatus(row.status) in (ClusterStatus.DELETING, ClusterStatus.DELETED):
        raise Conflict(f"cluster {row.name} is {row.status}; it cannot be changed")
    await session.refresh(row, with_for_update=True)
    given = request.model_fields_set - {"reason"}
    if not given:
        raise InvalidInput(
            "nothing to change: give one of acceptance_tests, acceptance_suite, "
            "startup_scripts, autoscale_min, autoscale_max"
        )
    if "acceptance_tests" in given and request.acceptance_tests is None:
        raise InvalidInput("acceptance_tests is true or false", field="acceptance_tests")
    if "startup_scripts" in given and request.startup_scripts is None:
        raise InvalidInput("startup_scripts is a list ([] for none)", field="startup_scripts")
    lo = request.autoscale_min if "autoscale_min" in given else row.autoscale_min
    hi = request.autoscale_max if "autoscale_max" in given else row.autoscale_max
    _check_bounds(size=row.size, lo=lo, hi=hi)
    check_suite(request.acceptance_suite)
    before = _spec(row)
    if request.acceptance_tests is not None:
        row.acceptance_tests = request.acceptance_tests
    if "acceptance_suite" in given:
        suite = request.acceptance_suite
        row.acceptance_suite = suite.model_dump(mode="json") if suite is not None else None
    if request.startup_scripts is not None:
        row.startup_scripts = list(request.startup_scripts)
    row.autoscale_min, row.autoscale_max = lo, hi
    after = _spec(row)
    changed = sorted(k for k in after if after[k] != before[k])
    if changed:
        row.updated_at = now
        record_event(
            session,
            kind=EventKind.CLUSTER_UPDATED,
            message=f"cluster {row.name}: {', '.join(changed)} changed by {caller.actor}"
            + (f": {request.reason}" if request.reason else ""),
            project_id=row.project_id,
            cluster_id=row.id,
            actor=caller.actor,
            data={"changed": changed, "reason": request.reason},
            ts=now,
        )
    # Every mutation is audited, one that changed nothing too (changed: []).
    record_audit(
        session,
        actor=caller.actor,
        action="cluster.update",
        object_type="cluster",
        object_id=row.id,
        project_id=row.project_id,
        source_ip=caller.source_ip,
        # Scripts may hold site details: the audit names that they changed, and their
        # digest, not their text.
        detail={
            "changed": changed,
            "reason": request.reason,
            "before": _audit_spec(before),
            "after": _audit_spec(after),
        },
    )
    if "acceptance_tests" in changed:
        _record_opt_out(session, cluster=row, caller=caller, reason=request.reason, now=now)
    counts = await count_nodes(session, cluster_ids=[row.id], staleness_s=staleness_s, now=now)
    return cluster_row_to_cluster(row, counts=counts[row.id])


def _spec(row: ClusterRow) -> dict[str, object]:
    return {
        "acceptance_tests": row.acceptance_tests,
        "acceptance_suite": row.acceptance_suite,
        "startup_scripts": list(row.startup_scripts or []),
        "autoscale_min": row.autoscale_min,
        "autoscale_max": row.autoscale_max,
    }


def _audit_spec(spec: dict[str, object]) -> dict[str, object]:
    scripts = spec["startup_scripts"]
    assert isinstance(scripts, list)
    return {
        **spec,
        "startup_scripts": [hashlib.sha256(str(s).encode()).hexdigest()[:16] for s in scripts],
    }


def new_node_rows(
    cluster: ClusterRow, *, slots: range | list[int], now: dt.datetime
) -> list[NodeRow]:
    return [new_node_row(cluster, name=node_name(cluster, slot), now=now) for slot in slots]


def new_node_row(cluster: ClusterRow, *, name: str, now: dt.datetime) -> NodeRow:
    """A node of ``cluster`` called ``name``, to be provisioned."""
    return NodeRow(
        id=new_id(),
        cluster_id=cluster.id,
        name=name,
        state=NodeState.PROVISIONING.value,
        health=Health.UNKNOWN.value,
        expected_gpus=cluster.gpus_per_node,
        last_report_seq=0,
        provision_attempts=0,
        created_at=now,
        updated_at=now,
    )


async def _live_cluster_named(session: AsyncSession, *, project_id: str, name: str) -> bool:
    found = await session.scalar(
        select(ClusterRow.id).where(
            ClusterRow.project_id == project_id,
            ClusterRow.name == name,
            ClusterRow.deleted_at.is_(None),
        )
    )
    return found is not None


async def list_clusters(
    session: AsyncSession,
    *,
    caller: Caller,
    staleness_s: float,
    now: dt.datetime,
    project_ref: str | None = None,
    name: str | None = None,
    status: ClusterStatus | None = None,
) -> Page[Cluster]:
    query: Select[ClusterRow] = select(ClusterRow).order_by(ClusterRow.created_at)
    visible = caller.visible_project_ids()
    if project_ref is not None:
        project = await get_project_row_or_error(session, caller=caller, ref=project_ref)
        query = query.where(ClusterRow.project_id == project.id)
    elif visible is not None:
        query = query.where(ClusterRow.project_id.in_(visible))
    if name is not None:
        query = query.where(ClusterRow.name == name)
    if status is not None:
        query = query.where(ClusterRow.status == status.value)
    else:
        query = query.where(ClusterRow.status != ClusterStatus.DELETED.value)
    rows = (await session.scalars(query)).all()
    counts = await count_nodes(
        session, cluster_ids=[r.id for r in rows], staleness_s=staleness_s, now=now
    )
    return Page[Cluster](
        items=[cluster_row_to_cluster(r, counts=counts.get(r.id)) for r in rows], next_cursor=None
    )


async def get_cluster(
    session: AsyncSession, *, caller: Caller, cluster_id: str, staleness_s: float, now: dt.datetime
) -> Cluster:
    row = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    counts = await count_nodes(session, cluster_ids=[row.id], staleness_s=staleness_s, now=now)
    return cluster_row_to_cluster(row, counts=counts[row.id])


async def delete_cluster(
    session: AsyncSession, *, caller: Caller, cluster_id: str, now: dt.datetime
) -> Cluster:
    """Mark for deletion; the provisioning loop gives the machines back, then marks deleted."""
    row = await get_cluster_row_or_error(session, caller=caller, cluster_id=cluster_id)
    require(caller, Permission.CLUSTER_DELETE, row.project_id)
    if ClusterStatus(row.status) in (ClusterStatus.DELETING, ClusterStatus.DELETED):
        record_audit(  # asked again: nothing changes, but the ask is on record
            session,
            actor=caller.actor,
            action="cluster.delete",
            object_type="cluster",
            object_id=row.id,
            project_id=row.project_id,
            source_ip=caller.source_ip,
            detail={"status": row.status, "changed": False},
            ts=now,
        )
        return cluster_row_to_cluster(row)
    switch_cluster_status(
        session,
        cluster=row,
        target=ClusterStatus.DELETING,
        actor=caller.actor,
        reason="deletion requested",
        now=now,
        source_ip=caller.source_ip,
    )
    return cluster_row_to_cluster(row)


def switch_cluster_status(
    session: AsyncSession,
    *,
    cluster: ClusterRow,
    target: ClusterStatus,
    actor: str,
    reason: str,
    now: dt.datetime,
    source_ip: str | None = None,
) -> bool:
    """The one way a cluster changes status: checked, evented, audited. False if unchanged."""
    subject = Subject(
        object_id=cluster.id,
        label=f"cluster {cluster.name}",
        project_id=cluster.project_id,
        cluster_id=cluster.id,
        node_id=None,
    )
    if not transition(
        session, lifecycle=CLUSTER, row=cluster, subject=subject, target=target, actor=actor,
        reason=reason, now=now, source_ip=source_ip,
    ):  # fmt: skip
        return False
    cluster.updated_at = now
    if target is ClusterStatus.DELETED:
        cluster.deleted_at = now
    return True
