"""RedfishProvider against sushy-emulator (fake driver): power, reboot, reprovision,
provision/terminate, and the failures a BMC fleet shows (bad credentials, a closed port,
a BMC that hangs, no such system)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from redfish_fakes import (
    PASSWORD,
    SYSTEMS,
    USER,
    Emulator,
    InMemoryHostDirectory,
    closed_port,
    hung_bmc,
)

from gpufleet.core.errors import DriverError
from gpufleet.providers.base import (
    Credential,
    HostAccess,
    InstanceState,
    PowerState,
    Provider,
    ProvisionRequest,
    SupportsPower,
    SupportsReachCheck,
    SupportsReboot,
    SupportsReprovision,
)
from gpufleet.providers.redfish.config import RedfishConfig
from gpufleet.providers.redfish.driver import RedfishProvider

UUIDS = list(SYSTEMS)
CONFIG = RedfishConfig(
    scheme="http",
    request_timeout_s=1.0,
    retries=1,
    backoff_s=0.01,
    backoff_max_s=0.05,
    power_wait_s=5.0,
    power_poll_s=0.05,
    task_poll_s=0.05,
)


def host(emulator: Emulator, n: int, **changes: object) -> HostAccess:
    uuid = UUIDS[n - 1]
    fields: dict[str, object] = {
        "host_id": f"h{n}",
        "hostname": SYSTEMS[uuid][0],
        "address": emulator.address,
        "system_id": uuid,
        "credential": Credential(USER, PASSWORD),
        "cluster_id": "c1",
    }
    fields.update(changes)
    return HostAccess(**fields)  # type: ignore[arg-type]


def provider(*hosts: HostAccess, config: RedfishConfig = CONFIG) -> RedfishProvider:
    return RedfishProvider(config, InMemoryHostDirectory(list(hosts)))


def test_it_implements_the_protocols() -> None:
    p = provider()
    for protocol in (Provider, SupportsPower, SupportsReboot, SupportsReprovision):
        assert isinstance(p, protocol)
    assert isinstance(p, SupportsReachCheck)
    assert p.kind == "redfish"


async def test_power_on_off_and_state_are_what_the_emulator_sees(emulator: Emulator) -> None:
    p = provider(host(emulator, 1))
    assert await p.power_state("h1") is PowerState.OFF
    await p.power_on("h1")
    assert await p.power_state("h1") is PowerState.ON
    await p.power_on("h1")  # already on: nothing sent
    await p.power_off("h1")
    assert await p.power_state("h1") is PowerState.OFF
    assert emulator.events(UUIDS[0]) == ["reset On", "power On", "reset ForceOff", "power Off"]


async def test_reboot_picks_graceful_restart_and_power_goes_off_then_on(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    p = provider(host(emulator, 2))
    with caplog.at_level(logging.INFO, logger="gpufleet.providers.redfish"):
        await p.reboot("h2")
    # The fake driver applies a pending change when the system is next read.
    assert await p.power_state("h2") is PowerState.ON
    assert emulator.events(UUIDS[1]) == ["reset GracefulRestart", "power Off", "power On"]
    assert "reboot by GracefulRestart" in caplog.text


async def test_power_cycle_without_power_cycle_type_is_force_off_then_on(
    emulator: Emulator,
) -> None:
    # The emulator does not advertise PowerCycle: ForceOff, wait for Off, On.
    p = provider(host(emulator, 4))
    await p.power_cycle("h4")
    assert await p.power_state("h4") is PowerState.ON
    assert emulator.events(UUIDS[3]) == ["reset ForceOff", "power Off", "reset On", "power On"]


async def test_reprovision_sets_a_one_time_pxe_boot_then_restarts(emulator: Emulator) -> None:
    p = provider(host(emulator, 3))
    await p.reprovision("h3", user_data={"token": "x"})
    boot = emulator.system(UUIDS[2], auth=(USER, PASSWORD))["Boot"]
    assert boot["BootSourceOverrideTarget"] == "Pxe"
    assert boot["BootSourceOverrideMode"] == "UEFI"
    # sushy-emulator stores only the target and shows "Continuous" whatever was asked.
    # The boot override first, then the restart: the order a PXE install needs.
    assert emulator.events(UUIDS[2]) == [
        "boot Pxe", "reset GracefulRestart", "power Off", "power On",
    ]  # fmt: skip


async def test_provision_claims_a_spare_powers_it_on_and_is_idempotent(
    emulator: Emulator,
) -> None:
    directory = InMemoryHostDirectory([])
    directory.add_spare(host(emulator, 5, cluster_id=None))
    p = RedfishProvider(CONFIG, directory)
    request = ProvisionRequest(
        client_token="tok-1", cluster_id="c9", node_name="n1", gpu_model="h100", gpu_count=8
    )
    first = await p.provision(request)
    again = await p.provision(request)
    assert (first.instance_id, first.state, first.cluster_id) == ("h5", InstanceState.RUNNING, "c9")
    assert first.client_token == "tok-1" and first.booted_at is None
    assert again.instance_id == "h5"
    assert emulator.events(UUIDS[4]) == ["reset On", "power On"]  # once
    other = ProvisionRequest(
        client_token="tok-2", cluster_id="c9", node_name="n2", gpu_model="h100", gpu_count=8
    )
    with pytest.raises(DriverError, match="redfish: cluster c9: no spare host left for node n2"):
        await p.provision(other)


async def test_get_list_and_terminate(emulator: Emulator) -> None:
    directory = InMemoryHostDirectory([host(emulator, 6)])
    p = RedfishProvider(CONFIG, directory)
    instance = await p.get_instance("h6")
    assert instance is not None and instance.state is InstanceState.RUNNING
    assert instance.node_name == "gpu-node-06" and instance.bmc_address == emulator.address
    assert await p.get_instance("nope") is None
    assert [i.instance_id for i in await p.list_instances("c1")] == ["h6"]
    await p.terminate("h6")
    await p.terminate("h6")  # already off: fine
    await p.terminate("nope")  # not in the inventory: fine
    assert await p.power_state("h6") is PowerState.OFF
    assert directory.released == ["h6"]
    assert emulator.events(UUIDS[5]) == ["reset ForceOff", "power Off"]


async def test_check_reach_of_a_healthy_bmc(emulator: Emulator) -> None:
    p = provider(host(emulator, 6, host_id="h6r"))
    check = await p.check_reach("h6r")
    assert check.reachable
    assert check.detail.startswith("Redfish 1.5.0, power ")
    assert "resets: On, ForceOff, GracefulShutdown, GracefulRestart" in check.detail


async def test_wrong_password_names_the_host_never_the_password(
    emulator: Emulator, caplog: pytest.LogCaptureFixture
) -> None:
    bad = Credential(USER, "wrong-" + PASSWORD)
    p = provider(host(emulator, 2, credential=bad))
    with caplog.at_level(logging.DEBUG), pytest.raises(DriverError) as caught:
        await p.power_state("h2")
    message = caught.value.message
    assert "redfish: host gpu-node-02 (h2)" in message
    assert "refused the credentials" in message and "HTTP 401" in message
    check = await p.check_reach("h2")
    assert not check.reachable and "refused the credentials" in check.detail
    for text in (message, str(caught.value), repr(caught.value), caplog.text, check.detail):
        assert PASSWORD not in text
    assert PASSWORD not in repr(host(emulator, 2))


async def test_no_such_system_fails_at_once(emulator: Emulator) -> None:
    p = provider(host(emulator, 2, system_id="no-such-uuid"))
    with pytest.raises(DriverError, match=r"host gpu-node-02 \(h2\).*no system no-such-uuid"):
        await p.power_state("h2")
    check = await p.check_reach("h2")
    assert not check.reachable and "check the host's system_id" in check.detail


async def test_several_systems_and_no_system_id_is_an_error(emulator: Emulator) -> None:
    p = provider(host(emulator, 2, system_id=None))
    with pytest.raises(DriverError, match=r"has 6 systems.*set the host's system_id"):
        await p.power_state("h2")


async def test_closed_port_fails_fast_after_its_retries() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    access = HostAccess(host_id="h9", hostname="gone-01", address=f"127.0.0.1:{closed_port()}")
    p = RedfishProvider(CONFIG, InMemoryHostDirectory([access]), sleep=sleep)
    with pytest.raises(DriverError, match=r"host gone-01 \(h9\).*cannot reach the BMC.*2 tries"):
        await p.power_state("h9")
    assert slept == [CONFIG.backoff_s]
    check = await p.check_reach("h9")
    assert not check.reachable and "cannot reach the BMC" in check.detail
    assert check.power is PowerState.UNKNOWN


async def test_a_hung_bmc_times_out_within_the_bound() -> None:
    config = RedfishConfig(scheme="http", request_timeout_s=0.3, retries=1, backoff_s=0.01)
    with hung_bmc() as port:
        access = HostAccess(host_id="h8", hostname="hung-01", address=f"127.0.0.1:{port}")
        p = RedfishProvider(config, InMemoryHostDirectory([access]))
        # A guard against a regression that waits forever, not a measurement.
        async with asyncio.timeout(30):
            with pytest.raises(DriverError, match=r"host hung-01 \(h8\).*did not answer in time"):
                await p.power_state("h8")
            check = await p.check_reach("h8")
    assert not check.reachable and "did not answer in time (0.3 s)" in check.detail


async def test_tls_to_a_plain_http_bmc_fails_with_tls_advice(emulator: Emulator) -> None:
    config = RedfishConfig(scheme="https", request_timeout_s=1.0, retries=2)
    p = provider(host(emulator, 2), config=config)
    with pytest.raises(DriverError, match=r"host gpu-node-02 \(h2\).*TLS to the BMC failed"):
        await p.power_state("h2")
