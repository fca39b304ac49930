"""Identifiers.

Ids are UUIDv7 strings: unique without coordination between replicas, and sortable by
creation time, so a cursor over events is simply "ids after this one".
"""

from __future__ import annotations

import os
import threading
import time
import uuid

_lock = threading.Lock()
_last_ms = 0
_seq = 0


def new_id() -> str:
    """Return a new UUIDv7 as a 36-character string, monotonic within this process."""
    global _last_ms, _seq
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            # Same millisecond (or the clock stepped back): keep order with a counter.
            ms = _last_ms
            _seq += 1
            if _seq >= 1 << 12:
                ms += 1
                _seq = 0
        else:
            _seq = 0
        _last_ms = ms
        seq = _seq
    rand = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= seq << 64
    value |= 0b10 << 62
    value |= rand
    return str(uuid.UUID(int=value))


def is_id(text: str) -> bool:
    """True when ``text`` is a canonical UUID string (any version)."""
    try:
        return str(uuid.UUID(text)) == text
    except ValueError:
        return False
