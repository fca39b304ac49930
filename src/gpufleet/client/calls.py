"""What the groups of API calls mixed into ``ApiClient`` share: the API prefix, the one
way a caller-typed id or name becomes a path segment, and the ``_call`` they rely on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

API = "/api/v1"


def segment(ref: str) -> str:
    """A caller-typed id or name as one path segment: ``/`` or ``?`` cannot reroute it."""
    return quote(ref, safe="")


class Calls:
    """A group of API calls; needs ``_call`` (``ApiClient`` has it)."""

    def _call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, object] | None = None,
        body: Mapping[str, Any] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        raise NotImplementedError
