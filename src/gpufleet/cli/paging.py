"""Follow ``next_cursor`` for the listing commands."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gpufleet.client.api import MAX_PAGE_SIZE
from gpufleet.core.models import Page

T = TypeVar("T")


def collect(fetch: Callable[[str | None, int], Page[T]], *, limit: int | None = None) -> Page[T]:
    """Fetch pages until ``limit`` items (all when None) or the listing ends.

    The result keeps the server's cursor after the last item returned, so a script reading
    ``--output json`` can see whether there was more.
    """
    items: list[T] = []
    cursor: str | None = None
    while True:
        want = MAX_PAGE_SIZE if limit is None else min(MAX_PAGE_SIZE, limit - len(items))
        page = fetch(cursor, want)
        items.extend(page.items)
        cursor = page.next_cursor
        if cursor is None or not page.items or (limit is not None and len(items) >= limit):
            break
    if limit is not None and len(items) > limit:
        items = items[:limit]
    return Page(items=items, next_cursor=cursor)
