"""Deletes GPU telemetry history past its retention (``services/telemetry_history.py``)."""

from __future__ import annotations

import logging

from gpufleet.server.services.telemetry_history import prune_history
from gpufleet.server.workers.base import LoopDeps, LoopService

log = logging.getLogger(__name__)


class TelemetryPruneLoop(LoopService):
    name = "telemetry-prune"

    def __init__(
        self, deps: LoopDeps, *, interval_s: float, node_keep_s: float, cluster_keep_s: float
    ) -> None:
        super().__init__(deps, interval_s=interval_s)
        self.node_keep_s = node_keep_s
        self.cluster_keep_s = cluster_keep_s
        self.deleted = (0, 0)

    async def run_once(self) -> None:
        async with self.db.transaction() as session:
            self.deleted = await prune_history(
                session,
                now=self.clock.now(),
                node_keep_s=self.node_keep_s,
                cluster_keep_s=self.cluster_keep_s,
            )
        if any(self.deleted):
            log.debug("telemetry history pruned: %d node, %d cluster minutes", *self.deleted)
