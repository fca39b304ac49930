"""The entry points freeze the heap they started with, so full collections stop walking
it (``main.freeze_startup_heap``; the API reads bench's p99 was those collections)."""

from __future__ import annotations

import asyncio
import gc
from typing import cast

from gpufleet.server.context import AppContext
from gpufleet.server.main import freeze_startup_heap


async def test_the_startup_heap_is_frozen_on_the_loops_next_turn() -> None:
    gc.unfreeze()
    try:
        await freeze_startup_heap(cast(AppContext, None))
        assert gc.get_freeze_count() == 0  # not yet: after the lifespan's own start
        await asyncio.sleep(0)  # one turn of the loop
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()  # this test process builds many apps; give their garbage back
