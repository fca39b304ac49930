"""The Rollouts tab: the cluster's stack rollouts, newest first — each one's window, its
limits, its progress and, for the one under way (older ones folded), its nodes in order
with the repair that migrates each (``services/rollouts.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, Request, Response

from gpufleet.core.enums import RolloutNodeStatus as NS
from gpufleet.core.enums import RolloutStatus as RS
from gpufleet.server.deps import CtxDep
from gpufleet.server.schemas.rollouts import Rollout
from gpufleet.server.services.rollouts import FINAL, list_rollouts
from gpufleet.server.web.context import load_cluster_page
from gpufleet.server.web.routing import HtmlRoute, render_page
from gpufleet.server.web.session import WebUserDep

router = APIRouter(route_class=HtmlRoute, include_in_schema=False)

# Badge colours borrowed from the console's existing ones (console.css): ok, busy, warn,
# bad; a status not named here is neutral.
ROLLOUT_TONES = {
    RS.SCHEDULED: "st-pending",
    RS.RUNNING: "st-running",
    RS.PAUSED: "st-cordoned",
    RS.ABORTING: "st-draining",
    RS.SUCCEEDED: "st-succeeded",
}
NODE_TONES = {
    NS.MIGRATING: "st-running",
    NS.DONE: "st-succeeded",
    NS.FAILED: "st-failed",
    NS.ROLLING_BACK: "st-draining",
}
# The progress bar's segments, in order: (node status, the bar's colour class).
BAR = ((NS.DONE, "seg-healthy"), (NS.MIGRATING, "seg-degraded"), (NS.FAILED, "seg-unhealthy"))
SETTLED = frozenset({NS.DONE, NS.SKIPPED, NS.ROLLED_BACK})  # nothing left to do there


@dataclass(frozen=True)
class RolloutCard:
    rollout: Rollout
    total: int
    settled: int  # done, skipped or rolled back
    segments: list[tuple[str, int, float, float]]  # (status, nodes, x, width) of 1000
    expanded: bool  # the nodes' table shown open

    @property
    def tone(self) -> str:
        return ROLLOUT_TONES.get(self.rollout.status, "")


def _card(rollout: Rollout, *, expanded: bool) -> RolloutCard:
    total = len(rollout.nodes)
    segments: list[tuple[str, int, float, float]] = []
    x = 0.0
    for status, _colour in BAR:
        n = rollout.counts.get(status.value, 0)
        if n and total:
            width = n * 1000 / total
            segments.append((status.value, n, x, width))
            x += width
    settled = sum(rollout.counts.get(s.value, 0) for s in SETTLED)
    return RolloutCard(
        rollout=rollout, total=total, settled=settled, segments=segments, expanded=expanded
    )


def cards(rollouts: list[Rollout]) -> list[RolloutCard]:
    """Newest first (as listed); the newest unfinished one opens its nodes' table."""
    current = next((r.id for r in rollouts if r.status not in FINAL), None)
    return [_card(r, expanded=r.id == current) for r in rollouts]


@router.get("/clusters/{cluster_id}/rollouts")
async def rollouts_tab(
    cluster_id: str, request: Request, ctx: CtxDep, user: WebUserDep
) -> Response:
    now = ctx.clock.now()
    async with ctx.db.reader() as session:
        page = await load_cluster_page(session, user=user, cluster_id=cluster_id)
        rollouts = await list_rollouts(
            session, caller=user.caller, cluster_id=page.cluster.id, now=now
        )
    return render_page(
        request,
        "tab_rollouts.html",
        page.context(
            user,
            "rollouts",
            cards=cards(rollouts),
            node_tones={s.value: t for s, t in NODE_TONES.items()},
            bar_colours={s.value: c for s, c in BAR},
            now=now,
        ),
    )
