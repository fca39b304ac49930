"""The demo promise for repairs: background faults become recommendations that wait for
an admin, and `gpufleet repairs approve ID` carries one through to back in service."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.server.schemas.repairs import RepairPolicyRequest
from gpufleet.testing.processes import ServerProcess, free_port, printed_value, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.long]


def _repairs(url: str, token: str, *args: str) -> list[dict[str, Any]]:
    listed = run_cli("repairs", "list", *args, "--output", "json", url=url, token=token)
    assert listed.returncode == 0, listed.stderr
    body = json.loads(listed.stdout)
    items: list[dict[str, Any]] = body["items"] if isinstance(body, dict) else body
    return items


@pytest.mark.timeout(900)  # acceptance first, then a fault, then the repair: minutes
def test_a_background_fault_waits_for_approval_then_is_repaired(tmp_path: Path) -> None:
    port = free_port()
    proc = ServerProcess(
        args=["demo", "--port", str(port), "--data-dir", str(tmp_path / "demo")],
        env={
            "GPUFLEET_DATABASE_URL": "",
            # Faults come faster than in the demo, so the test needs no inject: ~5 a
            # minute over the 128 GPUs (at 30 a GPU-day, ~2.7: the wait for one that makes
            # a non-removal repair was most of the test; at 10, several minutes). No jobs
            # and no broken hardware, so the first repair is quick and fixes the node.
            "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "60",
            # The check tools 1,000× faster than real (the demo's own: 100×).
            "GPUFLEET_SIM_PROGRAM_TIME_SCALE": "0.001",
            "GPUFLEET_SIM_BUSY_SHARE": "[0.0, 0.0]",
            "GPUFLEET_SIM_STICKY_SHARE": "0",
            # Agents report twice a second, not every ten: a simulated agent takes a
            # command at its next report, and acceptance is several commands a node, one
            # at a time. The loops that start checks and move repairs pass as often.
            "GPUFLEET_REPORT_INTERVAL_S": "0.5",
            "GPUFLEET_CHECK_INTERVAL_S": "0.5",
            "GPUFLEET_REPAIR_INTERVAL_S": "0.5",
            "GPUFLEET_RECONCILE_INTERVAL_S": "0.5",
            # Machines boot, reboot and reset a GPU in seconds (the demo's: 2-6 s, 5-15 s
            # and 5-15 s).
            "GPUFLEET_SIM_PROVISION_DELAY_S": "[1.0, 2.0]",
            "GPUFLEET_SIM_REBOOT_DELAY_S": "[2.0, 4.0]",
            "GPUFLEET_SIM_RESET_GPU_DELAY_S": "[1.0, 2.0]",
        },
        log_path=tmp_path / "demo.log",
    )
    proc.start()
    try:
        url = printed_value(proc, "GPUFLEET_URL")
        token = printed_value(proc, "GPUFLEET_TOKEN")
        proc.wait_ready(url)
        # The demo's 16 nodes share one leaf switch: three of them failing before the
        # planner looks (it leaves a cluster in acceptance alone) is one incident for the
        # switch, not a node repair. Background faults are dense here, so this test's
        # policy counts a whole leaf failing as an incident only, and a repaired node is
        # watched for 3 s before re-acceptance, not 30.
        headers = {"Authorization": f"Bearer {token}"}
        policy_url = f"{url}/api/v1/projects/demo/repair-policy"
        policy = httpx.get(policy_url, headers=headers, timeout=30).json()
        body = {k: v for k, v in policy.items() if k in RepairPolicyRequest.model_fields}
        put = httpx.put(policy_url, headers=headers, timeout=30,
                        json={**body, "incident_min_nodes": 17, "verify_settle_s": 3})  # fmt: skip
        assert put.status_code == 200, put.text
        # Background faults keep coming while a repair runs (~4 % chance of a second one
        # on the same node within the repair): verification then rightly fails. That
        # one reason, shown by a finding first seen after the approval, earns another
        # try with the next recommendation; any other failure fails the test.
        tried: dict[str, str] = {}  # repair → its signature
        for _attempt in range(3):
            repair, now = _approve_one(url, token, proc)
            tried[now["id"]] = now["signature_id"]
            if now["status"] == "succeeded":
                break
            approved_at = now["approved_at"]
            fresh = [
                f for f in _findings(url, token, now["node_id"]) if f["first_seen"] > approved_at
            ]
            assert fresh, f"repair failed without a new fault: {now}\n{proc.output()[-3000:]}"
        else:
            raise AssertionError(f"three repairs met a new fault: {now}")
        assert now["status"] == "succeeded", now
        shown = run_cli("nodes", "show", repair["node_id"], "--output", "json", url=url,
                        token=token)  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["state"] == "in_service"

        # The reliability report finds the outage behind the repair: out of service from
        # the drain to the return, put down to the (first) repair tried.
        report = run_cli("reliability", "report", "--output", "json", url=url, token=token)
        assert report.returncode == 0, report.stderr
        body = json.loads(report.stdout)
        back = [o for o in body["outages"] if o["node_id"] == now["node_id"]]
        assert back and back[0]["repair_id"] in tried, (tried, back)
        outage = back[0]  # newest first
        assert (outage["signature"], outage["ended"]) == (tried[outage["repair_id"]], "in_service")
        assert outage["gpu_hours_lost"] > 0 and body["gpu_hours_lost"] >= outage["gpu_hours_lost"]
        assert body["failures"] >= 1 and body["mttr_h"] > 0
        table = run_cli("reliability", "report", "--by", "host", "--by", "outages", url=url,
                        token=token)  # fmt: skip
        assert table.returncode == 0, table.stderr
        assert "MTTR" in table.stdout and outage["signature"] in table.stdout
        bad = run_cli("reliability", "report", "--by", "planet", url=url, token=token)
        assert bad.returncode == 2 and "planet" in bad.stderr
    finally:
        proc.stop()


def _findings(url: str, token: str, node_id: str) -> list[dict[str, Any]]:
    listed = httpx.get(
        f"{url}/api/v1/findings",
        params={"node": node_id, "limit": 1000},
        headers={"Authorization": f"Bearer {token}"},
        timeout=30,
    )
    assert listed.status_code == 200, listed.text
    items: list[dict[str, Any]] = listed.json()["items"]
    return items


def _approve_one(
    url: str, token: str, proc: ServerProcess
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Wait for a recommendation that returns a node, see it wait for a human, approve
    it and wait for its end: (the repair as proposed, as it ended)."""
    deadline = time.monotonic() + 480
    proposed: list[dict[str, Any]] = []
    while not proposed:
        assert time.monotonic() < deadline, "no recommendation:\n" + proc.output()[-3000:]
        time.sleep(1.0)  # real sleep: the demo's faults come on its own clock
        # A remove (a signature whose catalog action is removal for hardware service)
        # ends with the node out of the cluster, not back in service: wait for one
        # that returns the node.
        proposed = [
            r
            for r in _repairs(url, token, "--status", "proposed")
            if r["kind"] == "node" and r["action"] != "remove"
        ]
    repair = proposed[0]
    assert repair["source"] == "policy" and repair["decided_by"] is None
    time.sleep(3)  # real sleep: nothing happens without a human
    (still,) = [r for r in _repairs(url, token, "--all") if r["id"] == repair["id"]]
    assert still["status"] == "proposed"

    approved = run_cli("repairs", "approve", repair["id"], url=url, token=token)
    assert approved.returncode == 0, approved.stderr
    deadline = time.monotonic() + 120
    while True:
        (now,) = [r for r in _repairs(url, token, "--all") if r["id"] == repair["id"]]
        if now["status"] in ("succeeded", "failed"):
            return repair, now
        assert time.monotonic() < deadline, f"repair stuck: {now}\n{proc.output()[-3000:]}"
        time.sleep(1.0)  # real sleep: the repair runs on the demo's clock
