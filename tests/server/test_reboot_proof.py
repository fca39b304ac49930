"""A reboot is done when the machine proves it: the node's agent reports a new kernel boot
id. A provider's answer (a BMC's 204, a cloud API's 200, even its own "booted at") is
only the request being taken."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from gpufleet.providers.base import Instance, InstanceState, ProvisionRequest
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.db.tables import RepairRow
from gpufleet.sim.models import sim_boot_id
from gpufleet.testing.fleet import SimFleet, sim_fleet


async def _reboot_repair(fleet: SimFleet, node: str) -> dict[str, Any]:
    response = await fleet.app.client.post(
        f"/api/v1/nodes/{fleet.node_id(node)}/actions",
        json={"action": "reboot", "reason": "test"},
    )
    assert response.status_code in (200, 201, 202), response.text
    return dict(response.json())


async def test_a_reboot_is_done_when_the_agent_reports_a_new_boot_id(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        instance_id = fleet.instance_id("train-000")
        first = sim_boot_id(instance_id, fleet.world.get_instance(instance_id).boot_id)  # type: ignore[union-attr]
        await fleet.until(lambda: _boot_id_is(fleet, "train-000", first), what="the first boot id")
        action = await _reboot_repair(fleet, "train-000")
        repair_id = action["repair"]["id"]
        await fleet.until(
            lambda: _status_in(fleet, repair_id, "verifying", "succeeded"),
            ticks=200,
            what="the reboot done",
        )
        sim = fleet.world.get_instance(instance_id)
        assert sim is not None
        second = sim_boot_id(instance_id, sim.boot_id)
        assert second != first
        node = await fleet.node("train-000")
        assert node["boot_id"] == second
        steps = await fleet.events(fleet.cluster_id, "repair.status")
        done = [e for e in steps if e["data"].get("to") == "verifying"]
        assert done and f"boot id {second}" in done[0]["message"], done
        booted = await fleet.events(fleet.cluster_id, "node.booted")
        assert [(e["data"]["old_boot_id"], e["data"]["new_boot_id"]) for e in booted] == [
            (first, second)
        ]


async def test_a_provider_that_says_yes_and_does_nothing_fails_the_repair(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        instance_id = fleet.instance_id("train-000")
        sim = fleet.world.get_instance(instance_id)
        assert sim is not None
        first = sim_boot_id(instance_id, sim.boot_id)
        await fleet.until(lambda: _boot_id_is(fleet, "train-000", first), what="the first boot id")
        provider = fleet.app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        # A stand-in for a BMC that answers every reset and does nothing, and even claims
        # the machine booted just now: the node's agent keeps its boot id.
        real_get = provider.get_instance

        async def reboot(_instance_id: str) -> None:
            return None

        async def get_instance(iid: str) -> Instance | None:
            found = await real_get(iid)
            if found is None or iid != instance_id:
                return found
            return dataclasses.replace(found, booted_at=fleet.clock.now())

        provider.reboot = reboot  # type: ignore[method-assign]
        provider.get_instance = get_instance  # type: ignore[method-assign]

        action = await _reboot_repair(fleet, "train-000")
        repair_id = action["repair"]["id"]
        failed = await fleet.until(
            lambda: _status_in(fleet, repair_id, "failed", "verifying", "succeeded"),
            ticks=60,
            seconds=10.0,
            what="the repair to end",
        )
        assert failed["status"] == "failed", failed
        assert "machine not back 300 s after reboot" in failed["detail"], failed
        assert f"still reports boot id {first}" in failed["detail"], failed
        node = await fleet.node("train-000")
        assert node["boot_id"] == first
        assert node["state"] != "in_service"  # never back in service on the BMC's word


async def test_a_reboot_asked_just_before_a_crash_is_not_asked_again_while_it_reboots(
    database_url: str, tmp_path: Path
) -> None:
    """The server asked for the reboot and died before recording the ask (the crash test's
    ``repair.acting.after_call``). Restarted while the machine is still rebooting, its agent
    silent: asking again would reboot it twice. The step waits for the new boot id."""
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        instance_id = fleet.instance_id("train-000")
        provider = fleet.app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        asked: list[str] = []
        real_reboot = provider.reboot

        async def reboot(iid: str) -> None:
            asked.append(iid)
            await real_reboot(iid)

        provider.reboot = reboot  # type: ignore[method-assign]
        repair_id = (await _reboot_repair(fleet, "train-000"))["repair"]["id"]

        await _until_asked(fleet, repair_id)
        assert asked == [instance_id]
        # The crash: the ask happened, its record did not.
        async with fleet.app.ctx.db.transaction() as session:
            row = await session.get(RepairRow, repair_id)
            assert row is not None and row.progress is not None
            row.progress = {k: v for k, v in row.progress.items() if k != "called_at"}
        ended = await _until_ended(
            fleet, repair_id, ticks=200, seconds=1.0, what="the repair to end"
        )
        assert ended["status"] == "succeeded", ended
        assert asked == [instance_id], "asked to reboot twice"
        assert fleet.world.reboot_count(instance_id) == 1


async def _until_asked(fleet: SimFleet, repair_id: str) -> None:
    """Tick until the repair has asked the provider (its ``called_at`` recorded)."""

    async def called() -> bool:
        return "called_at" in await _progress(fleet, repair_id)

    await fleet.until(called, ticks=30, seconds=1.0, what="the reboot asked")


async def _progress(fleet: SimFleet, repair_id: str) -> dict[str, Any]:
    async with fleet.app.ctx.db.session() as session:
        row = await session.get(RepairRow, repair_id)
        assert row is not None
        return dict(row.progress or {})


async def _boot_id_is(fleet: SimFleet, node: str, boot_id: str) -> bool:
    return bool((await fleet.node(node)).get("boot_id") == boot_id)


async def _until_ended(
    fleet: SimFleet, repair_id: str, *, ticks: int, what: str, seconds: float | None = None
) -> dict[str, Any]:
    """Tick until the repair succeeded or failed; the repair as it ended."""
    ended: dict[str, Any] = await fleet.until(
        lambda: _status_in(fleet, repair_id, "succeeded", "failed"),
        ticks=ticks,
        seconds=seconds,
        what=what,
    )
    return ended


async def _status_in(fleet: SimFleet, repair_id: str, *wanted: str) -> dict[str, Any] | None:
    repair = await fleet.repair(repair_id)
    return repair if repair["status"] in wanted else None


async def test_a_reprovision_by_relaunch_moves_the_node_onto_the_new_machine(
    database_url: str, tmp_path: Path
) -> None:
    """A provider with no in-place reinstall (AWS relaunches from the launch template)
    returns the new machine; the node follows it and the new machine's boot ends the step."""
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        provider = fleet.app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        old = fleet.instance_id("train-000")
        await fleet.until(
            lambda: _boot_id_is(fleet, "train-000", _boot_of(fleet, old)), what="a boot id"
        )

        async def relaunch(instance_id: str, *, user_data: dict[str, str]) -> Instance | None:
            sim = fleet.world.get_instance(instance_id)
            assert sim is not None
            request = ProvisionRequest(
                client_token=f"reprovision/{instance_id}",
                cluster_id=sim.cluster_id,
                node_name=sim.node_name,
                gpu_model=sim.gpu_model,
                gpu_count=len(sim.gpus),
                user_data=user_data,
            )
            return await provider.replace(instance_id, request=request)

        provider.reprovision = relaunch  # type: ignore[method-assign]
        response = await fleet.app.client.post(
            f"/api/v1/nodes/{fleet.node_id('train-000')}/actions",
            json={"action": "reprovision", "reason": "test"},
        )
        assert response.status_code in (200, 201, 202), response.text
        repair_id = response.json()["repair"]["id"]
        done = await _until_ended(fleet, repair_id, ticks=300, what="the reprovision")
        assert done["status"] == "succeeded", done
        node = await fleet.node("train-000")
        assert node["provider_instance_id"] not in (None, old), node
        new = node["provider_instance_id"]
        assert node["boot_id"] == _boot_of(fleet, new) and node["state"] == "in_service"
        moved = await fleet.events(fleet.cluster_id, "repair.step")
        assert any(f"{old} → {new}" in e["message"] for e in moved), moved


def _boot_of(fleet: SimFleet, instance_id: str) -> str:
    sim = fleet.world.get_instance(instance_id)
    assert sim is not None
    return sim_boot_id(instance_id, sim.boot_id)


async def test_a_failover_keeps_the_token_its_replacement_was_launched_with(
    database_url: str, tmp_path: Path
) -> None:
    """A cloud cannot change a launched instance's user data: every pass after the first
    follows the replacement it asked for, and the swap stores the first token's hash."""
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        provider = fleet.app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        first_asks: dict[str, ProvisionRequest] = {}
        sim_provision = provider.provision

        asks: list[str] = []

        async def like_ec2(request: ProvisionRequest) -> Instance:
            # A stand-in for EC2: the same client token returns the machine launched with
            # the first request's user data, whatever this request carries; it answers
            # pending to the first asks (a launch takes a few polls).
            asks.append(request.client_token)
            launched = await sim_provision(first_asks.setdefault(request.client_token, request))
            if len(asks) <= 2:
                return dataclasses.replace(launched, state=InstanceState.PENDING)
            return launched

        provider.provision = like_ec2  # type: ignore[method-assign]
        old = fleet.instance_id("train-000")
        response = await fleet.app.client.post(
            f"/api/v1/nodes/{fleet.node_id('train-000')}/actions",
            json={"action": "replace", "reason": "test"},
        )
        assert response.status_code in (200, 201, 202), response.text
        repair_id = response.json()["repair"]["id"]
        done = await _until_ended(fleet, repair_id, ticks=300, seconds=5.0, what="the failover")
        assert done["status"] == "succeeded", done
        node = await fleet.node("train-000")
        assert node["provider_instance_id"] not in (None, old) and node["state"] == "in_service"
        assert len(first_asks) == 1  # one replacement asked for


async def test_a_fault_between_the_boot_and_the_server_seeing_it_fails_the_reboot(
    database_url: str, tmp_path: Path
) -> None:
    """A GPU falls off the bus right after the machine boots, before its first report
    tells the server the reboot is done: the log line is older than the moment the step
    saw the new boot, yet newer than the ask. The repair fails on it (a CI run once waited
    on "7/8 GPUs" until the test gave up)."""
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        instance_id = fleet.instance_id("train-000")
        repair_id = (await _reboot_repair(fleet, "train-000"))["repair"]["id"]

        await _until_asked(fleet, repair_id)
        sim = fleet.world.get_instance(instance_id)
        assert sim is not None
        # Past the boot without a step of the agents: the machine is up, nobody knows yet.
        fleet.clock.advance((sim.ready_at - fleet.clock.now()).total_seconds() + 1)
        fleet.world.inject_fault(instance_id, signature_id="xid-79", gpu_index=3)
        ended = await _until_ended(
            fleet, repair_id, ticks=60, seconds=1.0, what="the repair to end"
        )
        assert ended["status"] == "failed", ended
        assert "xid-79" in ended["detail"] and "first seen after the reboot" in ended["detail"]
        assert fleet.world.reboot_count(instance_id) == 1
