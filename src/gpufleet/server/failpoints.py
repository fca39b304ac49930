"""Failpoints: named places where a test makes the server die on purpose.

``GPUFLEET_FAILPOINTS=repair.acting.after_call`` makes the process exit at once (no
cleanup, like SIGKILL) the first time it reaches that point, so a crash test can stop the
server between a driver call and the store write that records it, and prove the restart
converges. Unset in production: ``hit()`` is then a set lookup.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

log = logging.getLogger(__name__)

EXIT_CODE = 137  # what a shell reports for SIGKILL


class Failpoints:
    def __init__(self, names: Iterable[str] = ()) -> None:
        self._names = frozenset(n.strip() for n in names if n.strip())

    @classmethod
    def parse(cls, spec: str) -> Failpoints:
        return cls(spec.split(","))

    def __bool__(self) -> bool:
        return bool(self._names)

    def hit(self, name: str) -> None:
        if name in self._names:
            log.critical("failpoint %s: exiting now", name)
            logging.shutdown()
            os._exit(EXIT_CODE)
