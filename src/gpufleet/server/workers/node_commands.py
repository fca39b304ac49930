"""The command expiry loop: commands no agent took, or answered, in time end ``expired``."""

from __future__ import annotations

from gpufleet.server.services.node_commands import SWEEP_BATCH, expire_commands
from gpufleet.server.workers.base import LoopService


class CommandExpiryLoop(LoopService):
    name = "node-commands"

    async def run_once(self) -> None:
        while True:
            async with self.db.transaction() as session:
                expired = await expire_commands(session, now=self.clock.now())
            if expired < SWEEP_BATCH:
                return
