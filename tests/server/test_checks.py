"""Check runs through the API on the sim (both store dialects): the command channel
carries the tools' commands to the nodes' agents, the sim's tools answer in the real
output formats with figures that follow injected faults, and the runner judges them."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from apihelpers import error_of, member_client
from asgi_lifespan import LifespanManager
from checkhelpers import CheckFleet, check_fleet
from sqlalchemy import func, select

from gpufleet.checks.localise import rounds_bound
from gpufleet.checks.models import CheckKind
from gpufleet.providers.sim.driver import SimProvider
from gpufleet.server.app import build_loops, create_app
from gpufleet.server.db.tables import (
    AuditLogRow,
    CheckRunRow,
    ClusterRow,
    EventRow,
    NodeCommandRow,
)
from gpufleet.server.services.checks import create_check_run
from gpufleet.server.services.schedulers import scheduler_for
from gpufleet.server.workers.checks.runner import CheckRunner
from gpufleet.testing.app import RunningApp


async def test_dcgm_diag_on_a_healthy_node_passes_with_figures(
    database_url: str, tmp_path: Path
) -> None:
    async with check_fleet(database_url, tmp_path) as fleet:
        node = fleet.nodes["train-000"]
        started, fake_start = time.monotonic(), fleet.clock.now()
        response = await fleet.run({"nodes": ["train-000"], "check": "dcgm-diag", "level": 3})
        assert response.status_code == 201, response.text
        run = response.json()
        assert (run["status"], run["params"]["level"], run["purpose"]) == (
            "pending",
            3,
            "on_demand",
        )
        done = await fleet.until_ended(run["id"])
        wall_s = time.monotonic() - started
        fake_s = (fleet.clock.now() - fake_start).total_seconds()
        assert done["status"] == "passed", done["detail"]
        assert (done["backend"], done["outcome"]) == ("agent", "pass")
        verdict = done["result"]["nodes"][node["id"]]
        assert verdict["outcome"] == "pass"
        assert verdict["figures"]["gpus"] == 8 and verdict["figures"]["version"] == "4.2.3"
        assert sorted(verdict["gpus"], key=int) == [str(i) for i in range(8)]
        [inv] = done["result"]["invocations"]
        assert inv["argv"] == ["dcgmi", "diag", "-r", "3", "-j"] and inv["exit_code"] == 0
        output = (await fleet.app.client.get(f"/api/v1/checks/{run['id']}/output")).text
        assert '"DCGM Diagnostic"' in output and "==> dcgm-0 on train-000" in output
        async with fleet.app.ctx.db.session() as session:
            kinds = list(
                await session.scalars(
                    select(EventRow.kind).where(
                        EventRow.data["check_run_id"].as_string() == run["id"]
                    )
                )
            )
            audits = list(
                await session.scalars(
                    select(AuditLogRow.action).where(AuditLogRow.object_id == run["id"])
                )
            )
        assert kinds.count("check.requested") == 1 and kinds.count("check.status") == 2
        # Asked for, then each status change (running, passed), as the event says.
        assert sorted(audits) == ["check.run", "check.status", "check.status"]
        print(f"\nsim: checks run → result: {fake_s:.0f} s fake clock, {wall_s:.2f} s wall")


async def test_a_memory_fault_fails_dcgm_on_that_gpu_raises_a_finding_and_a_pass_clears_it(
    database_url: str, tmp_path: Path
) -> None:
    async with check_fleet(database_url, tmp_path) as fleet:
        node = fleet.nodes["train-001"]
        await fleet.inject("train-001", "row-remap-pending", gpu_index=5)
        run = (await fleet.run({"nodes": ["train-001"], "check": "dcgm-diag", "level": 2})).json()
        done = await fleet.until_ended(run["id"])
        assert done["status"] == "failed"
        verdict = done["result"]["nodes"][node["id"]]
        assert verdict["outcome"] == "fail"
        assert [i for i, g in verdict["gpus"].items() if g["outcome"] == "fail"] == ["5"]
        messages = [r["message"] for r in verdict["gpus"]["5"]["reasons"]]
        assert any("memory" in m and "GPU 5" in m for m in messages), messages
        [finding] = [f for f in await fleet.findings("train-001") if f["source"] == "active-check"]
        assert finding["signature_id"] == "check-dcgm-diag-gpu-failed"
        assert finding["gpu_index"] == 5 and run["id"] in finding["evidence"]
        assert "--- output (end) ---" in finding["evidence"]  # the output's end, as evidence
        # The same failure again folds into the open finding.
        again = (await fleet.run({"nodes": ["train-001"], "check": "dcgm-diag", "level": 2})).json()
        assert (await fleet.until_ended(again["id"]))["status"] == "failed"
        [folded] = [f for f in await fleet.findings("train-001") if f["source"] == "active-check"]
        assert (folded["id"], folded["count"]) == (finding["id"], 2)
        # Fixed: a passing run clears it.
        cleared = await fleet.app.client.delete(
            f"/api/v1/nodes/{node['id']}/faults/row-remap-pending"
        )
        assert cleared.status_code == 200, cleared.text
        ok = (await fleet.run({"nodes": ["train-001"], "check": "dcgm-diag", "level": 2})).json()
        assert (await fleet.until_ended(ok["id"]))["status"] == "passed"
        assert not [f for f in await fleet.findings("train-001") if f["source"] == "active-check"]


async def test_a_busy_node_is_skipped_members_run_on_idle_nodes_admins_force(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with check_fleet(database_url, tmp_path) as fleet:
        job = fleet.busy("train-000")
        # The nodes' jobs are asked for at once, not one node after the other.
        async with fleet.app.ctx.db.session() as session:
            cluster = await session.get(ClusterRow, fleet.cluster["id"])
        assert cluster is not None
        asked = type(scheduler_for(fleet.app.ctx.drivers, cluster))
        lookups = {"now": 0, "most": 0}
        jobs_on_node = asked.jobs_on_node

        async def overlapping(self: Any, node: str) -> Any:
            lookups["now"] += 1
            lookups["most"] = max(lookups["most"], lookups["now"])
            for _ in range(3):  # a scheduler call yields while it waits
                await asyncio.sleep(0)
            try:
                return await jobs_on_node(self, node)
            finally:
                lookups["now"] -= 1

        monkeypatch.setattr(asked, "jobs_on_node", overlapping)
        member = await member_client(fleet.app)
        body = {"nodes": ["train-000", "train-001"], "check": "gpu-burn"}
        run = (await fleet.run(body, member)).json()
        assert run["requested_by"].startswith("user:")
        done = await fleet.until_ended(run["id"])
        assert done["status"] == "passed"
        [skipped] = done["skipped"]
        assert skipped["node"] == "train-000"
        assert f"running job {job}" in skipped["reason"]
        assert list(done["result"]["nodes"]) == [fleet.nodes["train-001"]["id"]]
        assert lookups["most"] == 2, lookups  # both nodes' jobs asked for together
        # Only the busy node asked for: nothing to run it on.
        alone = (await fleet.run({"nodes": ["train-000"], "check": "gpu-burn"}, member)).json()
        ended = await fleet.until_ended(alone["id"])
        assert ended["status"] == "error" and "every node was skipped" in ended["detail"]
        # A member may not force; an admin may, and the check runs beside the job.
        refused = await fleet.run({**body, "force": True}, member)
        assert refused.status_code == 403, refused.text
        assert error_of(refused)["field"] == "force"
        forced = (
            await fleet.run({"nodes": ["train-000"], "check": "gpu-burn", "force": True})
        ).json()
        done = await fleet.until_ended(forced["id"])
        assert (done["status"], done["forced"], done["skipped"]) == ("passed", True, [])
        await member.aclose()


async def test_bad_input_is_refused_and_writes_nothing(database_url: str, tmp_path: Path) -> None:
    async with check_fleet(database_url, tmp_path) as fleet:
        cases: list[tuple[dict[str, Any], str]] = [
            ({"check": "dcgm-diag", "level": 5}, "level"),
            ({"check": "dcgm-diag", "level": "3"}, "level"),
            ({"check": "memtest"}, "check"),
            ({"check": "dcgm-diag", "nodes": ["nosuch"]}, "nodes"),
            ({"check": "dcgm-diag", "nodes": []}, "nodes"),
            ({"check": "gpu-burn", "level": 2}, "level"),
            ({"check": "gpu-burn", "params": {"duration_s": 5}}, "params.duration_s"),
            (
                {"check": "nccl", "nodes": ["train-000"], "params": {"scope": "multi-node"}},
                "params.scope",
            ),
            ({"check": "ib-write-bw", "params": {"hcas": ["mlx5 0"]}}, "params.hcas"),
            ({"check": "dcgm-diag", "params": {"colour": "red"}}, "params.colour"),
            ({"check": "dcgm-diag", "surprise": 1}, "surprise"),
        ]
        for body, field in cases:
            response = await fleet.run(body)
            assert response.status_code == 422, (body, response.text)
            assert error_of(response)["field"].endswith(field), (body, error_of(response))
        other = await fleet.app.client.post(
            "/api/v1/checks",
            json={"cluster": "00000000-0000-7000-8000-000000000000", "check": "dcgm-diag"},
        )
        assert other.status_code == 404
        missing = await fleet.app.client.get("/api/v1/checks/00000000-0000-7000-8000-000000000000")
        assert missing.status_code == 404
        async with fleet.app.ctx.db.session() as session:
            assert await session.scalar(select(func.count()).select_from(CheckRunRow)) == 0


async def test_list_filter_and_cancel(database_url: str, tmp_path: Path) -> None:
    async with check_fleet(database_url, tmp_path) as fleet:
        first = (await fleet.run({"check": "dcgm-diag", "level": 1})).json()
        assert [n["name"] for n in first["nodes"]] == ["train-000", "train-001"]
        cancelled = await fleet.app.client.post(f"/api/v1/checks/{first['id']}/cancel")
        assert cancelled.json()["status"] == "cancelled"
        second = (await fleet.run({"check": "gpu-burn", "nodes": ["train-001"]})).json()
        await fleet.runner.run_once()  # started: its command waits for the agent
        assert (await fleet.get(second["id"]))["status"] == "running"
        asked = await fleet.app.client.post(f"/api/v1/checks/{second['id']}/cancel")
        assert asked.json()["status"] == "running" and "cancelling" in asked.json()["detail"]
        await fleet.runner.run_once()
        assert (await fleet.get(second["id"]))["status"] == "cancelled"
        assert await fleet.answer() == 0  # the command was cancelled before any agent took it
        listed = (
            await fleet.app.client.get(
                "/api/v1/checks", params={"cluster": fleet.cluster["id"], "status": "cancelled"}
            )
        ).json()
        assert [r["id"] for r in listed["items"]] == [second["id"], first["id"]]
        assert all(r["result"] is None for r in listed["items"])
        page = (await fleet.app.client.get("/api/v1/checks", params={"limit": 1})).json()
        assert len(page["items"]) == 1 and page["next_cursor"] == second["id"]


async def test_ib_write_bw_names_the_node_whose_hca_is_slow(
    database_url: str, tmp_path: Path
) -> None:
    async with check_fleet(database_url, tmp_path, size=3) as fleet:
        await fleet.inject("train-002", "ib-rate-downgrade")
        run = (
            await fleet.run(
                {
                    "check": "ib-write-bw",
                    "params": {
                        "hcas": [
                            "mlx5_0",
                            "mlx5_1",
                            "mlx5_2",
                            "mlx5_3",
                            "mlx5_4",
                            "mlx5_5",
                            "mlx5_6",
                            "mlx5_7",
                        ]
                    },
                }
            )
        ).json()
        done = await fleet.until_ended(run["id"], steps=80)
        assert done["status"] == "failed", done["detail"]
        nodes = done["result"]["nodes"]
        failed = {v["name"] for v in nodes.values() if v["outcome"] == "fail"}
        assert failed == {"train-002"}
        bad = nodes[fleet.nodes["train-002"]["id"]]["hcas"]
        [hca] = [h for h, v in bad.items() if v["outcome"] == "fail"]
        assert (
            bad[hca]["bw_avg_gbits"]
            < 320
            < nodes[fleet.nodes["train-000"]["id"]]["hcas"]["mlx5_0"]["bw_avg_gbits"]
        )
        [finding] = [f for f in await fleet.findings("train-002") if f["source"] == "active-check"]
        assert (finding["signature_id"], finding["component"]) == ("check-ib-bw-low", hca)


@pytest.mark.parametrize("size", [16])
async def test_localisation_names_a_degraded_nvlink_node_among_16_within_the_bound(
    database_url: str, tmp_path: Path, size: int
) -> None:
    async with check_fleet(database_url, tmp_path, size=size) as fleet:
        bad = "train-011"
        await fleet.inject(bad, "nvlink-down", gpu_index=2)
        run = (await fleet.run({"check": "nccl", "params": {"scope": "multi-node"}})).json()
        done = await fleet.until_ended(run["id"])
        assert done["status"] == "failed"
        assert done["result"]["localisation"]["status"] == "running"
        loc_id = done["result"]["localisation"]["run_id"]
        loc = await fleet.until_ended(loc_id, steps=80)
        assert loc["status"] == "failed", loc["detail"]
        report = loc["result"]["localisation"]
        assert report["bad_nodes"] == [bad] and report["bad_links"] == []
        assert report["rounds"] <= rounds_bound(size), report
        # Rounds are sequential child runs; a round's runs share no node.
        probes = (await fleet.app.client.get("/api/v1/checks", params={"parent": loc_id})).json()
        rounds: dict[int, list[list[str]]] = {}
        for h in report["history"]:
            rounds.setdefault(h["round"], []).append(h["nodes"])
        assert len(rounds) == report["rounds"] == len({h["round"] for h in report["history"]})
        for members in rounds.values():
            flat = [n for m in members for n in m]
            assert len(flat) == len(set(flat))
        assert len(probes["items"]) == len(report["history"])
        [finding] = [f for f in await fleet.findings(bad) if f["source"] == "active-check"]
        assert finding["signature_id"] == "check-nccl-busbw-low"
        assert loc_id in finding["evidence"]
        parent = await fleet.get(run["id"])
        assert parent["result"]["localisation"]["bad_nodes"] == [bad]
        print(f"\nsim: localisation among {size} nodes: {report['rounds']} rounds")


async def test_cluster_wide_checks_skip_nothing_for_acceptance(
    database_url: str, tmp_path: Path
) -> None:
    """Acceptance runs never wait for idle nodes (their nodes take no work yet)."""
    async with check_fleet(database_url, tmp_path) as fleet:
        fleet.busy("train-000")
        async with fleet.app.ctx.db.transaction() as session:
            cluster = await session.get(ClusterRow, fleet.cluster["id"])
            assert cluster is not None
            row = await create_check_run(
                session,
                actor="system:acceptance",
                cluster=cluster,
                kind=CheckKind.GPU_BURN,
                node_ids=[fleet.nodes["train-000"]["id"]],
                purpose="acceptance",
                now=fleet.clock.now(),
            )
        done = await fleet.until_ended(row.id)
        assert (done["status"], done["skipped"]) == ("passed", [])


async def test_a_restarted_server_resumes_following_a_running_check(
    database_url: str, tmp_path: Path
) -> None:
    async with check_fleet(database_url, tmp_path) as fleet:
        run = (await fleet.run({"check": "gpu-burn", "nodes": ["train-000", "train-001"]})).json()
        await fleet.runner.run_once()
        assert (await fleet.get(run["id"]))["status"] == "running"
        # The replica dies in the middle of a pass: its claim on the row stays behind.
        async with fleet.app.ctx.db.transaction() as session:
            row = await session.get(CheckRunRow, run["id"])
            assert row is not None
            row.lock_owner, row.lock_token = "dead-replica", "00000000-0000-7000-8000-00000000dead"
            row.lock_expires_at = fleet.clock.now() + dt.timedelta(seconds=600)
        settings, clock = fleet.app.ctx.settings, fleet.clock
        cluster, nodes, token = fleet.cluster, fleet.nodes, fleet.app.owner_token
    # A new server on the same store and sim world: its runner waits out the dead claim,
    # then follows the commands the first one queued (none is queued twice).
    restarted = create_app(settings, clock=clock)
    async with (
        LifespanManager(restarted, startup_timeout=60),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=restarted),
            base_url="http://test",
            headers={"Authorization": f"Bearer {token}"},
        ) as client,
    ):
        app = RunningApp(app=restarted, ctx=restarted.state.ctx, client=client, owner_token=token)
        runner = next(loop for loop in build_loops(app.ctx) if isinstance(loop, CheckRunner))
        provider = app.ctx.drivers.provider("sim")
        assert isinstance(provider, SimProvider)
        again = CheckFleet(
            app=app,
            clock=clock,
            world=provider.world,
            runner=runner,
            cluster=cluster,
            nodes=nodes,
            boot_id="sim-boot-2",
        )
        assert await again.answer() == 2
        await runner.run_once()
        assert (await again.get(run["id"]))["status"] == "running"  # still claimed
        clock.advance(600)
        await runner.run_once()
        done = await again.get(run["id"])
        assert done["status"] == "passed", done["detail"]
        async with app.ctx.db.session() as session:
            commands = await session.scalar(
                select(func.count())
                .select_from(NodeCommandRow)
                .where(NodeCommandRow.ref == f"check_run:{run['id']}")
            )
        assert commands == 2
