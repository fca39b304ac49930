"""A sushy-emulator (fake driver, no-delay launcher, Basic auth) per test module.

It never skips: without sushy-tools (the [dev] extra) every test that asks for it fails.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
from redfish_fakes import PASSWORD, SYSTEMS, USER, Emulator, start_emulator, stop_emulator


def _require_sushy_tools() -> None:
    for module in ("sushy", "sushy_tools", "bcrypt"):
        if importlib.util.find_spec(module) is None:
            pytest.fail(f"the Redfish tests need {module}: pip install -e '.[dev]'", pytrace=False)


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """sushy-emulator with the ``SYSTEMS`` on 127.0.0.1, a fresh state dir, power changes
    applied at once, HTTP Basic auth for ``USER``/``PASSWORD``."""
    _require_sushy_tools()
    systems = [
        {"uuid": uuid, "name": name, "power_state": power, "nics": []}
        for uuid, (name, power) in SYSTEMS.items()
    ]
    emu = start_emulator(tmp_path_factory.mktemp("sushy"), systems=systems, users={USER: PASSWORD})
    yield emu
    stop_emulator(emu)
