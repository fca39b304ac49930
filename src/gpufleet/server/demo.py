"""The demo: a project, a simulated cluster of 16 × 8 H100 and an autoscaled inference
cluster fed a compressed demand trace, on embedded defaults."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpufleet.core.acceptance import AcceptanceScope, AcceptanceSuite, SuiteCheck
from gpufleet.core.autoscaling import AutoscaleMode
from gpufleet.core.enums import ProviderKind, SchedulerKind
from gpufleet.core.errors import Unauthorized
from gpufleet.core.gpu_models import DEFAULT_GPU_MODEL
from gpufleet.core.repair.models import DrainTimeoutAction
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.context import AppContext
from gpufleet.server.db.tables import ClusterRow, ProjectRow, RepairPolicyRow, UserRow
from gpufleet.server.demo_slurm import DEMO_SLURM_CLUSTER, SlurmDemo
from gpufleet.server.schemas.autoscale import SetAutoscaleRequest
from gpufleet.server.schemas.clusters import CreateClusterRequest
from gpufleet.server.schemas.repairs import RepairPolicyRequest
from gpufleet.server.services.auth import Caller, create_api_token, resolve_caller
from gpufleet.server.services.autoscale_settings import set_autoscale
from gpufleet.server.services.clusters import create_cluster
from gpufleet.server.services.projects import create_project
from gpufleet.server.services.repair_policy import set_policy
from gpufleet.sim.demand import TraceJob, bursty_inference

DEMO_PROJECT = "demo"
DEMO_CLUSTER = "demo"
# An inference cluster that follows its demand: gpufleet's autoscaler, fed a week of the
# bursty-inference trace compressed so a day passes in an hour.
DEMO_INFERENCE_CLUSTER = "inference"
DEMO_TRACE_DAYS = 7
DEMO_TRACE_SPEEDUP = 24.0
DEMO_AUTOSCALE = SetAutoscaleRequest(
    mode=AutoscaleMode.GPUFLEET,
    min_nodes=1,
    max_nodes=8,
    scale_up_after_s=30.0,
    scale_down_after_s=180.0,
    up_cooldown_s=30.0,
    down_cooldown_s=60.0,
    max_step=4,
    reason="demo: capacity follows the inference trace",
)
DEMO_NODES = 16
DEMO_GPUS_PER_NODE = 8
TOKEN_FILE = "demo-token"  # noqa: S105 - a file name
# The default acceptance suite with one HCA instead of eight (each node's agent runs one
# command at a time): with the demo's sped-up check tools the cluster is ready in a
# minute or so.
DEMO_ACCEPTANCE_SUITE = AcceptanceSuite(
    checks=[
        SuiteCheck(kind="dcgm-diag", params={"level": 3}),
        SuiteCheck(kind="nccl"),
        SuiteCheck(kind="ib-write-bw", params={"hcas": ["mlx5_0"]}),
        SuiteCheck(kind="nccl", scope=AcceptanceScope.CLUSTER),
    ]
)
# Demo-sized waits: a drain gives jobs 2 minutes, then requeues them; a repaired node is
# watched for 10 s. Nothing is auto-approved: repairs wait for `gpufleet repairs approve`.
DEMO_REPAIR_POLICY = RepairPolicyRequest(
    drain_timeout_s=120.0,
    drain_timeout_action=DrainTimeoutAction.REQUEUE,
    verify_settle_s=10.0,
    verify_timeout_s=300.0,
    breaker_max_share=0.25,
)


def console_banner(public_url: str) -> str:
    """The line that tells a person where the web console is and how to log in."""
    return (
        f"gpufleet demo: web console at {public_url.rstrip('/')}/ "
        "(log in with the GPUFLEET_TOKEN above)"
    )


async def prepare_demo(ctx: AppContext, *, slurm: SlurmDemo | None = None) -> str:
    """Make sure the demo project, cluster and an admin token exist; return the token.

    With ``slurm``, also the cluster ``slurm`` on that Slurm lab's nodes. Idempotent: a
    second start on the same data dir reuses the fleet and the token.
    """
    token = await _demo_token(ctx)
    async with ctx.db.transaction() as session:
        caller = await resolve_caller(session, token=token)
        project = await session.scalar(select(ProjectRow).where(ProjectRow.name == DEMO_PROJECT))
        if project is None:
            await create_project(
                session, caller=caller, name=DEMO_PROJECT, description="The simulated demo fleet"
            )
    async with ctx.db.transaction() as session:
        caller = await resolve_caller(session, token=token)
        project = await session.scalar(select(ProjectRow).where(ProjectRow.name == DEMO_PROJECT))
        assert project is not None
        await _ensure_cluster(
            ctx,
            session,
            caller=caller,
            project=project,
            request=CreateClusterRequest(
                project=DEMO_PROJECT,
                name=DEMO_CLUSTER,
                scheduler=SchedulerKind.SIM,
                provider=ProviderKind.SIM,
                gpu_model=DEFAULT_GPU_MODEL,
                gpus_per_node=DEMO_GPUS_PER_NODE,
                size=DEMO_NODES,
                # On check tools sped up 100× (demo_settings).
                acceptance_tests=True,
                acceptance_suite=DEMO_ACCEPTANCE_SUITE,
            ),
        )
        inference = await _ensure_cluster(
            ctx,
            session,
            caller=caller,
            project=project,
            request=CreateClusterRequest(
                project=DEMO_PROJECT,
                name=DEMO_INFERENCE_CLUSTER,
                scheduler=SchedulerKind.SIM,
                provider=ProviderKind.SIM,
                gpu_model=DEFAULT_GPU_MODEL,
                gpus_per_node=DEMO_GPUS_PER_NODE,
                size=2,
                acceptance_tests=True,
                acceptance_suite=DEMO_ACCEPTANCE_SUITE,
                autoscale_min=DEMO_AUTOSCALE.min_nodes,
                autoscale_max=DEMO_AUTOSCALE.max_nodes,
            ),
        )
        if inference is not None:
            await set_autoscale(
                session, caller=caller, cluster_id=inference, request=DEMO_AUTOSCALE,
                now=ctx.clock.now(),
            )  # fmt: skip
        if slurm is not None:
            # The lab's nodes as the cluster ``slurm``: sim machines, real Slurm scheduling.
            await _ensure_cluster(
                ctx,
                session,
                caller=caller,
                project=project,
                request=CreateClusterRequest(
                    project=DEMO_PROJECT,
                    name=DEMO_SLURM_CLUSTER,
                    scheduler=SchedulerKind.SLURM,
                    provider=ProviderKind.SIM,
                    gpu_model=DEFAULT_GPU_MODEL,
                    gpus_per_node=slurm.gpus_per_node,
                    size=slurm.size,
                    acceptance_tests=False,
                    node_prefix=slurm.node_prefix,
                    first_node_index=slurm.first_index,
                ),
            )
    if inference is not None:
        _feed_inference(ctx, inference)
    async with ctx.db.transaction() as session:
        project = await session.scalar(select(ProjectRow).where(ProjectRow.name == DEMO_PROJECT))
        assert project is not None
        if await session.get(RepairPolicyRow, project.id) is None:
            caller = await resolve_caller(session, token=token)
            await set_policy(
                session,
                caller=caller,
                project_id=project.id,
                request=DEMO_REPAIR_POLICY,
                now=ctx.clock.now(),
            )
    return token


def _feed_inference(ctx: AppContext, cluster_id: str) -> None:
    """The inference cluster's users: only the trace's jobs run there (no synthetic
    background load), a day of them an hour. The world keeps the trace across restarts."""
    provider = ctx.drivers.provider(ProviderKind.SIM.value)
    if not isinstance(provider, SimProvider):
        return
    k = 1.0 / DEMO_TRACE_SPEEDUP
    trace = [
        TraceJob(id=j.id, arrive_s=j.arrive_s * k, gpus=j.gpus, duration_s=j.duration_s * k)
        for j in bursty_inference(days=DEMO_TRACE_DAYS)
    ]
    # Start the trace's first day at 08:00, when the bursts begin.
    start = ctx.clock.now() - dt.timedelta(hours=8 * k)
    provider.world.set_synthetic_load(cluster_id, on=False)
    provider.world.feed_trace(cluster_id, trace, start=start, gpus_per_node=DEMO_GPUS_PER_NODE)


async def _ensure_cluster(
    ctx: AppContext,
    session: AsyncSession,
    *,
    caller: Caller,
    project: ProjectRow,
    request: CreateClusterRequest,
) -> str | None:
    """Create the cluster unless the project has a live one of that name already; the
    new cluster's id, or None when it was there."""
    exists = await session.scalar(
        select(ClusterRow.id).where(
            ClusterRow.project_id == project.id,
            ClusterRow.name == request.name,
            ClusterRow.deleted_at.is_(None),
        )
    )
    if exists is not None:
        return None
    created = await create_cluster(session, caller=caller, request=request, drivers=ctx.drivers)
    return created.id


async def _demo_token(ctx: AppContext) -> str:
    path = Path(ctx.settings.data_dir) / TOKEN_FILE
    if ctx.bootstrap_token is not None:
        _save(path, ctx.bootstrap_token)
        return ctx.bootstrap_token
    if path.exists():
        saved = path.read_text().strip()
        try:
            async with ctx.db.transaction() as session:
                await resolve_caller(session, token=saved)
            return saved
        except Unauthorized:
            pass
    async with ctx.db.transaction() as session:
        owner = await session.scalar(
            select(UserRow).where(UserRow.is_owner.is_(True)).order_by(UserRow.created_at)
        )
        assert owner is not None, "bootstrap creates the owner before the demo runs"
        system = Caller(
            user_id=owner.id,
            user_name=owner.name,
            is_owner=True,
            token_id="",
            token_project_id=None,
            token_role=None,
        )
        created = await create_api_token(
            session,
            caller=system,
            user_id=owner.id,
            name="demo",
            project_id=None,
            role=None,
            expires_in_days=None,
        )
    _save(path, created.token)
    return created.token


def _save(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
