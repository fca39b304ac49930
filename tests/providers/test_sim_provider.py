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
    SupportsGpuReset,
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
    for proto in (
        Provider,
        SupportsPower,
        SupportsReboot,
        SupportsReprovision,
        SupportsReplace,
        SupportsGpuReset,
    ):
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
    with pytest.raises(ValueError, match="reboot_failure_rate"):
        SimProviderConfig(reboot_failure_rate=-0.1)
    with pytest.raises(ValueError, match="reset_gpu_failure_rate"):
        SimProviderConfig(reset_gpu_failure_rate=1.5)
    with pytest.raises(ValueError, match="reset_gpu_delay_s"):
        SimProviderConfig(reset_gpu_delay_s=(-1.0, 1.0))
    defaults = SimProviderConfig()
    assert defaults.reset_gpu_delay_s == (5.0, 15.0)
    assert defaults.reboot_failure_rate == defaults.reset_gpu_failure_rate == 0.0


async def test_booted_at_is_the_last_boot_start_and_survives_a_reopen(
    tmp_path: Path, clock: FakeClock
) -> None:
    path = tmp_path / "w.json"
    provider = SimProvider(SimWorld(path, clock=clock, seed=5), config=CONFIG)
    inst = await provider.provision(request("c1-000"))
    assert inst.booted_at == inst.created_at
    clock.advance(21)
    asked = clock.now()
    await provider.reboot(inst.instance_id)
    clock.advance(6)
    reopened = SimProvider(SimWorld(path, clock=clock, seed=5), config=CONFIG)
    got = await reopened.get_instance(inst.instance_id)
    assert got is not None and got.state is InstanceState.RUNNING
    assert got.booted_at is not None and got.booted_at >= asked  # the reboot happened
    assert reopened.world.reboot_count(inst.instance_id) == 1
    await reopened.reprovision(inst.instance_id, user_data={})
    again = await reopened.get_instance(inst.instance_id)
    assert again is not None and again.booted_at == clock.now()


async def test_reboot_failure_rate(clock: FakeClock) -> None:
    config = SimProviderConfig(reboot_delay_s=(5.0, 5.0), reboot_failure_rate=1.0)
    provider = SimProvider(SimWorld(None, clock=clock, seed=1), config=config)
    inst = await provider.provision(request("c1-000"))
    clock.advance(91)
    await provider.reboot(inst.instance_id)
    got = await provider.get_instance(inst.instance_id)
    assert got is not None and got.state is InstanceState.PENDING
    clock.advance(6)
    got = await provider.get_instance(inst.instance_id)
    assert got is not None and got.state is InstanceState.FAILED
    assert got.error is not None and "reboot" in got.error


async def test_reset_gpu_clears_the_gpu_and_kills_the_job(
    provider: SimProvider, clock: FakeClock
) -> None:
    inst = await provider.provision(request("c1-000"))
    clock.advance(21)
    world = provider.world
    job = world.submit_job(cluster_id="c1", node_count=1, gpus_per_node=8, duration_s=600)
    world.advance()
    world.inject_fault(inst.instance_id, signature_id="xid-48", gpu_index=4)
    world.inject_fault(inst.instance_id, signature_id="xid-79", gpu_index=5)
    since = clock.now()
    await provider.reset_gpu(inst.instance_id, gpu_index=4)
    assert [f.gpu_index for f in world.faults_of(inst.instance_id)] == [5]
    assert [(j.job_id, j.state) for j in world.accounting_since(since)] == [
        (job.job_id, "NODE_FAIL")
    ]
    sim = world.get_instance(inst.instance_id)
    assert sim is not None and list(sim.resetting_until) == [4]
    low, high = CONFIG.reset_gpu_delay_s
    assert low <= (sim.resetting_until[4] - clock.now()).total_seconds() <= high
    got = await provider.get_instance(inst.instance_id)
    assert got is not None and got.booted_at == inst.created_at  # no reboot


async def test_reset_gpu_failure_rate(clock: FakeClock) -> None:
    config = SimProviderConfig(provision_delay_s=(1.0, 1.0), reset_gpu_failure_rate=1.0)
    provider = SimProvider(SimWorld(None, clock=clock, seed=1), config=config)
    inst = await provider.provision(request("c1-000"))
    clock.advance(2)
    with pytest.raises(DriverError, match="c1-000: nvidia-smi -r failed"):
        await provider.reset_gpu(inst.instance_id, gpu_index=None)
