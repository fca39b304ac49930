"""Start ``sushy-emulator`` (fake driver) with power changes applied after a fixed delay.

The fake driver applies each power change ``random.randint(1, 11)`` seconds after it is
asked for ("hardware actions are not immediate"); tests cannot wait that long. This
launcher replaces that draw with ``GPUFLEET_TEST_SUSHY_DELAY_S`` (default 0: a change is
seen on the next read), and journals every power state the fake driver stores, every
reset it is asked for and every boot device set to ``GPUFLEET_TEST_SUSHY_JOURNAL`` (one
line each: ``<uuid> <word> <value>``), so a test sees the machine go Off and back On
even when both happen within one request. Run as ``python -m`` with sushy-emulator's own arguments.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from sushy_tools.emulator.main import main
from sushy_tools.emulator.resources.systems import fakedriver

DELAY_S = int(os.environ.get("GPUFLEET_TEST_SUSHY_DELAY_S", "0"))
JOURNAL = os.environ.get("GPUFLEET_TEST_SUSHY_JOURNAL")


class _FixedDelay:
    @staticmethod
    def randint(*bounds: int) -> int:  # noqa: ARG004 - random.randint(low, high)
        return DELAY_S


def _journal(line: str) -> None:
    if JOURNAL:
        with open(JOURNAL, "a", encoding="utf-8") as f:
            f.write(line + "\n")


_update = fakedriver.FakeDriver._update
_set_power_state = fakedriver.FakeDriver.set_power_state


def _journaled_update(self: Any, system: Any, **changes: Any) -> None:
    _update(self, system, **changes)
    stored = self._get(system) if isinstance(system, str) else system
    if "power_state" in changes:
        _journal(f"{stored['uuid']} power {changes['power_state']}")
    if "boot_device" in changes:  # a boot override: "Pxe" before a reprovision's restart
        _journal(f"{stored['uuid']} boot {changes['boot_device']}")


def _journaled_set_power_state(self: Any, identity: str, state: str) -> None:
    uuid = self.uuid(identity)
    _journal(f"{uuid} reset {state}")
    before = self._systems[uuid]["power_state"]
    _set_power_state(self, identity, state)
    # A restart turns the machine Off in place (not through ``_update``): journal it here.
    after = self._systems[uuid]["power_state"]
    if after != before:
        _journal(f"{uuid} power {after}")


fakedriver.random = _FixedDelay  # type: ignore[assignment]
fakedriver.FakeDriver._update = _journaled_update  # type: ignore[method-assign]
fakedriver.FakeDriver.set_power_state = _journaled_set_power_state  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.argv[0] = "sushy-emulator"
    sys.exit(main())
