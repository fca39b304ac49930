"""``IpmiProvider`` against a real BMC simulator (OpenIPMI's ipmi_sim) through the real
ipmitool: every power transition asserted is one the simulator was asked for."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

import pytest
from ipmi_lab import BMC_PASSWORD, IpmiSim, MemoryDirectory, SilentBmc, free_udp_port

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
from gpufleet.providers.ipmi.client import IpmiError
from gpufleet.providers.ipmi.config import IpmiConfig
from gpufleet.providers.ipmi.driver import IpmiProvider
from gpufleet.providers.ipmi.parsing import Failure
from gpufleet.testing.waits import eventually

pytestmark = pytest.mark.slow  # a real ipmi_sim, real ipmitool runs

T = TypeVar("T")
WRONG_PASSWORD = "not-the-Pa55-k3y"  # distinctive, searched for in output

# ipmi_sim offers no Get Channel Cipher Suites: name the suite, or each call waits 3.5 s.
# Short UDP retransmission so the failure cases stay quick (ipmitool gives up on a silent
# BMC after ~2 s), and a kill far above that, so a busy machine still sees "no answer".
CONFIG = IpmiConfig(
    cipher_suite=3, timeout_s=8.0, retries=1, retry_backoff_s=0.1, udp_timeout_s=1, udp_retries=1
)


@pytest.fixture
def directory(ipmi_sim: IpmiSim) -> MemoryDirectory:
    d = MemoryDirectory()
    d.add(ipmi_sim.access("gpu-01", cluster_id="c1"))
    d.add(ipmi_sim.access("wrong-pw", password=WRONG_PASSWORD))
    d.add(ipmi_sim.access("nobody-home", port=free_udp_port()))
    return d


@pytest.fixture
def provider(directory: MemoryDirectory) -> IpmiProvider:
    return IpmiProvider(CONFIG, directory)


@pytest.fixture
def spawned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[tuple[str, ...], dict[str, str]]]:
    """Every child process the driver starts: its command line and environment."""
    seen: list[tuple[tuple[str, ...], dict[str, str]]] = []
    real = asyncio.create_subprocess_exec

    async def spy(*argv: str, **kwargs: Any) -> asyncio.subprocess.Process:
        seen.append((argv, dict(kwargs.get("env") or {})))
        return await real(*argv, **kwargs)

    monkeypatch.setattr(asyncio, "create_subprocess_exec", spy)
    return seen


@pytest.fixture(autouse=True)
def powered_on(ipmi_sim: IpmiSim) -> None:
    """Each test starts with the machine on, whatever the one before did."""
    ipmi_sim.set_power(True)


async def within(aw: Awaitable[T], bound_s: float) -> T:
    """``aw``'s result; fails if it is still running after ``bound_s`` (a hang)."""
    return await asyncio.wait_for(aw, bound_s)


def test_implements_the_protocols(provider: IpmiProvider) -> None:
    assert provider.kind == "ipmi"
    protocols = (Provider, SupportsPower, SupportsReboot, SupportsReprovision, SupportsReachCheck)
    for protocol in protocols:
        assert isinstance(provider, protocol), protocol


async def test_power_off_and_on_are_seen_by_the_bmc(
    provider: IpmiProvider, ipmi_sim: IpmiSim
) -> None:
    mark = ipmi_sim.mark()
    assert await provider.power_state("gpu-01") is PowerState.ON
    await provider.power_off("gpu-01")
    assert await provider.power_state("gpu-01") is PowerState.OFF
    await provider.power_off("gpu-01")  # already off: not asked again
    await provider.power_on("gpu-01")
    await provider.power_on("gpu-01")
    assert await provider.power_state("gpu-01") is PowerState.ON
    assert ipmi_sim.transitions_since(mark) == ["power 0", "power 1"]


async def test_power_cycle_goes_off_then_on(provider: IpmiProvider, ipmi_sim: IpmiSim) -> None:
    mark = ipmi_sim.mark()
    await provider.power_cycle("gpu-01")
    # The BMC powers back on by itself a moment later (ipmi_sim: after 1 s).
    await eventually(
        lambda: ipmi_sim.transitions_since(mark) == ["power 0", "power 1"],
        timeout_s=10,
        what="the BMC's power-on after the cycle",
    )
    assert await provider.power_state("gpu-01") is PowerState.ON


async def test_power_cycle_of_a_machine_that_is_off_powers_it_on(
    provider: IpmiProvider, ipmi_sim: IpmiSim
) -> None:
    ipmi_sim.set_power(False)
    mark = ipmi_sim.mark()
    await provider.power_cycle("gpu-01")
    assert ipmi_sim.transitions_since(mark) == ["power 1"]


async def test_reboot_is_a_hard_reset_or_a_power_on(
    provider: IpmiProvider, ipmi_sim: IpmiSim
) -> None:
    mark = ipmi_sim.mark()
    await provider.reboot("gpu-01")
    assert ipmi_sim.transitions_since(mark) == ["reset 1"]
    ipmi_sim.set_power(False)
    await provider.reboot("gpu-01")
    assert ipmi_sim.transitions_since(mark) == ["reset 1", "power 1"]


async def test_reprovision_sets_a_pxe_boot_then_resets(
    provider: IpmiProvider, ipmi_sim: IpmiSim, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpufleet")
    mark = ipmi_sim.mark()
    await provider.reprovision("gpu-01", user_data={"gpufleet_node_token": "tok-secret-1"})
    assert ipmi_sim.transitions_since(mark) == ["boot pxe", "reset 1"]
    flags = await provider.boot_flags("gpu-01")  # read back from the BMC
    assert flags.device == "pxe"
    assert "gpufleet_node_token" in caplog.text  # the key, never the value
    assert "tok-secret-1" not in caplog.text


async def test_get_and_list_instances(provider: IpmiProvider, ipmi_sim: IpmiSim) -> None:
    assert await provider.get_instance("no-such-host") is None
    instance = await provider.get_instance("gpu-01")
    assert instance is not None
    assert instance.state is InstanceState.RUNNING
    assert instance.booted_at is None  # a BMC cannot prove a boot
    assert (instance.hostname, instance.serial, instance.rack) == ("gpu-01.lab", "SN-gpu-01", "r1")
    assert instance.bmc_address == "127.0.0.1"
    ipmi_sim.set_power(False)
    listed = await provider.list_instances("c1")
    assert [(i.instance_id, i.state) for i in listed] == [("gpu-01", InstanceState.PENDING)]


async def test_provision_claims_a_spare_and_powers_it_on(
    provider: IpmiProvider, directory: MemoryDirectory, ipmi_sim: IpmiSim
) -> None:
    directory.add(ipmi_sim.access("spare-01", cluster_id="c2"), spare=True)
    ipmi_sim.set_power(False)
    mark = ipmi_sim.mark()
    request = ProvisionRequest(
        client_token="node-7/0", cluster_id="c2", node_name="c2-n7", gpu_model="H100", gpu_count=8
    )
    first = await provider.provision(request)
    again = await provider.provision(request)  # same token: same host, nothing more asked
    assert (first.instance_id, first.state, first.client_token) == (
        "spare-01",
        InstanceState.RUNNING,
        "node-7/0",
    )
    assert (again.instance_id, again.node_name, again.cluster_id) == ("spare-01", "c2-n7", "c2")
    assert ipmi_sim.transitions_since(mark) == ["power 1"]
    other = ProvisionRequest(
        client_token="node-8/0", cluster_id="c2", node_name="c2-n8", gpu_model="H100", gpu_count=8
    )
    with pytest.raises(DriverError, match=r"ipmi: cluster c2: no spare host .* c2-n8"):
        await provider.provision(other)


async def test_terminate_powers_off_and_releases(
    provider: IpmiProvider, directory: MemoryDirectory, ipmi_sim: IpmiSim
) -> None:
    mark = ipmi_sim.mark()
    await provider.terminate("gpu-01")
    await provider.terminate("gpu-01")  # idempotent
    await provider.terminate("no-such-host")
    assert ipmi_sim.transitions_since(mark) == ["power 0"]
    assert directory.released == ["gpu-01"]
    instance = await provider.get_instance("gpu-01")
    assert instance is not None and instance.state is InstanceState.TERMINATED
    assert await provider.list_instances("c1") == []


async def test_the_password_never_reaches_a_command_line_a_message_or_a_log(
    provider: IpmiProvider,
    directory: MemoryDirectory,
    spawned: list[tuple[tuple[str, ...], dict[str, str]]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    await provider.power_state("gpu-01")
    with pytest.raises(DriverError) as refused:
        await provider.power_state("wrong-pw")
    reach = await provider.check_reach("wrong-pw")
    argvs = [argv for argv, _ in spawned]
    assert argvs and all("-E" in argv and "-P" not in argv for argv in argvs)
    for secret in (BMC_PASSWORD, WRONG_PASSWORD):
        assert not any(secret in arg for argv in argvs for arg in argv)
        assert secret not in str(refused.value) and secret not in repr(refused.value)
        assert secret not in reach.detail and secret not in repr(reach)
        assert secret not in caplog.text
    assert WRONG_PASSWORD not in repr(directory.by_id["wrong-pw"])
    assert [env["IPMI_PASSWORD"] for _, env in spawned][:2] == [BMC_PASSWORD, WRONG_PASSWORD]


async def test_a_wrong_password_fails_at_once_naming_the_host(
    provider: IpmiProvider, spawned: list[tuple[tuple[str, ...], dict[str, str]]]
) -> None:
    with pytest.raises(IpmiError) as refused:
        await provider.power_on("wrong-pw")
    assert refused.value.failure is Failure.AUTH
    message = str(refused.value)
    assert message.startswith("ipmi: host wrong-pw.lab (wrong-pw, BMC 127.0.0.1:")
    assert "refused the credentials of user 'gpufleet'" in message
    assert "fix the user name or password" in message
    assert len(spawned) == 1  # never retried


async def test_a_bmc_nobody_listens_on_fails_within_the_bound(
    provider: IpmiProvider, spawned: list[tuple[tuple[str, ...], dict[str, str]]]
) -> None:
    with pytest.raises(IpmiError) as failed:
        await within(provider.power_state("nobody-home"), CONFIG.call_bound_s + 5)
    assert failed.value.failure is Failure.UNREACHABLE
    assert str(failed.value).startswith("ipmi: host nobody-home.lab (nobody-home, BMC 127.0.0.1:")
    assert "no answer from the BMC" in str(failed.value)
    assert "(tried 2 times)" in str(failed.value)
    assert len(spawned) == CONFIG.retries + 1


async def test_a_hung_bmc_times_out(
    directory: MemoryDirectory, ipmi_sim: IpmiSim, silent_bmc: SilentBmc
) -> None:
    # ipmitool alone would retransmit for 5 x 1 s: the driver kills it at timeout_s.
    config = IpmiConfig(
        cipher_suite=3, timeout_s=1.0, retries=1, retry_backoff_s=0.1, udp_retries=5
    )
    directory.add(ipmi_sim.access("hung", port=silent_bmc.port))
    provider = IpmiProvider(config, directory)
    with pytest.raises(IpmiError) as failed:
        await within(provider.reboot("hung"), config.call_bound_s + 5)
    assert failed.value.failure is Failure.TIMEOUT
    assert "timed out: no result within 1 s" in str(failed.value)
    assert str(failed.value).startswith("ipmi: host hung.lab (hung, BMC 127.0.0.1:")
    assert silent_bmc.received > 0  # it was asked, and said nothing
    reach = await within(provider.check_reach("hung"), config.timeout_s + 5)
    assert (reach.reachable, reach.power) == (False, PowerState.UNKNOWN)
    assert reach.detail.startswith("timed out: ")


async def test_check_reach_reports_and_changes_nothing(
    provider: IpmiProvider, ipmi_sim: IpmiSim
) -> None:
    mark = ipmi_sim.mark()
    ok = await provider.check_reach("gpu-01")
    assert (ok.instance_id, ok.reachable, ok.power) == ("gpu-01", True, PowerState.ON)
    refused = await provider.check_reach("wrong-pw")
    assert (refused.reachable, refused.power) == (False, PowerState.UNKNOWN)
    assert refused.detail.startswith("credentials refused: ipmi: host wrong-pw")
    silent = await within(provider.check_reach("nobody-home"), CONFIG.timeout_s + 5)
    assert silent.detail.startswith("unreachable: ipmi: host nobody-home")
    missing = await provider.check_reach("no-such-host")
    assert (missing.reachable, missing.detail) == (False, "not in the host inventory")
    assert ipmi_sim.transitions_since(mark) == []


async def test_ipmi_1_5_lan_works_too(directory: MemoryDirectory, ipmi_sim: IpmiSim) -> None:
    provider = IpmiProvider(
        IpmiConfig(interface="lan", timeout_s=5.0, retries=0, udp_timeout_s=1, udp_retries=1),
        directory,
    )
    mark = ipmi_sim.mark()
    await provider.power_off("gpu-01")
    assert await provider.power_state("gpu-01") is PowerState.OFF
    assert ipmi_sim.transitions_since(mark) == ["power 0"]
    with pytest.raises(IpmiError) as refused:
        await provider.power_state("wrong-pw")
    assert refused.value.failure is Failure.AUTH


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"interface": "serial"}, "interface must be lanplus or lan"),
        ({"cipher_suite": 18}, "cipher_suite must be within 0..17"),
        ({"timeout_s": 0}, "timeout_s must be > 0"),
        ({"retries": -1}, "retries must be >= 0"),
        ({"udp_retries": 0}, "udp_retries >= 1"),
    ],
)
def test_config_rejects_bad_settings(changes: dict[str, Any], complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        IpmiConfig(**changes)


def test_call_bound_counts_every_try_and_pause() -> None:
    config = IpmiConfig(timeout_s=10, retries=2, retry_backoff_s=1)
    assert config.call_bound_s == 10 * 3 + 1 + 2


async def test_missing_ipmitool_or_credential_says_what_to_do(
    directory: MemoryDirectory, ipmi_sim: IpmiSim
) -> None:
    no_tool = IpmiProvider(IpmiConfig(ipmitool="/nonexistent/ipmitool"), directory)
    with pytest.raises(
        DriverError, match=r"ipmi: host gpu-01.lab \(gpu-01, .* could not start .* install ipmitool"
    ):
        await no_tool.power_state("gpu-01")
    bare = ipmi_sim.access("bare")
    directory.add(dataclasses.replace(bare, credential=None))
    with pytest.raises(DriverError, match=r"ipmi: host bare.lab \(bare, .* no BMC credential"):
        await IpmiProvider(CONFIG, directory).power_on("bare")
    with pytest.raises(DriverError, match=r"ipmi: host no-such-host: not in the host inventory"):
        await IpmiProvider(CONFIG, directory).reboot("no-such-host")
