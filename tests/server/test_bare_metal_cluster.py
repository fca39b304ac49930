"""A cluster whose provider is ``ipmi``: its machines are hosts of the inventory behind real
BMCs (one OpenIPMI ``ipmi_sim`` per host), its agents enroll with the cluster's enroll
token, and a sticky fault climbs the ladder reboot → reprovision → failover through the
BMCs, ending on the spare host with the cluster's size kept.

The same for ``redfish`` (sushy-tools' emulator) and ``ssh`` (a real sshd): enrolled,
ready, and xid-79 repaired by a reboot the peer saw. And what an enroll token can and
cannot do.

Stand-in, named as one: ``gpufleet.testing.machine_room.MachineRoom`` plays the machines
behind the peers and their install (its module doc). Everything the server does goes
through the real driver and the real peer, and the tests check what each peer saw.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from apihelpers import error_of, report_batch, send_report
from inventoryhelpers import KEY_A, import_hosts, put_credential
from sqlalchemy import select

from gpufleet.client.agent import enroll
from gpufleet.client.errors import ApiError
from gpufleet.core.agent_protocol import EnrollRequest
from gpufleet.server.db.tables import AuditLogRow, EventRow
from gpufleet.testing.fleet import SimFleet, sim_app
from gpufleet.testing.machine_room import (
    SERVER_URL,
    IpmiView,
    MachineRoom,
    PeerView,
    RedfishView,
    SshView,
    restarted,
    use_logged_ssh_reboot,
    use_quick_ipmi,
    use_quick_redfish,
)
from providers.ipmi.ipmi_lab import BMC_PASSWORD, BMC_USER, IpmiSim, free_udp_port, require_tools
from providers.peers import PeerHost, ssh_peer
from providers.redfish.redfish_fakes import PASSWORD, USER, start_emulator, stop_emulator

HOSTS = ("gpu-a", "gpu-b", "gpu-c")  # two members and one spare
SETTINGS: dict[str, Any] = {"secret_key": KEY_A, "ipmi_cipher_suite": 3}


@pytest.fixture(scope="module")
def bmcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, IpmiSim]]:
    """One BMC per host, so each host's power and resets are its own."""
    require_tools()  # fails loudly without ipmi_sim or ipmitool
    started: dict[str, IpmiSim] = {}
    try:
        for name in HOSTS:
            bmc = IpmiSim(tmp_path_factory.mktemp(name))
            bmc.start()
            started[name] = bmc
        yield started
    finally:
        for bmc in started.values():
            bmc.stop()


async def _metal_cluster(
    fleet: SimFleet, bmcs: dict[str, IpmiSim], *, spare: bool = True
) -> dict[str, Any]:
    client = fleet.app.client
    stored = await put_credential(client, "bmc", secret=BMC_PASSWORD, username=BMC_USER)
    assert stored.status_code == 200, stored.text
    created = await client.post(
        "/api/v1/clusters",
        json={
            "project": "ml",
            "name": "metal",
            "size": 2,
            "gpus_per_node": 8,
            "provider": "ipmi",
            "acceptance_tests": False,
        },
    )
    assert created.status_code == 201, created.text
    rows = [
        {
            "hostname": name,
            "bmc_type": "ipmi",
            "bmc_address": "127.0.0.1",
            "port": bmc.port,
            "credential": "bmc",
            "cluster": "metal",
            "serial": f"SN-{name}",
            "rack": "r1",
            "role": "spare" if name == "gpu-c" else "member",
        }
        for name, bmc in bmcs.items()
        if spare or name != "gpu-c"
    ]
    imported = await import_hosts(client, rows)
    assert imported.status_code == 200, imported.text
    cluster: dict[str, Any] = created.json()
    return cluster


async def _ready_metal(
    fleet: SimFleet, bmcs: dict[str, IpmiSim], http: httpx.AsyncClient, *, spare: bool = True
) -> tuple[MachineRoom, str, dict[str, dict[str, Any]]]:
    """A ready ipmi cluster behind quick-failing BMC calls: the room, the cluster id and
    its nodes by hostname."""
    for bmc in bmcs.values():
        bmc.set_power(True)  # every machine on, whatever an earlier test left
    use_quick_ipmi(fleet)
    room = MachineRoom(fleet, "ipmi", IpmiView(bmcs), http)
    fleet.loops.insert(0, room)  # type: ignore[arg-type]
    cid = str((await _metal_cluster(fleet, bmcs, spare=spare))["id"])
    room.enroll_token = await _issue_enroll_token(fleet, cid)
    await fleet.until(lambda: fleet.status_is(cid, "ready"), ticks=20, what="ready")
    nodes = {str(n["hostname"]): n for n in (await _nodes(fleet, cid)).values()}
    return room, cid, nodes


async def _issue_enroll_token(fleet: SimFleet, cluster_id: str) -> str:
    issued = await fleet.app.client.post(
        f"/api/v1/clusters/{cluster_id}/enroll-token", json={"ttl_s": 3600}
    )
    assert issued.status_code == 201, issued.text
    token = str(issued.json()["token"])
    assert token.startswith("gpfe_")
    return token


async def _nodes(fleet: SimFleet, cluster_id: str) -> dict[str, dict[str, Any]]:
    return await fleet.nodes_of(cluster_id)


async def _hosts(fleet: SimFleet) -> dict[str, dict[str, Any]]:
    """Project ml's hosts by hostname."""
    return {h["hostname"]: h for h in await fleet.get("/api/v1/projects/ml/hosts")}


async def _act(fleet: SimFleet, node_id: str, action: str, reason: str) -> str:
    """An admin's node action that starts an approved repair; returns the repair's id."""
    started = await fleet.app.client.post(
        f"/api/v1/nodes/{node_id}/actions", json={"action": action, "reason": reason}
    )
    assert started.status_code == 200, started.text
    return str(started.json()["repair"]["id"])


async def _end(
    fleet: SimFleet, repair_id: str, *, ticks: int, seconds: float, what: str
) -> dict[str, Any]:
    """Tick until the repair succeeded or failed; the repair then."""
    ended: dict[str, Any] = await fleet.until(
        functools.partial(_ended, fleet, repair_id), ticks=ticks, seconds=seconds, what=what
    )
    return ended


async def _approve_and_end(
    fleet: SimFleet, repair_id: str, *, reason: str = "", ticks: int, seconds: float, what: str
) -> dict[str, Any]:
    body = {"reason": reason} if reason else {}
    approved = await fleet.app.client.post(f"/api/v1/repairs/{repair_id}/approve", json=body)
    assert approved.status_code == 200, approved.text
    return await _end(fleet, repair_id, ticks=ticks, seconds=seconds, what=what)


async def _ended(fleet: SimFleet, repair_id: str) -> dict[str, Any] | None:
    repair = await fleet.repair(repair_id)
    return repair if repair["status"] in ("succeeded", "failed") else None


async def test_a_bare_metal_cluster_enrolls_its_agents_and_climbs_the_ladder_through_its_bmcs(
    database_url: str, tmp_path: Path, bmcs: dict[str, IpmiSim]
) -> None:
    async with (
        sim_app(database_url, tmp_path, **SETTINGS) as fleet,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=fleet.app.app)) as http,
    ):
        room = MachineRoom(fleet, "ipmi", IpmiView(bmcs), http)
        fleet.loops.insert(0, room)  # type: ignore[arg-type]
        for bmc in bmcs.values():
            bmc.set_power(True)  # every machine on, whatever an earlier test left
        marks = {name: bmc.mark() for name, bmc in bmcs.items()}
        cluster = await _metal_cluster(fleet, bmcs)
        cid = cluster["id"]

        # Claimed and powered, but no agent yet: the nodes wait, and say what for.
        await fleet.tick()
        await fleet.tick()
        waiting = await _nodes(fleet, cid)
        assert {n["state"] for n in waiting.values()} == {"provisioning"}, waiting
        assert all("enroll token" in n["state_detail"] for n in waiting.values()), waiting
        assert sorted(room.machines) == ["gpu-a", "gpu-b"]  # members first; the spare waits

        room.enroll_token = await _issue_enroll_token(fleet, cid)
        await fleet.until(
            lambda: fleet.status_is(cid, "ready"), ticks=20, what="the metal cluster ready"
        )
        nodes = await _nodes(fleet, cid)
        assert {n["hostname"] for n in nodes.values()} == {"gpu-a", "gpu-b"}
        assert sorted(room.enrollments) == ["gpu-a", "gpu-b"]
        enrolled = await fleet.events(cid, "node.enrolled")
        assert len(enrolled) == 2
        assert all(room.enroll_token not in str(e) for e in enrolled)
        # An enrolled node cannot be taken over by another machine with the same token.
        with pytest.raises(ApiError) as again:
            await enroll(
                http, base_url=SERVER_URL, enroll_token=room.enroll_token,
                request=EnrollRequest(hostname="gpu-a"),
            )  # fmt: skip
        assert again.value.status == 409 and "already enrolled" in again.value.message
        assert all(bmc.transitions_since(marks[n]) == [] for n, bmc in bmcs.items())  # all on

        # Xid 79 on gpu-b: a reboot the BMC saw, a new boot id, back in service.
        fleet.nodes = nodes
        b_node = next(n for n in nodes.values() if n["hostname"] == "gpu-b")
        fleet.world.inject_fault(room.sim_id("gpu-b"), signature_id="xid-79")
        xid = await fleet.until(lambda: fleet.proposed_for(b_node["id"]), what="xid-79 proposal")
        assert xid["action"] == "reboot", xid["rule"]
        b_mark = bmcs["gpu-b"].mark()
        rebooted = await _approve_and_end(
            fleet, str(xid["id"]), reason="GPU fell off the bus", ticks=60, seconds=5, what="reboot"
        )
        assert rebooted["status"] == "succeeded", rebooted
        assert bmcs["gpu-b"].transitions_since(b_mark) == ["reset 1"]
        b_after = await fleet.node(b_node["id"])
        assert b_after["state"] == "in_service" and b_after["boot_id"] != b_node["boot_id"]

        # Broken hardware on gpu-a: the fault comes back after every reboot and reinstall.
        node = next(n for n in nodes.values() if n["hostname"] == "gpu-a")
        fleet.world.inject_fault(room.sim_id("gpu-a"), signature_id="sxid-fatal", sticky=True)
        seen: dict[str, list[str]] = {}
        for expected in ("reboot", "reprovision", "failover"):
            repair = await fleet.until(
                lambda: fleet.proposed_for(node["id"]), ticks=30, what=f"{expected} proposal"
            )
            assert repair["action"] == expected, repair["rule"]
            mark = {name: bmc.mark() for name, bmc in bmcs.items()}
            repair_id = str(repair["id"])
            done = await _approve_and_end(
                fleet, repair_id, reason="NVSwitch fatal", ticks=80, seconds=5,
                what=f"{expected} end",
            )  # fmt: skip
            seen[expected] = [
                f"{name}: {t}"
                for name, bmc in bmcs.items()
                for t in bmc.transitions_since(mark[name])
            ]
            if expected == "failover":
                assert done["status"] == "succeeded", done
            else:
                assert done["status"] == "failed" and "seen again" in done["detail"], done

        # What each BMC saw: a reset; a PXE boot and a reset; the spare on, gpu-a off.
        assert "gpu-a: reset 1" in seen["reboot"], seen
        assert {"gpu-a: boot pxe", "gpu-a: reset 1"} <= set(seen["reprovision"]), seen
        assert "gpu-a: power 0" in seen["failover"], seen
        assert not any(t.startswith("gpu-b") for ts in seen.values() for t in ts), seen  # untouched
        # gpu-a enrolled again after its reinstall; gpu-c as the node it took over.
        assert room.enrollments[2:] == ["gpu-a", "gpu-c"], room.enrollments

        after = await fleet.node(node["id"])
        assert after["state"] == "in_service", after
        assert after["hostname"] == "gpu-c" and after["serial"] != node["serial"]
        hosts = await _hosts(fleet)
        assert hosts["gpu-a"]["state"] == "out_of_service"  # flagged for hardware service
        assert hosts["gpu-c"]["state"] == "in_service" and hosts["gpu-c"]["node_id"] == node["id"]
        assert (await fleet.status_is(cid, "ready")) is not None  # size kept
        other = next(n for n in nodes.values() if n["hostname"] == "gpu-b")
        assert (await fleet.node(other["id"]))["state"] == "in_service"

        # The last rung, by hand: remove gpu-b. Drained, powered off at its BMC, flagged.
        mark = {name: bmc.mark() for name, bmc in bmcs.items()}
        removed_id = await _act(fleet, other["id"], "remove", "PSU fault light")
        done = await _end(fleet, removed_id, ticks=40, seconds=5, what="removal")
        assert done["status"] == "succeeded", done
        assert bmcs["gpu-b"].transitions_since(mark["gpu-b"]) == ["power 0"]
        assert (await fleet.node(other["id"]))["state"] == "removed"
        hosts = await _hosts(fleet)
        assert hosts["gpu-b"]["state"] == "out_of_service" and hosts["gpu-b"]["node_id"] is None
        assert (await fleet.node(node["id"]))["state"] == "in_service"  # gpu-c untouched


REDFISH_SYSTEMS = {"gpu-r1": "22222222-0000-0000-0000-000000000001",
                   "gpu-r2": "22222222-0000-0000-0000-000000000002"}  # fmt: skip


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerHost]:
    """sushy-tools' emulator with two systems: a member and a spare."""
    systems = [
        {"uuid": uuid, "name": name, "power_state": "On", "nics": []}
        for name, uuid in REDFISH_SYSTEMS.items()
    ]
    emulator = start_emulator(
        tmp_path_factory.mktemp("redfish"), systems=systems, users={USER: PASSWORD}
    )
    try:
        yield PeerHost(
            hostname="gpu-r1", bmc_type="redfish", address=f"http://{emulator.address}",
            port=None, credential="redfish-bmc", credential_kind="bmc_password",
            username=USER, secret=PASSWORD, peer=emulator,
        )  # fmt: skip
    finally:
        stop_emulator(emulator)


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PeerHost]:
    with ssh_peer(tmp_path_factory.mktemp("sshd")) as peer:
        yield peer


@pytest.mark.parametrize("kind", ["redfish", "ssh"])
async def test_xid_79_on_a_bare_metal_cluster_is_repaired_through_its_peer(
    database_url: str, tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    peer: PeerHost = request.getfixturevalue("emulator" if kind == "redfish" else "sshd")
    hostname = "gpu-r1" if kind == "redfish" else "gpu-s1"
    async with (
        sim_app(database_url, tmp_path, **SETTINGS) as fleet,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=fleet.app.app)) as http,
    ):
        view: PeerView = (
            RedfishView(journal=peer.peer.journal, systems=REDFISH_SYSTEMS)
            if kind == "redfish"
            else SshView(log=tmp_path / "reboots.log")
        )
        if kind == "redfish":
            use_quick_redfish(fleet)
        else:
            use_logged_ssh_reboot(fleet, tmp_path / "reboots.log")
        room = MachineRoom(fleet, kind, view, http)
        fleet.loops.insert(0, room)  # type: ignore[arg-type]
        client = fleet.app.client
        stored = await put_credential(
            client, peer.credential, secret=peer.secret,
            kind=peer.credential_kind, username=peer.username,
        )  # fmt: skip
        assert stored.status_code == 200, stored.text
        created = await client.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "metal", "size": 1, "provider": kind,
                  "acceptance_tests": False},
        )  # fmt: skip
        assert created.status_code == 201, created.text
        cid = created.json()["id"]
        spare = "gpu-r2" if kind == "redfish" else "gpu-s2"
        if kind == "redfish":  # one emulator, a system each
            rows = [
                peer.row(cluster="metal", hostname=name, system_id=uuid,
                         role="member" if name == hostname else "spare")
                for name, uuid in REDFISH_SYSTEMS.items()
            ]  # fmt: skip
        else:  # the same sshd stands for the spare
            rows = [
                peer.row(cluster="metal", hostname=hostname),
                peer.row(cluster="metal", hostname=spare, role="spare"),
            ]
        imported = await import_hosts(client, rows)
        assert imported.status_code == 200, imported.text
        room.enroll_token = await _issue_enroll_token(fleet, cid)
        await fleet.until(lambda: fleet.status_is(cid, "ready"), ticks=20, what="ready")
        (node,) = (await _nodes(fleet, cid)).values()
        assert node["hostname"] == hostname and room.enrollments == [hostname]
        before = node["boot_id"]

        fleet.world.inject_fault(room.sim_id(hostname), signature_id="xid-79")
        repair = await fleet.until(lambda: fleet.proposed_for(node["id"]), what="proposal")
        assert repair["action"] == "reboot", repair["rule"]
        mark = view.mark()
        repair_id = str(repair["id"])
        done = await _approve_and_end(
            fleet, repair_id, reason="GPU fell off the bus", ticks=60, seconds=5, what="reboot"
        )
        assert done["status"] == "succeeded", done
        assert restarted(view.seen(hostname, mark)), view.seen(hostname, mark)
        after = await fleet.node(node["id"])
        assert after["state"] == "in_service" and after["boot_id"] != before, after

        # Broken hardware now: the next recommendation climbs the ladder, past what the
        # provider cannot do (SSH cannot reinstall: a failover onto the spare).
        fleet.world.inject_fault(room.sim_id(hostname), signature_id="sxid-fatal", sticky=True)
        second = await fleet.until(  # after the cooldown that follows a good repair
            lambda: fleet.proposed_for(node["id"]), ticks=40, seconds=60, what="the next rung"
        )
        if kind == "redfish":
            assert second["action"] == "reprovision", second["rule"]
        else:
            assert second["action"] == "failover", second["rule"]
            assert "its provider cannot reprovision → failover" in second["rule"]
            by_hand = await client.post(
                f"/api/v1/nodes/{node['id']}/actions",
                json={"action": "reprovision", "reason": "try a reinstall"},
            )
            assert by_hand.status_code == 422, by_hand.text
            assert "cannot reprovision" in error_of(by_hand)["message"]
        mark = view.mark()
        second_id = str(second["id"])
        last = await _approve_and_end(fleet, second_id, ticks=60, seconds=5, what="next rung")
        if kind == "redfish":  # PXE once and a restart; a new disk enrolled; the fault stays
            assert last["status"] == "failed" and "seen again" in last["detail"], last
            assert "boot Pxe" in view.seen(hostname, mark), view.seen(hostname, mark)
            assert room.enrollments == [hostname, hostname]
            third = await fleet.until(
                lambda: fleet.proposed_for(node["id"]), ticks=20, what="the failover"
            )
            assert third["action"] == "failover", third["rule"]
            mark = view.mark()
            third_id = str(third["id"])
            last = await _approve_and_end(fleet, third_id, ticks=60, seconds=5, what="failover")
            off = {"reset ForceOff", "power Off"}  # asked of the BMC; Off a moment later
            assert off & set(view.seen(hostname, mark)), view.seen(hostname, mark)
        # The spare's agent enrolled as the node; the old host flagged.
        assert last["status"] == "succeeded", last
        moved = await fleet.node(node["id"])
        assert moved["state"] == "in_service" and moved["hostname"] == spare, moved
        assert room.enrollments[-1] == spare, room.enrollments
        hosts = await _hosts(fleet)
        assert hosts[hostname]["state"] == "out_of_service"
        texts = [str(done), str(after), str(last)]
        texts += [str(e) for e in await fleet.get("/api/v1/events", cluster=cid, limit=1000)]
        assert not [t for t in texts if any(secret in t for secret in peer.secrets())]


WRONG_PASSWORD = "not-the-Bmc-pw-41"  # IPMI passwords are 20 bytes at most


@pytest.mark.parametrize("case", ["never-back", "wrong-password", "no-bmc"])
async def test_a_repair_that_cannot_finish_fails_with_what_to_do(
    database_url: str,
    tmp_path: Path,
    bmcs: dict[str, IpmiSim],
    case: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    policy = {"breaker_max_share": 1.0}
    async with (
        sim_app(database_url, tmp_path, policy=policy, **SETTINGS) as fleet,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=fleet.app.app)) as http,
    ):
        room, cid, nodes = await _ready_metal(fleet, bmcs, http)
        client = fleet.app.client
        if case == "never-back":
            room.dead.add("gpu-a")
        elif case == "wrong-password":
            changed = await put_credential(client, "bmc", secret=WRONG_PASSWORD, username=BMC_USER)
            assert changed.status_code == 200, changed.text
        else:  # the BMC's address now leads nowhere: nobody listens there
            row = {"hostname": "gpu-a", "bmc_type": "ipmi", "bmc_address": "127.0.0.1",
                   "port": free_udp_port(), "credential": "bmc", "cluster": "metal"}  # fmt: skip
            assert (await import_hosts(client, [row])).status_code == 200

        view = IpmiView(bmcs)
        mark = view.mark()
        fleet.world.inject_fault(room.sim_id("gpu-a"), signature_id="xid-79")
        node_id = nodes["gpu-a"]["id"]
        repair = await fleet.until(lambda: fleet.proposed_for(node_id), what="proposal")
        repair_id = str(repair["id"])
        done = await _approve_and_end(fleet, repair_id, ticks=60, seconds=10, what="the end")
        assert done["status"] == "failed", done
        detail = done["detail"]
        if case == "never-back":
            assert restarted(view.seen("gpu-a", mark))  # asked, and the BMC took it
            assert detail.startswith("machine not back 300 s after reboot (ipmi, host gpu-a)")
            assert "still reports boot id" in detail, detail
        else:
            assert detail.startswith("reboot failed: ipmi: host gpu-a"), detail
            what = "refused the credentials" if case == "wrong-password" else "no answer"
            assert what in detail, detail
            assert not restarted(view.seen("gpu-a", mark))
        assert (await fleet.node(node_id))["state"] != "in_service"  # never on a failure
        assert (await fleet.node(nodes["gpu-b"]["id"]))["state"] == "in_service"
        events = await fleet.get("/api/v1/events", cluster=cid, limit=1000)
        text = f"{done} {events} {caplog.text}"
        assert WRONG_PASSWORD not in text and BMC_PASSWORD not in text


async def test_a_failover_off_a_host_whose_bmc_is_dead_still_moves_the_node(
    database_url: str, tmp_path: Path, bmcs: dict[str, IpmiSim]
) -> None:
    policy = {"breaker_max_share": 1.0}
    async with (
        sim_app(database_url, tmp_path, policy=policy, **SETTINGS) as fleet,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=fleet.app.app)) as http,
    ):
        _, cid, nodes = await _ready_metal(fleet, bmcs, http)
        node = nodes["gpu-a"]
        client = fleet.app.client
        # gpu-a's BMC is dead (nobody answers at its address): it cannot be powered off.
        row = {"hostname": "gpu-a", "bmc_type": "ipmi", "bmc_address": "127.0.0.1",
               "port": free_udp_port(), "credential": "bmc", "cluster": "metal"}  # fmt: skip
        assert (await import_hosts(client, [row])).status_code == 200
        repair_id = await _act(fleet, node["id"], "replace", "BMC gone, GPUs flapping")
        done = await _end(fleet, repair_id, ticks=40, seconds=5, what="failover")
        assert done["status"] == "succeeded", done
        said = [
            e["message"]
            for kind in ("repair.step", "repair.status")
            for e in await fleet.events(cid, kind)
        ]
        assert any("not given back" in m for m in said), said
        assert any("retire it by hand" in m for m in said), said
        moved = await fleet.node(node["id"])
        assert moved["state"] == "in_service" and moved["hostname"] == "gpu-c", moved
        hosts = await _hosts(fleet)
        assert hosts["gpu-a"]["state"] == "out_of_service"  # never handed out again
        assert hosts["gpu-c"]["node_id"] == node["id"]


async def test_with_no_spare_the_failover_gives_up_and_the_ladder_removes_the_node(
    database_url: str, tmp_path: Path, bmcs: dict[str, IpmiSim]
) -> None:
    policy = {"breaker_max_share": 1.0}
    async with (
        sim_app(database_url, tmp_path, policy=policy, **SETTINGS) as fleet,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=fleet.app.app)) as http,
    ):
        room, _, nodes = await _ready_metal(fleet, bmcs, http, spare=False)
        node_id = str(nodes["gpu-a"]["id"])
        fleet.world.inject_fault(room.sim_id("gpu-a"), signature_id="sxid-fatal", sticky=True)
        proposed = await fleet.until(lambda: fleet.proposed_for(node_id), what="proposal")
        failover_id = await _act(
            fleet, node_id, "replace", "NVSwitch fatal, straight to a new host"
        )
        assert failover_id != proposed["id"]  # the admin's action replaced the proposal
        failed = await _end(fleet, failover_id, ticks=40, seconds=30, what="give up")
        assert failed["status"] == "failed", failed
        assert failed["detail"].startswith("no replacement machine 300 s after the failover")
        assert "no spare host in the pool" in failed["detail"], failed["detail"]

        mark = IpmiView(bmcs).mark()
        removal = await fleet.until(lambda: fleet.proposed_for(node_id), what="the last rung")
        assert removal["action"] == "remove", removal["rule"]
        assert "ladder: host had failover (failed)" in removal["rule"], removal["rule"]
        removal_id = str(removal["id"])
        done = await _approve_and_end(fleet, removal_id, ticks=20, seconds=5, what="removal")
        assert done["status"] == "succeeded", done
        assert bmcs["gpu-a"].transitions_since(mark["gpu-a"]) == ["power 0"]
        assert (await fleet.node(node_id))["state"] == "removed"
        hosts = await _hosts(fleet)
        assert hosts["gpu-a"]["state"] == "out_of_service"
        assert (await fleet.node(str(nodes["gpu-b"]["id"])))["state"] == "in_service"


async def _enroll(
    http: httpx.AsyncClient, token: str, hostname: str, *, boot_id: str | None = None
) -> httpx.Response:
    body = {"hostname": hostname} | ({"boot_id": boot_id} if boot_id else {})
    return await http.post(
        f"{SERVER_URL}/api/v1/agent/enroll",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
    )


async def test_what_an_enroll_token_can_and_cannot_do(
    database_url: str,
    tmp_path: Path,
    bmcs: dict[str, IpmiSim],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with (
        sim_app(database_url, tmp_path, **SETTINGS) as fleet,
        httpx.AsyncClient(transport=httpx.ASGITransport(app=fleet.app.app)) as http,
    ):
        for bmc in bmcs.values():
            bmc.set_power(True)
        cid = (await _metal_cluster(fleet, bmcs))["id"]
        await fleet.tick()  # gpu-a and gpu-b claimed and powered
        client = fleet.app.client

        # No token yet; a node token or an API token is not an enroll token.
        assert (await _enroll(http, "gpfe_" + "x" * 40, "gpu-a")).status_code == 401
        assert (await _enroll(http, "gpfn_" + "x" * 40, "gpu-a")).status_code == 401
        first = await _issue_enroll_token(fleet, cid)
        token = await _issue_enroll_token(fleet, cid)
        replaced = await _enroll(http, first, "gpu-a")
        assert replaced.status_code == 401, replaced.text  # a newer token replaced it

        unknown = await _enroll(http, token, "gpu-z")
        assert unknown.status_code == 404 and "gpu-z" in error_of(unknown)["message"]
        spare = await _enroll(http, token, "gpu-c")  # in the pool: no node runs on it
        assert spare.status_code == 409 and "runs no node" in error_of(spare)["message"]
        bad = await _enroll(http, token, "")
        assert bad.status_code == 422

        enrolled = await _enroll(http, token, "gpu-a")
        assert enrolled.status_code == 201, enrolled.text
        node_token = enrolled.json()["node_token"]
        assert node_token.startswith("gpfn_")
        again = await _enroll(http, token, "gpu-a")
        assert again.status_code == 409 and "already enrolled" in error_of(again)["message"]
        hosts = await _hosts(fleet)
        assert hosts["gpu-a"]["node_id"] == enrolled.json()["node_id"]

        # An answer lost (the replica died after committing it): the same machine (same
        # boot id) asking again before any report gets a token again, and the first one
        # is refused; once its agent reported, or from another boot, it is enrolled.
        lost = await _enroll(http, token, "gpu-b", boot_id="boot-1")
        assert lost.status_code == 201, lost.text
        retried = await _enroll(http, token, "gpu-b", boot_id="boot-1")
        assert retried.status_code == 201, retried.text
        assert retried.json()["node_id"] == lost.json()["node_id"]
        gpu_b = retried.json()["node_token"]
        assert gpu_b != lost.json()["node_token"]
        batch = report_batch(1, hostname="gpu-b")
        assert (await send_report(fleet.app, lost.json()["node_token"], batch)).status_code == 401
        other_boot = await _enroll(http, token, "gpu-b", boot_id="boot-2")
        assert other_boot.status_code == 409, other_boot.text
        assert (await send_report(fleet.app, gpu_b, batch)).status_code == 200
        reported = await _enroll(http, token, "gpu-b", boot_id="boot-1")
        assert reported.status_code == 409 and "already enrolled" in error_of(reported)["message"]
        events = (await fleet.get("/api/v1/events", kind="node.enrolled"))["items"]
        assert any("answer to its first enrollment was lost" in e["message"] for e in events)

        # Expired: one second past its time to live.
        fleet.clock.advance(3601)
        late = await _enroll(http, token, "gpu-b")
        assert late.status_code == 401 and "expired" in error_of(late)["message"]

        # Who may make one: a never-expiring admin credential, for a bare-metal cluster.
        sim = await client.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "cloudy", "size": 1, "acceptance_tests": False},
        )
        assert sim.status_code == 201, sim.text
        refused = await client.post(f"/api/v1/clusters/{sim.json()['id']}/enroll-token", json={})
        assert refused.status_code == 422 and "do not enroll" in error_of(refused)["message"]
        too_long = await client.post(
            f"/api/v1/clusters/{cid}/enroll-token", json={"ttl_s": 31 * 86400}
        )
        assert too_long.status_code == 422
        assert (await client.post("/api/v1/users", json={"name": "ada"})).status_code == 201
        added = await client.post(
            "/api/v1/projects/ml/members", json={"user": "ada", "role": "admin"}
        )
        assert added.status_code == 201, added.text
        expiring = await client.post(
            "/api/v1/tokens",
            json={"name": "t", "user": "ada", "project": "ml", "expires_in_days": 1},
        )
        assert expiring.status_code == 201, expiring.text
        async with fleet.app.with_token(expiring.json()["token"]) as short:
            outlives = await short.post(f"/api/v1/clusters/{cid}/enroll-token", json={})
        assert outlives.status_code == 403 and "outlives" in error_of(outlives)["message"]

        # Neither token is in any answer but its own, an event, an audit row or a log line.
        async with fleet.app.ctx.db.session() as session:
            events = (await session.scalars(select(EventRow))).all()
            audits = (await session.scalars(select(AuditLogRow))).all()
        enrolls = [a.detail["host"] for a in audits if a.action == "node.enroll"]
        assert sorted(enrolls) == ["gpu-a", "gpu-b", "gpu-b"]
        texts = [
            caplog.text,
            (await client.get(f"/api/v1/clusters/{cid}")).text,
            *(f"{e.message} {e.data}" for e in events),
            *(f"{a.detail}" for a in audits),
        ]
        for secret in (first, token, node_token, lost.json()["node_token"], gpu_b):
            assert not [t for t in texts if secret in t or secret[5:] in t]
