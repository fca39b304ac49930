"""The host inventory: import (all or nothing, idempotent), list, show, bind (explicitly
and by hostname when the agent reports), and ``DbHostDirectory`` (claim_spare idempotent
and race-safe, release), on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from apihelpers import (
    create_cluster,
    create_project,
    error_of,
    node_tokens,
    nodes_of,
    ready_cluster,
    report_batch,
    send_report,
)
from inventoryhelpers import host, import_hosts, keyed_app, put_credential
from sqlalchemy import func, select

from gpufleet.core.inventory import HostState
from gpufleet.providers.base import HostDirectory
from gpufleet.server.db.tables import AuditLogRow, EventRow, HostRow
from gpufleet.server.services.host_directory import DbHostDirectory
from gpufleet.testing.app import RunningApp

SECRET = "bmc-pass-for-tests"


def _spare_id(hosts: list[dict[str, Any]]) -> str:
    return next(h["id"] for h in hosts if h["role"] == "spare")


async def _hosts_count(app: RunningApp) -> int:
    async with app.ctx.db.session() as session:
        return int(await session.scalar(select(func.count()).select_from(HostRow)) or 0)


async def _setup(app: RunningApp) -> dict[str, Any]:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, project="ml", name="train", size=1)
    assert (await put_credential(app.client, "bmc", secret=SECRET)).status_code == 200
    return cluster


def _rows(cluster_id: str) -> list[dict[str, Any]]:
    return [
        host("gpu-001", credential="bmc", cluster="train", rack="r1", serial="S1"),
        host("gpu-002", credential="bmc", cluster=cluster_id, rack="r1", leaf_switch="leaf-1"),
        host("spare-001", credential="bmc", cluster="train", role="spare", bmc_type="ipmi",
             bmc_address="10.0.0.9", port=623),
    ]  # fmt: skip


async def test_import_then_reimport_is_idempotent_and_updates_by_hostname(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        cluster = await _setup(app)
        first = await import_hosts(app.client, _rows(cluster["id"]))
        assert first.status_code == 200, first.text
        assert first.json() == {
            "created": ["gpu-001", "gpu-002", "spare-001"], "updated": [], "unchanged": [],
        }  # fmt: skip
        again = await import_hosts(app.client, _rows(cluster["id"]))
        assert again.json()["unchanged"] == ["gpu-001", "gpu-002", "spare-001"]
        changed = _rows(cluster["id"])
        changed[1]["rack"] = "r2"
        third = await import_hosts(app.client, changed)
        assert third.json() == {
            "created": [], "updated": ["gpu-002"], "unchanged": ["gpu-001", "spare-001"],
        }  # fmt: skip
        assert await _hosts_count(app) == 3

        listed = (await app.client.get("/api/v1/projects/ml/hosts")).json()
        assert [(h["hostname"], h["state"], h["role"]) for h in listed] == [
            ("gpu-001", "in_service", "member"),
            ("gpu-002", "in_service", "member"),
            ("spare-001", "spare", "spare"),
        ]
        assert {h["credential"] for h in listed} == {"bmc"}
        assert all(h["cluster_id"] == cluster["id"] for h in listed)
        by_cluster = await app.client.get(
            "/api/v1/projects/ml/hosts", params={"cluster": cluster["id"]}
        )
        assert len(by_cluster.json()) == 3
        shown = (await app.client.get("/api/v1/projects/ml/hosts/gpu-002")).json()
        assert (shown["rack"], shown["leaf_switch"]) == ("r2", "leaf-1")
        by_id = await app.client.get(f"/api/v1/projects/ml/hosts/{shown['id']}")
        assert by_id.json()["hostname"] == "gpu-002"
        missing = await app.client.get("/api/v1/projects/ml/hosts/nope")
        assert missing.status_code == 404 and "nope" in error_of(missing)["message"]


async def test_a_bad_row_writes_nothing_and_names_the_row_and_field(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        cluster = await _setup(app)
        cases = [
            (host("gpu-009", credential="no-such"), "hosts.1.credential", "row 2 (gpu-009)"),
            (host("gpu-009", cluster="no-such"), "hosts.1.cluster", "row 2 (gpu-009)"),
            (host("gpu-001"), "hosts.1.hostname", "also on row 1"),
            (host("gpu-009", bmc_type="ssh"), "hosts.1.host_key", "pinned host key"),
            (host("gpu-009", bmc_type="ilo"), "hosts.1.bmc_type", "hosts.1.bmc_type"),
            (host("gpu-009", port=70000), "hosts.1.port", "hosts.1.port"),
            ({**host("gpu-009"), "colour": "red"}, "hosts.1.colour", "unknown field"),
        ]
        for bad, field, said in cases:
            rows = [host("gpu-001", cluster=cluster["id"]), bad]
            response = await import_hosts(app.client, rows)
            assert response.status_code == 422, response.text
            error = error_of(response)
            assert error["field"] == field, error
            assert said in error["message"], error
            assert await _hosts_count(app) == 0


async def test_bind_a_node_explicitly_and_by_its_reported_hostname(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        await create_project(app.client, "ml")
        cluster = await ready_cluster(app, project="ml", name="train", size=2)
        nodes = await nodes_of(app, cluster["id"])
        spare = host("box-a", cluster="train", role="spare", rack="r7", serial="SER-A")
        rows = [spare, host("box-b", cluster="train", pdu="pdu-3")]
        assert (await import_hosts(app.client, rows)).status_code == 200

        bound = await app.client.post(
            "/api/v1/projects/ml/hosts/box-a/bind", json={"node_id": nodes[0]["id"]}
        )
        assert bound.status_code == 200, bound.text
        assert (bound.json()["node_id"], bound.json()["state"]) == (nodes[0]["id"], "in_service")
        node = (await app.client.get(f"/api/v1/nodes/{nodes[0]['id']}")).json()
        assert node["rack"] == "r7"  # the node takes the host's topology
        busy = await app.client.post(
            "/api/v1/projects/ml/hosts/box-a/state", json={"state": "spare"}
        )
        assert busy.status_code == 409 and nodes[0]["id"] in error_of(busy)["message"]
        async with app.ctx.db.session() as session:
            moves = list(
                await session.scalars(select(EventRow).where(EventRow.kind == "host.state"))
            )
            assert [(e.data["from"], e.data["to"]) for e in moves] == [("spare", "in_service")]
        refused = await app.client.post(
            "/api/v1/projects/ml/hosts/box-a/bind", json={"node_id": "01J0000000000000000000000Z"}
        )
        assert refused.status_code == 404

        # The second node's agent reports the hostname box-b: it is bound to that host.
        token = (await node_tokens(app, cluster["id"]))[nodes[1]["name"]]
        reported = await send_report(app, token, report_batch(7, hostname="box-b"))
        assert reported.status_code == 200, reported.text
        shown = (await app.client.get("/api/v1/projects/ml/hosts/box-b")).json()
        assert shown["node_id"] == nodes[1]["id"]
        node = (await app.client.get(f"/api/v1/nodes/{nodes[1]['id']}")).json()
        assert node["pdu"] == "pdu-3"


async def test_claim_spare_is_idempotent_and_concurrent_claims_get_different_hosts(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        cluster = await _setup(app)
        spares = [
            host(f"spare-{i}", cluster="train", role="spare", credential="bmc") for i in range(4)
        ]
        assert (await import_hosts(app.client, spares)).status_code == 200
        directory = DbHostDirectory(db=app.ctx.db, keyring=app.ctx.keyring, clock=app.ctx.clock)
        assert isinstance(directory, HostDirectory)

        first = await directory.claim_spare(cluster["id"], "failover-1")
        assert first is not None
        again = await directory.claim_spare(cluster["id"], "failover-1")
        assert again is not None and again.host_id == first.host_id
        assert first.credential is not None and first.credential.secret == SECRET
        assert first.credential.username == "root"
        assert SECRET not in repr(first) and SECRET not in repr(first.credential)

        # Concurrent claims: two tokens get two hosts; one token raced three times, one host.
        a, b, *c = await asyncio.gather(
            directory.claim_spare(cluster["id"], "failover-2"),
            directory.claim_spare(cluster["id"], "failover-3"),
            *(directory.claim_spare(cluster["id"], "failover-5") for _ in range(3)),
        )
        assert a is not None and b is not None and all(x is not None for x in c)
        assert len({x.host_id for x in c if x is not None}) == 1
        assert c[0] is not None
        assert len({first.host_id, a.host_id, b.host_id, c[0].host_id}) == 4
        assert await directory.claim_spare(cluster["id"], "failover-4") is None  # pool empty
        same = await asyncio.gather(
            *(directory.claim_spare(cluster["id"], "failover-2") for _ in range(3))
        )
        assert {s.host_id for s in same if s is not None} == {a.host_id}

        listed = (await app.client.get("/api/v1/projects/ml/hosts")).json()
        assert {h["state"] for h in listed} == {"claimed"}
        tokens = {h["claim_token"] for h in listed}
        assert tokens == {"failover-1", "failover-2", "failover-3", "failover-5"}
        assert len(await directory.hosts(cluster["id"])) == 4
        async with app.ctx.db.session() as session:
            claims = await session.scalar(
                select(func.count())
                .select_from(EventRow)
                .where(EventRow.kind == "host.state", EventRow.data["to"].as_string() == "claimed")
            )
            assert claims == 4  # one event per claim, none for a repeat or a lost race


async def test_release_takes_a_host_out_of_service_with_an_event_and_an_audit_row(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        cluster = await _setup(app)
        assert (await import_hosts(app.client, _rows(cluster["id"]))).status_code == 200
        directory = DbHostDirectory(db=app.ctx.db, keyring=app.ctx.keyring, clock=app.ctx.clock)
        target = (await app.client.get("/api/v1/projects/ml/hosts/gpu-001")).json()
        listed = (await app.client.get("/api/v1/projects/ml/hosts")).json()
        access = await directory.host(target["id"])
        assert access is not None
        assert (access.hostname, access.address, access.rack) == (
            "gpu-001", "https://10.0.0.1", "r1",
        )  # fmt: skip
        await directory.release(target["id"])
        await directory.release(target["id"])  # idempotent: nothing more written
        shown = (await app.client.get("/api/v1/projects/ml/hosts/gpu-001")).json()
        assert (shown["state"], shown["node_id"]) == (HostState.OUT_OF_SERVICE.value, None)
        async with app.ctx.db.session() as session:
            audits = list(
                await session.scalars(
                    select(AuditLogRow).where(
                        AuditLogRow.action == "host.state", AuditLogRow.object_id == target["id"]
                    )
                )
            )
            assert [(r.detail["from"], r.detail["to"]) for r in audits] == [
                ("in_service", "out_of_service")
            ]
        assert await directory.host("01J0000000000000000000000Z") is None

        # Fixed: back to the pool by hand, and a failover can take it again.
        state = "/api/v1/projects/ml/hosts/gpu-001/state"
        claimed = await app.client.post(state, json={"state": "claimed"})
        assert claimed.status_code == 422 and error_of(claimed)["field"] == "state"
        back = await app.client.post(state, json={"state": "spare", "reason": "new DIMM"})
        assert back.status_code == 200 and back.json()["state"] == "spare"
        claimed: list[str] = []
        while again := await directory.claim_spare(cluster["id"], f"after-{len(claimed)}"):
            claimed.append(again.host_id)  # free members first, then the spare pool
        assert target["id"] in claimed and _spare_id(listed) in claimed
        refused = await app.client.post(
            "/api/v1/projects/ml/hosts/gpu-001/bind", json={"node_id": target["id"]}
        )
        assert refused.status_code in (404, 409)


async def test_two_imports_of_one_new_hostname_at_once_leave_one_host(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        await _setup(app)
        responses = await asyncio.gather(
            *(import_hosts(app.client, [host("race-1"), host(f"other-{i}")]) for i in range(3))
        )
        codes = sorted(r.status_code for r in responses)
        assert codes[0] == 200 and set(codes) <= {200, 409}, [r.text for r in responses]
        for refused in (r for r in responses if r.status_code == 409):
            assert "run the import again" in error_of(refused)["message"]
        listed = (await app.client.get("/api/v1/projects/ml/hosts")).json()
        names = [h["hostname"] for h in listed]
        assert names.count("race-1") == 1
        assert len(names) == 1 + codes.count(200)  # a refused import left nothing
