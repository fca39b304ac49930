from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.core.clock import FakeClock
from gpufleet.core.errors import DriverError
from gpufleet.providers.base import (
    InstanceState,
    PowerState,
    Provider,
    ProvisionRequest,
    SupportsPower,
    SupportsReboot,
    SupportsReplace,
    SupportsReprovision,
)
from gpufleet.providers.sim.config import SimProviderConfig
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.sim.world import SimWorld

CONFIG = SimProviderConfig(provision_delay_s=(10.0, 20.0), reboot_delay_s=(5.0, 5.0))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def provider(tmp_path: Path, clock: FakeClock) -> SimProvider:
    return SimProvider(SimWorld(tmp_path / "w.json", clock=clock, seed=5), config=CONFIG)


def request(name: str, *, token: str | None = None, cluster: str = "c1") -> ProvisionRequest:
    return ProvisionRequest(
        client_token=token or f"t-{name}",
        cluster_id=cluster,
        node_name=name,
        gpu_model="NVIDIA H100 80GB HBM3",
        gpu_count=8,
        user_data={"gpufleet_url": "http://x", "gpufleet_node_token": "n1"},
    )


def test_implements_every_protocol(provider: SimProvider) -> None:
    assert provider.kind == "sim"
    for proto in (Provider, SupportsPower, SupportsReboot, SupportsReprovision, SupportsReplace):
        assert isinstance(provider, proto)


async def test_provision_then_running(provider: SimProvider, clock: FakeClock) -> None:
    inst = await provider.provision(request("c1-000"))
    assert inst.state is InstanceState.PENDING
    assert inst.hostname == "c1-000" and inst.serial and inst.bmc_address
    assert inst.rack == "rack-000" and inst.leaf_switch == "leaf-00" and inst.pdu == "pdu-000"
    clock.advance(21)
    got = await provider.get_instance(inst.instance_id)
    assert got is not None and got.state is InstanceState.RUNNING
    assert await provider.power_state(inst.instance_id) is PowerState.ON


async def test_provision_is_idempotent(provider: SimProvider) -> None:
    a = await provider.provision(request("c1-000"))
    b = await provider.provision(request("c1-000"))
    assert a.instance_id == b.instance_id
    assert len(await provider.list_instances("c1")) == 1


async def test_list_instances_is_per_cluster_and_hides_terminated(provider: SimProvider) -> None:
    a = await provider.provision(request("c1-000"))
    await provider.provision(request("c2-000", cluster="c2"))
    assert [i.node_name for i in await provider.list_instances("c1")] == ["c1-000"]
    await provider.terminate(a.instance_id)
    await provider.terminate(a.instance_id)
    assert await provider.list_instances("c1") == []
    gone = await provider.get_instance(a.instance_id)
    assert gone is not None and gone.state is InstanceState.TERMINATED
    assert await provider.power_state(a.instance_id) is PowerState.OFF
    assert await provider.get_instance("i-nope") is None


async def test_reboot_and_power_cycle(provider: SimProvider, clock: FakeClock) -> None:
    inst = await provider.provision(request("c1-000"))
    clock.advance(21)
    for action in (provider.reboot, provider.power_cycle):
        await action(inst.instance_id)
        got = await provider.get_instance(inst.instance_id)
        assert got is not None and got.state is InstanceState.PENDING
        clock.advance(6)
        got = await provider.get_instance(inst.instance_id)
        assert got is not None and got.state is InstanceState.RUNNING


async def test_reprovision_changes_user_data(provider: SimProvider, clock: FakeClock) -> None:
    inst = await provider.provision(request("c1-000"))
    clock.advance(21)
    await provider.reprovision(inst.instance_id, user_data={"gpufleet_node_token": "n2"})
    sim = provider.world.get_instance(inst.instance_id)
    assert sim is not None and sim.user_data == {"gpufleet_node_token": "n2"}


async def test_replace(provider: SimProvider, clock: FakeClock) -> None:
    old = await provider.provision(request("c1-000"))
    clock.advance(21)
    new_req = request("c1-000", token="t-c1-000-r1")
    new = await provider.replace(old.instance_id, request=new_req)
    again = await provider.replace(old.instance_id, request=new_req)
    assert new.instance_id == again.instance_id != old.instance_id
    assert new.serial != old.serial
    assert [i.instance_id for i in await provider.list_instances("c1")] == [new.instance_id]


async def test_errors_name_the_node(provider: SimProvider) -> None:
    with pytest.raises(DriverError, match="c1-000"):
        await provider.provision(
            ProvisionRequest("t", "c1", "c1-000", gpu_model="NVIDIA K80", gpu_count=8)
        )
    with pytest.raises(DriverError, match="i-nope"):
        await provider.reboot("i-nope")


async def test_failure_rate(tmp_path: Path, clock: FakeClock) -> None:
    config = SimProviderConfig(provision_delay_s=(1.0, 1.0), failure_rate=1.0)
    provider = SimProvider(SimWorld(None, clock=clock), config=config)
    inst = await provider.provision(request("c1-000"))
    clock.advance(2)
    got = await provider.get_instance(inst.instance_id)
    assert got is not None and got.state is InstanceState.FAILED and got.error


def test_config_validates() -> None:
    with pytest.raises(ValueError, match="failure_rate"):
        SimProviderConfig(failure_rate=2.0)
    with pytest.raises(ValueError, match="provision_delay_s"):
        SimProviderConfig(provision_delay_s=(5.0, 1.0))
