"""The ssh provider's pure parts: parsing, the wrapper string, redaction, settings."""

from __future__ import annotations

import subprocess

import pytest

from gpufleet.core.errors import DriverError
from gpufleet.providers.ssh.commands import RUNNING_MARK, STARTED_MARK, detached_command
from gpufleet.providers.ssh.config import SshConfig
from gpufleet.providers.ssh.errors import SshError, SshFailure, redact
from gpufleet.providers.ssh.parsing import parse_probe

# Recorded: `cat /proc/sys/kernel/random/boot_id /proc/uptime` on Debian 12.
RECORDED_PROBE = "cdf6ea56-d97f-47fa-991f-99ea2a07b622\n4803.63 7366.10\n"


def test_parse_probe_reads_the_boot_id_and_uptime() -> None:
    probe = parse_probe(RECORDED_PROBE, host="h1")
    assert probe.boot_id == "cdf6ea56-d97f-47fa-991f-99ea2a07b622"
    assert probe.uptime_s == pytest.approx(4803.63)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not-a-uuid\n1.0 2.0\n",
        "cdf6ea56-d97f-47fa-991f-99ea2a07b622\n",
        RECORDED_PROBE[:37] + "nan 1\n",
        RECORDED_PROBE[:37] + "-5 1\n",
    ],
)
def test_parse_probe_refuses_anything_else_naming_the_host(text: str) -> None:
    with pytest.raises(DriverError, match=r"^ssh: host h1: unexpected"):
        parse_probe(text, host="h1")


def run_wrapper(command: str, *, wait_s: float = 3.0) -> subprocess.CompletedProcess[str]:
    wrapper = detached_command(command, delay_s=0, wait_s=wait_s)
    return subprocess.run(["sh", "-c", wrapper], capture_output=True, text=True, timeout=20)


def test_the_wrapper_reports_a_command_that_ends_well() -> None:
    done = run_wrapper("true")
    assert (done.returncode, done.stdout, done.stderr) == (0, STARTED_MARK + "\n", "")


def test_the_wrapper_reports_a_refusal_with_its_output() -> None:
    done = run_wrapper("echo 'it is quoted; $HOME stays' >&2; exit 4")
    assert done.returncode == 4
    assert done.stderr == "it is quoted; $HOME stays\n"


def test_the_wrapper_returns_while_a_slow_command_still_runs() -> None:
    done = run_wrapper("sleep 1", wait_s=0.2)
    assert done.returncode == 0
    assert done.stdout.splitlines() == [STARTED_MARK, RUNNING_MARK]


def test_redact_cuts_the_secret_and_each_of_its_lines() -> None:
    secret = "-----BEGIN KEY-----\nAAAAsecretline1\nBBBBsecretline2\n-----END KEY-----\n"
    text = f"failed on BBBBsecretline2 and {secret}"
    cleaned = redact(text, secret)
    assert "secretline" not in cleaned
    assert redact("nothing here", None) == "nothing here"


def test_auth_and_host_key_errors_are_not_transient() -> None:
    assert SshError("x", reason=SshFailure.TIMEOUT).transient
    assert SshError("x", reason=SshFailure.UNREACHABLE).transient
    assert not SshError("x", reason=SshFailure.AUTH).transient
    assert not SshError("x", reason=SshFailure.HOST_KEY).transient
    assert not SshError("x", reason=SshFailure.UNREACHABLE, transient=False).transient


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"port": 0}, "port must be within"),
        ({"connect_timeout_s": 0}, "connect_timeout_s must be > 0"),
        ({"attempts": 0}, "attempts must be >= 1"),
        ({"reboot_command": " "}, "reboot_command must not be empty"),
        ({"poweroff_command": ""}, "poweroff_command must not be empty"),
        ({"reboot_wait_s": 40.0}, "must be under command_timeout_s"),
    ],
)
def test_config_refuses_bad_settings(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SshConfig(**overrides)  # type: ignore[arg-type]
