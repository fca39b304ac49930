"""The ipmitool parsers on recorded output (``*.1.8.19.txt``: ipmitool 1.8.19 against
ipmi_sim) and on hand-written variants (``*.variant.txt``); see the fixtures' README."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.providers.base import PowerState
from gpufleet.providers.ipmi.parsing import (
    BootFlags,
    Failure,
    classify_failure,
    failure_text,
    parse_boot_flags,
    parse_power_status,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "ipmi"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("power-status-on.1.8.19.txt", PowerState.ON),
        ("power-status-off.1.8.19.txt", PowerState.OFF),
        ("chassis-status-off.1.8.19.txt", PowerState.OFF),
        ("power-status-on-capitalised.variant.txt", PowerState.ON),
    ],
)
def test_parse_power_status(name: str, expected: PowerState) -> None:
    assert parse_power_status(fixture(name)) is expected


@pytest.mark.parametrize("text", ["", "Chassis Power Control: Up/On\n", "Chassis Power is unknown"])
def test_parse_power_status_rejects_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ValueError, match="no power state"):
        parse_power_status(text)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # ipmi_sim keeps only the device: never "valid", never EFI or persistent.
        (
            "bootparam-5-pxe-ipmi_sim.1.8.19.txt",
            BootFlags(device="pxe", persistent=False, efi=False, valid=False),
        ),
        (
            "bootparam-5-pxe-efi-persistent.variant.txt",
            BootFlags(device="pxe", persistent=True, efi=True, valid=True),
        ),
        (
            "bootparam-5-disk-no-data-line.variant.txt",
            BootFlags(device="disk", persistent=False, efi=True, valid=True),
        ),
    ],
)
def test_parse_boot_flags(name: str, expected: BootFlags) -> None:
    assert parse_boot_flags(fixture(name)) == expected


def test_parse_boot_flags_rejects_other_output() -> None:
    with pytest.raises(ValueError, match="no boot device"):
        parse_boot_flags(fixture("bootdev-pxe.1.8.19.txt"))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("err-lanplus-wrong-password.1.8.19.txt", Failure.AUTH),
        ("err-lanplus-unknown-user.1.8.19.txt", Failure.AUTH),
        ("err-lan-wrong-password.1.8.19.txt", Failure.AUTH),
        ("err-lan-unknown-user.1.8.19.txt", Failure.AUTH),
        ("err-lanplus-privilege-power-off.1.8.19.txt", Failure.PRIVILEGE),
        ("err-lanplus-cipher-17.1.8.19.txt", Failure.CIPHER),
        ("err-lanplus-no-answer.1.8.19.txt", Failure.UNREACHABLE),
        ("err-lan-no-answer.1.8.19.txt", Failure.UNREACHABLE),
        ("err-lanplus-no-session.variant.txt", Failure.BUSY),
        ("err-lanplus-cycle-while-off.variant.txt", Failure.NOT_IN_STATE),
    ],
)
def test_classify_failure(name: str, expected: Failure) -> None:
    assert classify_failure(fixture(name)) is expected


def test_only_no_answer_timeouts_and_busy_bmcs_are_retried() -> None:
    assert {f for f in Failure if f.transient} == {
        Failure.UNREACHABLE,
        Failure.TIMEOUT,
        Failure.BUSY,
    }


def test_probe_chatter_does_not_decide_the_failure() -> None:
    # The VSO probe's refusal shows up even when the session works; the real error wins.
    output = (
        "Running Get VSO Capabilities my_addr 0x20, transit 0, target 0x20\n"
        "Invalid completion code received: Insufficient privilege level\n"
        + fixture("err-lanplus-cycle-while-off.variant.txt")
    )
    assert classify_failure(output) is Failure.NOT_IN_STATE
    assert classify_failure("something new went wrong") is Failure.OTHER


def test_failure_text_drops_chatter_and_joins_lines() -> None:
    text = failure_text(fixture("err-lanplus-wrong-password.1.8.19.txt"))
    assert text == "> RAKP 2 HMAC is invalid; Error: Unable to establish IPMI v2 / RMCP+ session"
    assert failure_text("") == "(no output)"
