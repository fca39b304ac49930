"""The import contracts in ``.importlinter`` cover every module they are about.

``lint-imports`` checks the modules a contract names; a module the contract forgets is
checked by nothing. These tests read the contracts and the source tree and fail when a
driver is missing from the driver independence contract, or a server module is in no
server layer and not on the short list of shared infrastructure.
"""

from __future__ import annotations

import configparser
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src" / "gpufleet"
DRIVER_FAMILIES = ("schedulers", "providers")
# What every server layer above db may use; kept out of the layers on purpose.
SERVER_INFRASTRUCTURE = frozenset(
    {
        "context",
        "deps",
        "drivers",
        "errors",
        "failpoints",
        "ingest",
        "limits",
        "metrics",
        "requests",
        "schemas",
        "settings",
    }
)


def contract(name: str) -> configparser.SectionProxy:
    config = configparser.ConfigParser()
    config.read(REPO / ".importlinter")
    return config[f"importlinter:contract:{name}"]


def listed(value: str) -> set[str]:
    """Module names of a contract field: one per line, layers split at ``|``."""
    return {m.strip() for line in value.splitlines() for m in line.split("|") if m.strip()}


def modules_under(package: Path, *, marks: tuple[str, ...] = ("__init__.py",)) -> set[str]:
    """Child modules, and child folders holding one of ``marks``, of a package."""
    out = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    out |= {p.name for p in package.iterdir() if any((p / m).is_file() for m in marks)}
    return out


def driver_packages() -> set[str]:
    """Everything under schedulers/ and providers/ but the family's shared ``base``: a
    driver is a folder (driver.py, client.py, parsing.py, config.py), never a sideways
    helper module."""
    found = set()
    for family in DRIVER_FAMILIES:
        names = modules_under(SRC / family, marks=("__init__.py", "driver.py")) - {"base"}
        found |= {f"gpufleet.{family}.{m}" for m in names}
    return found


def test_every_driver_is_in_the_independence_contract() -> None:
    independent = listed(contract("drivers-independent")["modules"])
    found = driver_packages()
    assert found - independent == set(), (
        "add these drivers to [importlinter:contract:drivers-independent] in .importlinter"
    )
    assert independent - found == set(), "these listed drivers no longer exist"


def test_the_driver_scan_sees_the_drivers_there_are() -> None:
    # Guards the scan itself: an empty result would make the test above pass vacuously.
    assert {"gpufleet.schedulers.slurm", "gpufleet.schedulers.sim"} <= driver_packages()
    assert "gpufleet.providers.sim" in driver_packages()


def test_every_server_module_is_in_a_layer_or_is_infrastructure() -> None:
    layers = listed(contract("server-layers")["layers"])
    server = {f"gpufleet.server.{m}" for m in modules_under(SRC / "server")}
    infrastructure = {f"gpufleet.server.{m}" for m in SERVER_INFRASTRUCTURE}
    assert infrastructure <= server, "an infrastructure module named here no longer exists"
    assert layers & infrastructure == set(), "shared infrastructure stays outside the layers"
    assert server - infrastructure - layers == set(), (
        "put these in a layer of [importlinter:contract:server-layers] in .importlinter "
        "(or, if every layer uses them, on SERVER_INFRASTRUCTURE here and in its comment)"
    )
    assert layers - server == set(), "these layers no longer exist"
