"""The ssh provider against a real OpenSSH server on a loopback port."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
from pathlib import Path

import pytest
from sshpeer import MemoryHostDirectory, SshPeer, make_key

from gpufleet.core.errors import DriverError
from gpufleet.providers.base import (
    InstanceState,
    PowerState,
    Provider,
    ProvisionRequest,
    SupportsPower,
    SupportsReachCheck,
    SupportsReboot,
    SupportsReprovision,
)
from gpufleet.providers.ssh.client import SshClient
from gpufleet.providers.ssh.config import (
    DEFAULT_POWEROFF_COMMAND,
    DEFAULT_REBOOT_COMMAND,
    SshConfig,
)
from gpufleet.providers.ssh.driver import SshProvider
from gpufleet.providers.ssh.errors import SshError
from gpufleet.testing.processes import free_port

DOCS = Path(__file__).resolve().parents[3] / "docs" / "providers-ssh.md"
KERNEL_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def fast(**overrides: object) -> SshConfig:
    """Bounds that fit a loopback sshd: every failure shows in about a second."""
    base = SshConfig(
        connect_timeout_s=2.0,
        command_timeout_s=10.0,
        attempts=2,
        retry_backoff_s=0.05,
        retry_backoff_max_s=0.1,
        reboot_delay_s=0.1,
        reboot_wait_s=3.0,
    )
    return dataclasses.replace(base, **overrides)


def script(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def assert_no_secret(text: str, secret: str) -> None:
    assert secret not in text
    for line in secret.splitlines():
        if len(line.strip()) >= 8:
            assert line.strip() not in text, "a line of the secret leaked"


# --- the command strings ------------------------------------------------------------


def test_default_commands_are_the_ones_the_docs_give() -> None:
    config = SshConfig()
    assert config.reboot_command == DEFAULT_REBOOT_COMMAND == "sudo -n systemctl reboot"
    assert config.poweroff_command == DEFAULT_POWEROFF_COMMAND == "sudo -n systemctl poweroff"
    docs = DOCS.read_text()
    assert f"`{DEFAULT_REBOOT_COMMAND}`" in docs
    assert f"`{DEFAULT_POWEROFF_COMMAND}`" in docs
    assert not config.trust_on_first_use and not config.allow_password


def test_the_driver_offers_reboot_and_reach_check_but_no_power_or_reinstall(
    sshd: SshPeer,
) -> None:
    provider = SshProvider(SshConfig(), MemoryHostDirectory([sshd.access()]))
    assert provider.kind == "ssh"
    assert isinstance(provider, Provider)
    assert isinstance(provider, SupportsReboot)
    assert isinstance(provider, SupportsReachCheck)
    assert not isinstance(provider, SupportsPower)
    assert not isinstance(provider, SupportsReprovision)
    assert_no_secret(repr(provider), sshd.client_key.private)


# --- reboot -------------------------------------------------------------------------


async def test_reboot_runs_the_command_on_the_host(sshd: SshPeer, tmp_path: Path) -> None:
    log = tmp_path / "reboots.log"
    command = script(tmp_path / "fake-reboot", f'echo "reboot by $(id -un)" >> {log}\n')
    provider = SshProvider(fast(reboot_command=command), MemoryHostDirectory([sshd.access()]))

    await provider.reboot("h1")

    assert log.read_text() == f"reboot by {sshd.user}\n"


async def test_a_reboot_the_host_refuses_at_once_is_an_error_with_its_stderr(
    sshd: SshPeer, tmp_path: Path
) -> None:
    command = script(
        tmp_path / "refused",
        "echo 'sudo: a password is required' >&2\nexit 1\n",
    )
    provider = SshProvider(fast(reboot_command=command), MemoryHostDirectory([sshd.access()]))

    with pytest.raises(DriverError) as caught:
        await provider.reboot("h1")

    message = caught.value.message
    assert message.startswith("ssh: host h1 ")
    assert f"`{command}` exited 1" in message
    assert "sudo: a password is required" in message


async def test_the_stderr_of_a_refused_reboot_is_bounded(sshd: SshPeer, tmp_path: Path) -> None:
    command = script(tmp_path / "chatty", "head -c 20000 /dev/zero | tr '\\0' x >&2\nexit 3\n")
    provider = SshProvider(fast(reboot_command=command), MemoryHostDirectory([sshd.access()]))

    with pytest.raises(DriverError, match=r"exited 3: x+") as caught:
        await provider.reboot("h1")

    assert len(caught.value.message) < 2500


async def test_a_session_that_drops_after_the_reboot_is_scheduled_is_no_error(
    sshd: SshPeer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # The host going down ends the SSH session; here the command kills its own sshd.
    log = tmp_path / "reboots.log"
    command = script(
        tmp_path / "drop-session",
        f"""echo going down >> {log}
pid=$$
while [ "$pid" -gt 1 ]; do
  case "$(cat /proc/$pid/comm)" in sshd*) kill -KILL "$pid"; exit 0;; esac
  pid=$(cut -d' ' -f4 /proc/$pid/stat)
done
exit 9
""",
    )
    provider = SshProvider(fast(reboot_command=command), MemoryHostDirectory([sshd.access()]))

    with caplog.at_level(logging.INFO, logger="gpufleet.providers.ssh"):
        await provider.reboot("h1")

    assert log.read_text() == "going down\n"
    assert any("the session dropped" in r.getMessage() for r in caplog.records)


async def test_reboot_of_a_host_not_in_the_inventory_is_an_error(sshd: SshPeer) -> None:
    provider = SshProvider(fast(), MemoryHostDirectory([sshd.access()]))
    with pytest.raises(DriverError, match="ssh: host nosuch: reboot: no such host"):
        await provider.reboot("nosuch")


# --- reach check and boot id ----------------------------------------------------------


async def test_check_reach_reports_the_boot_id(sshd: SshPeer) -> None:
    provider = SshProvider(fast(), MemoryHostDirectory([sshd.access()]))

    reach = await provider.check_reach("h1")

    boot_id = KERNEL_BOOT_ID.read_text().strip()  # noqa: ASYNC240 (a kernel file: instant)
    assert reach.reachable
    assert reach.power is PowerState.ON
    assert reach.instance_id == "h1"
    assert re.fullmatch(rf"boot id {boot_id}, up \d+ s", reach.detail)
    assert await provider.boot_id("h1") == boot_id


async def test_check_reach_of_a_host_not_in_the_inventory(sshd: SshPeer) -> None:
    provider = SshProvider(fast(), MemoryHostDirectory([sshd.access()]))
    reach = await provider.check_reach("nosuch")
    assert not reach.reachable
    assert reach.power is PowerState.UNKNOWN
    assert "no such host" in reach.detail


# --- refusals: credentials and host keys ----------------------------------------------


async def test_a_wrong_key_is_refused_at_once_naming_the_host_and_no_key_material(
    sshd: SshPeer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stranger = make_key(tmp_path / "stranger")
    log = tmp_path / "reboots.log"
    command = script(tmp_path / "fake-reboot", f"echo reboot >> {log}\n")
    provider = SshProvider(
        fast(reboot_command=command),
        MemoryHostDirectory([sshd.access(key=stranger.private)]),
    )

    with caplog.at_level(logging.DEBUG, logger="gpufleet.providers.ssh"):
        with pytest.raises(DriverError) as caught:
            await provider.reboot("h1")
        reach = await provider.check_reach("h1")

    message = caught.value.message
    assert message.startswith("ssh: host h1 (127.0.0.1:")
    retries = [r for r in caplog.records if "(try " in r.getMessage()]
    assert retries == [], "an auth failure is never retried"
    assert f"authentication refused for user {sshd.user} by key" in message
    assert not reach.reachable
    assert reach.power is PowerState.UNKNOWN
    assert reach.detail.startswith("auth refused: ssh: host h1 ")
    for text in (message, str(caught.value), repr(caught.value), reach.detail, repr(reach)):
        assert_no_secret(text, stranger.private)
    assert not log.exists()


async def test_a_changed_host_key_is_refused_naming_both_fingerprints(
    sshd: SshPeer, tmp_path: Path
) -> None:
    impostor = make_key(tmp_path / "impostor")
    log = tmp_path / "reboots.log"
    command = script(tmp_path / "fake-reboot", f"echo reboot >> {log}\n")
    provider = SshProvider(
        fast(reboot_command=command),
        MemoryHostDirectory([sshd.access(host_key=impostor.public)]),
    )

    with pytest.raises(DriverError) as caught:
        await provider.reboot("h1")
    reach = await provider.check_reach("h1")

    message = caught.value.message
    fingerprints = re.findall(r"SHA256:[A-Za-z0-9+/]+", message)
    assert message.startswith("ssh: host h1 ")
    assert "HOST KEY CHANGED" in message and "man-in-the-middle" in message
    assert len(set(fingerprints)) == 2
    assert fingerprints == [fingerprint_of(sshd.host_key.public), fingerprint_of(impostor.public)]
    assert not reach.reachable
    assert reach.detail.startswith("host key: ")
    assert_no_secret(message, sshd.client_key.private)
    assert not log.exists()


def fingerprint_of(public: str) -> str:
    """What ``ssh-keygen -l`` says: the fingerprint a person compares by eye."""
    argv = ["ssh-keygen", "-l", "-E", "sha256", "-f", "-"]
    done = subprocess.run(argv, input=public, capture_output=True, text=True, check=True)
    return done.stdout.split()[1]


async def test_a_host_with_no_pinned_key_is_refused(sshd: SshPeer, tmp_path: Path) -> None:
    log = tmp_path / "reboots.log"
    command = script(tmp_path / "fake-reboot", f"echo reboot >> {log}\n")
    provider = SshProvider(
        fast(reboot_command=command), MemoryHostDirectory([sshd.access(host_key=None)])
    )

    with pytest.raises(DriverError, match=r"ssh: host h1 .*no host key is pinned"):
        await provider.reboot("h1")
    reach = await provider.check_reach("h1")

    assert not reach.reachable
    assert reach.detail.startswith("host key: ")
    assert not log.exists()


async def test_trust_on_first_use_keeps_the_first_key_it_sees(
    sshd: SshPeer, other_sshd: SshPeer
) -> None:
    directory = MemoryHostDirectory([sshd.access(host_key=None)])
    provider = SshProvider(fast(trust_on_first_use=True), directory)

    assert (await provider.check_reach("h1")).reachable
    # h1 now answers with another key (a reinstall, or someone in the middle).
    directory.in_service["h1"] = other_sshd.access(host_key=None)
    with pytest.raises(DriverError, match="HOST KEY CHANGED") as caught:
        await provider.boot_id("h1")

    fingerprints = re.findall(r"SHA256:[A-Za-z0-9+/]+", caught.value.message)
    assert fingerprints == [
        fingerprint_of(other_sshd.host_key.public),
        fingerprint_of(sshd.host_key.public),
    ]


async def test_a_password_is_refused_unless_allowed_and_never_shown(sshd: SshPeer) -> None:
    password = "hunter2-correct-horse"
    access = sshd.access(secret=password)
    refused = SshProvider(fast(), MemoryHostDirectory([access]))
    allowed = SshProvider(fast(allow_password=True), MemoryHostDirectory([access]))

    with pytest.raises(DriverError, match="password logins are off") as off:
        await refused.boot_id("h1")
    with pytest.raises(DriverError, match=r"authentication refused .* by password") as denied:
        await allowed.boot_id("h1")  # this sshd takes keys only

    for text in (off.value.message, denied.value.message, repr(access)):
        assert password not in text


async def test_an_unreadable_private_key_is_an_error_without_the_key(sshd: SshPeer) -> None:
    broken = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\n"
        "bm90IGEga2V5IGF0IGFsbA==\n"
        "-----END OPENSSH PRIVATE KEY-----\n"
    )
    provider = SshProvider(fast(), MemoryHostDirectory([sshd.access(key=broken)]))

    with pytest.raises(DriverError, match=r"ssh: host h1 .*private key .* could not be read") as e:
        await provider.boot_id("h1")

    assert_no_secret(e.value.message, broken)


# --- refusals: the network --------------------------------------------------------------


async def test_a_closed_port_fails_fast_after_bounded_retries(
    sshd: SshPeer, caplog: pytest.LogCaptureFixture
) -> None:
    provider = SshProvider(fast(), MemoryHostDirectory([sshd.access(port=free_port())]))

    with (
        caplog.at_level(logging.INFO, logger="gpufleet.providers.ssh"),
        pytest.raises(DriverError, match=r"ssh: host h1 .*connection refused"),
    ):
        await provider.reboot("h1")

    assert [r.getMessage().count("(try 1 of 2)") for r in caplog.records] == [1]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gpufleet.providers.ssh"):
        reach = await provider.check_reach("h1")

    assert not reach.reachable
    assert reach.detail.startswith("unreachable: ")
    assert ["(try 1 of 2)" in r.getMessage() for r in caplog.records] == [True]


async def test_a_server_that_never_speaks_times_out_within_the_bound(
    sshd: SshPeer, silent_port: int
) -> None:
    provider = SshProvider(
        fast(connect_timeout_s=0.5), MemoryHostDirectory([sshd.access(port=silent_port)])
    )

    with pytest.raises(DriverError, match=r"ssh: host h1 .*no SSH session within 0.5 s"):
        await provider.reboot("h1")
    reach = await provider.check_reach("h1")

    assert not reach.reachable
    assert reach.power is PowerState.UNKNOWN
    assert reach.detail.startswith("timed out: ")


# --- Provider -----------------------------------------------------------------------------


async def test_instances_are_running_when_they_answer_and_pending_when_not(
    sshd: SshPeer,
) -> None:
    up = sshd.access("up")
    down = sshd.access("down", port=free_port())
    other = sshd.access("other", cluster_id="c2")
    provider = SshProvider(fast(attempts=1), MemoryHostDirectory([up, down, other]))

    listed = {i.instance_id: i for i in await provider.list_instances("c1")}
    got = await provider.get_instance("up")

    assert set(listed) == {"up", "down"}
    assert listed["up"].state is InstanceState.RUNNING
    assert listed["down"].state is InstanceState.PENDING
    assert got is not None and got.state is InstanceState.RUNNING
    assert got.hostname == "up.test" and got.booted_at is None
    assert got.created_at == listed["up"].created_at
    assert await provider.get_instance("nosuch") is None


async def test_provision_claims_a_spare_once_per_token(sshd: SshPeer) -> None:
    spare = sshd.access("spare1")
    directory = MemoryHostDirectory([], spares=(spare,))
    provider = SshProvider(fast(), directory)
    request = ProvisionRequest(
        client_token="tok-1", cluster_id="c1", node_name="gpu-7", gpu_model="H100", gpu_count=8
    )

    first = await provider.provision(request)
    again = await provider.provision(request)

    assert first.instance_id == again.instance_id == "spare1"
    assert first.state is InstanceState.RUNNING
    assert (first.client_token, first.node_name) == ("tok-1", "gpu-7")
    with pytest.raises(DriverError, match="no spare host left in the pool of cluster c1"):
        await provider.provision(dataclasses.replace(request, client_token="tok-2"))


async def test_terminate_powers_the_host_off_then_releases_it(
    sshd: SshPeer, tmp_path: Path
) -> None:
    log = tmp_path / "poweroff.log"
    command = script(tmp_path / "fake-poweroff", f"echo poweroff >> {log}\n")
    directory = MemoryHostDirectory([sshd.access()])
    provider = SshProvider(fast(poweroff_command=command), directory)

    await provider.terminate("h1")
    await provider.terminate("h1")  # gone from the inventory: nothing to do

    assert log.read_text() == "poweroff\n"
    assert directory.released == ["h1"]


async def test_terminate_releases_a_host_that_does_not_answer(sshd: SshPeer) -> None:
    directory = MemoryHostDirectory([sshd.access(port=free_port())])
    provider = SshProvider(fast(), directory)

    await provider.terminate("h1")

    assert directory.released == ["h1"]


async def test_terminate_keeps_a_host_whose_poweroff_is_refused(
    sshd: SshPeer, tmp_path: Path
) -> None:
    command = script(tmp_path / "refused", "echo 'sudo: a password is required' >&2\nexit 1\n")
    directory = MemoryHostDirectory([sshd.access()])
    provider = SshProvider(fast(poweroff_command=command), directory)

    with pytest.raises(DriverError, match="a password is required"):
        await provider.terminate("h1")

    assert directory.released == []


async def test_a_command_that_hangs_is_cut_at_the_command_timeout(sshd: SshPeer) -> None:
    # The probe is fixed; the client under it runs any command with the same bound.
    config = fast(command_timeout_s=0.5, reboot_delay_s=0.0, reboot_wait_s=0.1, attempts=1)
    client = SshClient(config)

    with pytest.raises(SshError, match=r"ssh: host h1 .*`sleep 3` did not finish within 0.5 s"):
        await client.run(sshd.access(), "sleep 3")


async def test_a_credential_with_no_user_needs_the_configured_one(sshd: SshPeer) -> None:
    access = sshd.access(username=None)
    without = SshProvider(fast(), MemoryHostDirectory([access]))
    with_user = SshProvider(fast(username=sshd.user), MemoryHostDirectory([access]))

    with pytest.raises(DriverError, match=r"names no user and SshConfig\.username is not set"):
        await without.boot_id("h1")
    assert (await with_user.check_reach("h1")).reachable
