"""The pure parts of the Redfish provider: BMC addresses, reset plans, documents."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpufleet.providers.base import PowerState
from gpufleet.providers.redfish.config import RedfishConfig
from gpufleet.providers.redfish.parsing import (
    ParseError,
    action_info_reset_types,
    bmc_url,
    on_type,
    power_state,
    reset_plan,
    system_view,
)


@pytest.mark.parametrize(
    ("address", "port", "expected"),
    [
        ("bmc1", None, "https://bmc1/redfish/v1"),
        ("bmc1:8443", None, "https://bmc1:8443/redfish/v1"),
        ("bmc1", 8443, "https://bmc1:8443/redfish/v1"),
        ("http://10.0.0.5:8000", None, "http://10.0.0.5:8000/redfish/v1"),
        ("https://bmc1/redfish/v1/", None, "https://bmc1/redfish/v1"),
        ("[fd00::5]:443", None, "https://[fd00::5]:443/redfish/v1"),
    ],
)
def test_bmc_url(address: str, port: int | None, expected: str) -> None:
    assert str(bmc_url(address, port=port, scheme="https")) == expected


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("", "empty"),
        ("ftp://bmc1", "http or https"),
        ("https://root:calvin@bmc1", "credential"),
    ],
)
def test_bad_bmc_addresses(address: str, problem: str) -> None:
    with pytest.raises(ParseError, match=problem) as caught:
        bmc_url(address, port=None, scheme="https")
    assert "calvin" not in str(caught.value)


def test_reset_plan_keeps_the_order_and_only_advertised_steps() -> None:
    order = RedfishConfig().reset_order
    emulator = ["On", "ForceOff", "GracefulShutdown", "GracefulRestart", "ForceRestart", "Nmi"]
    assert reset_plan(order, emulator) == ["GracefulRestart", "ForceRestart", "ForceOffOn"]
    assert reset_plan(order, ["ForceOff", "ForceOn"]) == ["ForceOffOn"]
    assert reset_plan(order, ["ForceOff"]) == []
    assert reset_plan(order, None) == list(order)
    assert on_type(["ForceOn", "ForceOff"]) == "ForceOn"
    assert on_type(None) == "On"


def test_power_states() -> None:
    assert power_state("On") is PowerState.ON
    assert power_state("Off") is PowerState.OFF
    for other in ("PoweringOn", "PoweringOff", "Paused", None, 3):
        assert power_state(other) is PowerState.UNKNOWN


def test_system_view_and_action_info() -> None:
    doc = {
        "@odata.id": "/redfish/v1/Systems/1",
        "PowerState": "PoweringOn",
        "Boot": {
            "BootSourceOverrideMode": "Legacy",
            "BootSourceOverrideTarget@Redfish.AllowableValues": ["Pxe", "Hdd"],
        },
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
                "@Redfish.ActionInfo": "/redfish/v1/Systems/1/ResetActionInfo",
            }
        },
    }
    view = system_view(doc, path="/x")
    assert (view.path, view.power, view.power_text) == (
        "/redfish/v1/Systems/1",
        PowerState.UNKNOWN,
        "PoweringOn",
    )
    assert view.reset_allowed is None
    assert view.reset_action_info == "/redfish/v1/Systems/1/ResetActionInfo"
    assert (view.boot_mode, view.boot_targets) == ("Legacy", ("Pxe", "Hdd"))
    info = {"Parameters": [{"Name": "ResetType", "AllowableValues": ["On", "ForceOff"]}]}
    assert action_info_reset_types(info) == ("On", "ForceOff")
    assert action_info_reset_types({}) is None
    with pytest.raises(ParseError, match="Reset action"):
        system_view({"PowerState": "On"}, path="/x")


def test_config_refuses_unknown_reset_steps() -> None:
    with pytest.raises(ValueError, match="unknown steps"):
        RedfishConfig(reset_order=("Nmi",))


def test_the_driver_imports_without_loading_sushy() -> None:
    # sushy is in the [server] extra; the package must import on a base install.
    code = (
        "import sys, gpufleet.providers.redfish.driver; "
        "sys.exit(1 if any(m.startswith('sushy') for m in sys.modules) else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
