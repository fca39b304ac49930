"""Waiting in tests for something a real-time component does (a real agent loop, a real
process, a long poll): poll a condition until it holds, with a deadline.

Never for what a fake clock drives: step that instead (``gpufleet.testing.fleet``), so
the test does not depend on how fast this machine is.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def eventually(
    condition: Callable[[], T | Awaitable[T]],
    *,
    timeout_s: float = 10.0,
    what: str = "condition",
    poll_s: float = 0.01,
) -> T:
    """Return ``condition()``'s first true value; AssertionError after ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = condition()
        value: T = await result if inspect.isawaitable(result) else result
        if value:
            return value
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(poll_s)
