"""The command expiry loop: commands no agent took, or answered, in time end ``expired``;
ended ones are deleted after ``RETENTION_S``."""

from __future__ import annotations

from gpufleet.server.services.node_commands import SWEEP_BATCH, expire_commands, prune_commands
from gpufleet.server.workers.base import LoopService


class CommandExpiryLoop(LoopService):
    name = "node-commands"

    async def run_once(self) -> None:
        for sweep in (expire_commands, prune_commands):
            while True:
                async with self.db.transaction() as session:
                    done = await sweep(session, now=self.clock.now())
                if done < SWEEP_BATCH:
                    break
