"""Acceptance on the sim: provisioning → acceptance → ready with a report; one bad node is
named and the cluster is not ready; opt-out skips the suite; members read, admins run."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from acceptancehelpers import QUICK_SUITE, STEP_S, bringup
from apihelpers import member_client
from sqlalchemy import func, select

from gpufleet.core.acceptance import canonical_json
from gpufleet.server.db.tables import AcceptanceRunRow, AuditLogRow, CheckRunRow, FindingRow
from gpufleet.server.services.acceptance_report import entries_of
from gpufleet.testing.fleet import SimFleet

pytestmark = pytest.mark.long

SCRIPTS = ["echo configured $(hostname)", "test -d /tmp && echo tmp-ok"]


async def _create(fleet: SimFleet, **body: Any) -> dict[str, Any]:
    response = await fleet.app.client.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "train", "size": 4, "gpus_per_node": 8, **body},
    )
    assert response.status_code == 201, response.text
    cluster: dict[str, Any] = response.json()
    return cluster


async def _report(fleet: SimFleet, run_id: str) -> tuple[dict[str, Any], str]:
    response = await fleet.app.client.get(f"/api/v1/acceptance/{run_id}/report.json")
    assert response.status_code == 200, response.text
    digest = hashlib.sha256(response.content).hexdigest()
    assert response.headers["etag"] == f'"{digest}"'
    report: dict[str, Any] = json.loads(response.content)
    assert canonical_json(report) == response.content
    cached = await fleet.app.client.get(
        f"/api/v1/acceptance/{run_id}/report.json", headers={"If-None-Match": f'"{digest}"'}
    )
    assert cached.status_code == 304
    return report, digest


async def test_cluster_goes_provisioning_acceptance_ready_with_a_report(
    database_url: str, tmp_path: Path
) -> None:
    # The default suite. Each node's agent runs one command at a time, and ib_write_bw on
    # 8 HCAs is 16 of them: a tick or two each, far inside the check's summed limits.
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cluster = await _create(fleet, startup_scripts=SCRIPTS)
        cid = cluster["id"]
        assert cluster["status"] == "provisioning"
        ready = await fleet.until(
            lambda: fleet.status_is(cid, "ready", "degraded"), ticks=800, what="cluster settled"
        )
        assert ready["status"] == "ready", await fleet.describe()
        assert ready["status_detail"] == ""
        # The cluster went through acceptance, and no node was in service before it passed.
        transitions = [e["data"]["to"] for e in await fleet.events(cid, "cluster.status")]
        assert transitions == ["acceptance", "ready"]
        nodes = await fleet.nodes_of(cid)
        assert {n["state"] for n in nodes.values()} == {"in_service"}
        for node in nodes.values():
            states = [
                e["data"]["to"]
                for e in await fleet.events(cid, "node.state")
                if e["node_id"] == node["id"]
            ]
            assert states == ["acceptance", "in_service"], (node["name"], states)

        # Startup scripts ran on every node, in order, output in the node's events.
        script_events = [
            e for e in await fleet.events(cid, "node.startup_script") if "index" in e["data"]
        ]
        assert len(script_events) == 4 * len(SCRIPTS)
        for node in nodes.values():
            mine = [e["data"] for e in script_events if e["node_id"] == node["id"]]
            assert [d["index"] for d in mine] == [0, 1]
            assert [d["exit_code"] for d in mine] == [0, 0]
            assert "configured" in mine[0]["stdout_tail"] and "tmp-ok" in mine[1]["stdout_tail"]

        (run,) = await fleet.acceptance_runs(cid)
        assert (run["trigger"], run["status"], run["failed_nodes"]) == (
            "provisioning",
            "passed",
            [],
        )
        assert sorted(run["node_ids"]) == sorted(n["id"] for n in nodes.values())
        # Each check of the suite covered every node exactly once (node-level checks in a
        # batch per group of nodes that came up together; the all-reduce over all four).
        covered: dict[tuple[str, str | None], list[str]] = {}
        async with fleet.app.ctx.db.session() as session:
            for row in await session.scalars(
                select(CheckRunRow).where(CheckRunRow.id.in_(run["check_run_ids"]))
            ):
                key = (row.kind, row.params.get("scope"))
                covered.setdefault(key, []).extend(row.node_ids)
        assert {k: sorted(v) for k, v in covered.items()} == dict.fromkeys(
            [
                ("dcgm-diag", None),
                ("nccl", "per-node"),
                ("ib-write-bw", None),
                ("nccl", "multi-node"),
            ],
            sorted(run["node_ids"]),
        )

        report, digest = await _report(fleet, run["id"])
        assert digest == run["report_sha256"]
        assert report["summary"]["outcome"] == "pass" and report["summary"]["passed"] == 4
        gpus = (
            await fleet.app.client.get("/api/v1/nodes", params={"cluster": cid, "gpus": "true"})
        ).json()["items"]
        uuids = {g["uuid"] for n in gpus for g in n["gpus"]}
        reported = {g["uuid"] for n in report["nodes"] for g in n["gpus"]}
        assert reported == uuids and len(uuids) == 32
        assert {n["serial"] for n in report["nodes"]} == {n["serial"] for n in nodes.values()}
        assert all(n["serial"] for n in report["nodes"])
        labels = {c["label"] for c in report["checks"]}
        assert labels == {"dcgm-diag (level 3)", "nccl", "ib-write-bw", "nccl (cluster)"}

        html = await fleet.app.client.get(f"/api/v1/acceptance/{run['id']}/report.html")
        assert html.status_code == 200
        assert html.headers["content-type"].startswith("text/html")
        assert html.headers["etag"] == f'"{digest}"'
        assert "<script" not in html.text and digest in html.text
        assert all(n["name"] in html.text for n in nodes.values())


async def test_one_bad_node_is_named_and_the_cluster_is_not_ready(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cluster = await _create(fleet, acceptance_suite=QUICK_SUITE)
        cid = cluster["id"]

        async def booted() -> dict[str, Any] | None:
            nodes = await fleet.nodes_of(cid)
            bad = nodes["train-002"]
            return bad if bad["provider_instance_id"] else None

        bad = await fleet.until(booted, what="train-002 has a machine")
        # A double-bit ECC error on GPU 3, before its checks run: DCGM's memory test fails.
        await fleet.inject(bad["id"], "xid-48", gpu_index=3, sticky=True)
        settled = await fleet.until(
            lambda: fleet.status_is(cid, "ready", "degraded"), ticks=400, what="cluster settled"
        )
        assert settled["status"] == "degraded", await fleet.describe()
        assert "train-002" in settled["status_detail"]
        nodes = await fleet.nodes_of(cid)
        assert nodes["train-002"]["state"] == "cordoned"
        assert "acceptance failed" in nodes["train-002"]["state_detail"]
        assert {n["state"] for name, n in nodes.items() if name != "train-002"} == {"in_service"}

        (run,) = await fleet.acceptance_runs(cid)
        assert (run["status"], run["failed_nodes"]) == ("failed", ["train-002"])
        finished = await fleet.events(cid, "acceptance.finished")
        assert any("train-002" in e["message"] for e in finished)
        report, _digest = await _report(fleet, run["id"])
        assert report["summary"]["failed_nodes"] == ["train-002"]
        node = next(n for n in report["nodes"] if n["name"] == "train-002")
        gpu3 = next(g for g in node["gpus"] if g["index"] == 3)
        assert gpu3["outcome"] == "fail"
        # The cluster-wide all-reduce ran over the three good nodes only.
        cluster_check = next(c for c in report["checks"] if c["stage"] == "cluster")
        assert cluster_check["nodes"] == 3

        # The failed check is a finding, so the planner recommends a repair for the node.
        async with fleet.app.ctx.db.session() as session:
            sources = set(
                await session.scalars(
                    select(FindingRow.source).where(
                        FindingRow.node_id == nodes["train-002"]["id"],
                        FindingRow.cleared_at.is_(None),
                    )
                )
            )
        assert "active-check" in sources

        async def proposed() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = (
                await fleet.app.client.get(
                    "/api/v1/repairs", params={"node": nodes["train-002"]["id"], "open": "true"}
                )
            ).json()["items"]
            return items

        repairs = await fleet.until(proposed, what="a repair recommended for train-002")
        assert repairs[0]["action"] in ("reset_gpu", "reboot", "reprovision")


async def test_a_slow_ring_waits_for_localisation_and_names_its_node(
    database_url: str, tmp_path: Path
) -> None:
    # No ib_write_bw in this suite: a downgraded InfiniBand port on train-001 passes every
    # node-level check and shows only in the all-reduce across the cluster, which blames
    # nobody by itself; the bisection it starts names the node.
    suite = {"checks": [c for c in QUICK_SUITE["checks"] if c["kind"] != "ib-write-bw"]}
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cluster = await _create(fleet, acceptance_suite=suite)
        cid = cluster["id"]

        async def booted() -> dict[str, Any] | None:
            bad = (await fleet.nodes_of(cid))["train-001"]
            return bad if bad["provider_instance_id"] else None

        bad = await fleet.until(booted, what="train-001 has a machine")
        await fleet.inject(bad["id"], "ib-rate-downgrade", sticky=True)
        settled = await fleet.until(
            lambda: fleet.status_is(cid, "ready", "degraded"), ticks=400, what="cluster settled"
        )
        assert settled["status"] == "degraded", await fleet.describe()
        nodes = await fleet.nodes_of(cid)
        assert nodes["train-001"]["state"] == "cordoned", await fleet.describe()
        assert {n["state"] for name, n in nodes.items() if name != "train-001"} == {"in_service"}
        (run,) = await fleet.acceptance_runs(cid)
        assert (run["status"], run["failed_nodes"]) == ("failed", ["train-001"])
        assert "not pinned" not in run["detail"]
        async with fleet.app.ctx.db.session() as session:
            localisations = list(
                await session.scalars(
                    select(CheckRunRow).where(
                        CheckRunRow.purpose == "localisation", CheckRunRow.parent_id.is_not(None)
                    )
                )
            )
        top = [r for r in localisations if r.parent_id in run["check_run_ids"]]
        assert len(top) == 1 and top[0].status == "failed"
        # The verdict came after the bisection, not before it.
        assert run["finished_at"] >= top[0].finished_at.isoformat()[:19]
        report, _digest = await _report(fleet, run["id"])
        assert report["summary"]["failed_nodes"] == ["train-001"]


async def test_a_slow_ring_nobody_is_blamed_for_runs_once_more(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cluster = await _create(fleet, acceptance_suite=QUICK_SUITE)
        cid = cluster["id"]

        async def cluster_stage() -> AcceptanceRunRow | None:
            async with fleet.app.ctx.db.session() as session:
                run = await session.scalar(
                    select(AcceptanceRunRow).where(AcceptanceRunRow.cluster_id == cid)
                )
            return run if run is not None and run.stage == "cluster" else None

        run = await fleet.until(cluster_stage, ticks=400, what="the cluster-wide stage")
        first = entries_of(run)[-1].check_run_id
        # The all-reduce across the cluster failed and its bisection reproduced nothing
        # (a transient): what a flapping link leaves behind.
        async with fleet.app.ctx.db.transaction() as session:
            row = await session.get(CheckRunRow, first, with_for_update=True)
            assert row is not None
            row.status = "failed"
            row.detail = "fail: busbw below the limit (set by the test)"
            row.result = {**(row.result or {}), "localisation": {"status": "passed"}}
        settled = await fleet.until(
            lambda: fleet.status_is(cid, "ready", "degraded"), ticks=400, what="cluster settled"
        )
        assert settled["status"] == "ready", await fleet.describe()
        (shown,) = await fleet.acceptance_runs(cid)
        assert shown["status"] == "passed" and first not in shown["check_run_ids"]
        async with fleet.app.ctx.db.session() as session:
            done = await session.get(AcceptanceRunRow, shown["id"])
        assert done is not None
        retried = done.results["retried"]
        assert list(retried.values()) == [first] and list(retried) == [shown["check_run_ids"][-1]]


async def test_opt_out_skips_the_suite_with_an_event(database_url: str, tmp_path: Path) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cluster = await _create(fleet, acceptance_tests=False)
        cid = cluster["id"]
        await fleet.until(lambda: fleet.status_is(cid, "ready"), what="cluster ready")
        opt_out = await fleet.events(cid, "cluster.acceptance_opt_out")
        assert len(opt_out) == 1 and opt_out[0]["data"]["acceptance_tests"] is False
        assert await fleet.acceptance_runs(cid) == []
        transitions = [e["data"]["to"] for e in await fleet.events(cid, "cluster.status")]
        assert transitions == ["ready"]
        async with fleet.app.ctx.db.session() as session:
            checks = await session.scalar(select(func.count()).select_from(CheckRunRow))
        assert checks == 0


async def test_members_read_runs_and_reports_admins_run_the_suite(
    database_url: str, tmp_path: Path
) -> None:
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cluster = await _create(fleet, acceptance_suite=QUICK_SUITE)
        cid = cluster["id"]
        await fleet.until(lambda: fleet.status_is(cid, "ready"), what="cluster ready")
        (first,) = await fleet.acceptance_runs(cid)
        async with await member_client(fleet.app) as member:
            assert (await member.get(f"/api/v1/clusters/{cid}/acceptance")).status_code == 200
            report = await member.get(f"/api/v1/acceptance/{first['id']}/report.json")
            assert report.status_code == 200
            refused = await member.post(f"/api/v1/clusters/{cid}/acceptance", json={})
            assert refused.status_code == 403, refused.text

        # An admin runs the suite again on a ready cluster: nodes stay in service.
        response = await fleet.app.client.post(
            f"/api/v1/clusters/{cid}/acceptance", json={"reason": "before the big run"}
        )
        assert response.status_code == 202, response.text
        manual = response.json()
        assert (manual["trigger"], manual["status"]) == ("manual", "pending")
        again = await fleet.app.client.post(f"/api/v1/clusters/{cid}/acceptance", json={})
        assert again.status_code == 409  # one run per node at a time

        async def ended() -> dict[str, Any] | None:
            run = (await fleet.app.client.get(f"/api/v1/acceptance/{manual['id']}")).json()
            return run if run["status"] not in ("pending", "running") else None

        done = await fleet.until(ended, what="the manual run ended")
        assert done["status"] == "passed", done
        assert [n["outcome"] for n in done["nodes"]] == ["pass"] * 4
        assert (await fleet.get(f"/api/v1/clusters/{cid}"))["status"] == "ready"
        pending = await fleet.app.client.get(f"/api/v1/acceptance/{manual['id']}/report.json")
        assert pending.status_code in (200, 409)
        async with fleet.app.ctx.db.session() as session:
            audited = await session.scalar(
                select(func.count()).where(
                    AuditLogRow.action == "acceptance.run", AuditLogRow.object_id == manual["id"]
                )
            )
        assert audited == 1
