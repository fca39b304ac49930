"""The Checks tab: a member runs an active check from the console (no force: that is an
admin's), follows it to its end, reads each node's verdict and the raw output."""

from __future__ import annotations

import hashlib

import httpx
from webhelpers import browser, hidden, log_in, member_token

from gpufleet.testing.fleet import SimFleet


async def test_a_member_runs_a_check_and_reads_its_verdict(fleet: SimFleet) -> None:
    base = f"/clusters/{fleet.cluster_id}"
    async with browser(fleet.app) as member:
        assert (await log_in(member, await member_token(fleet.app))).status_code == 303
        tab = await member.get(f"{base}/checks")
        assert tab.status_code == 200 and "No check has run on this cluster yet." in tab.text
        assert 'name="force"' not in tab.text  # forcing onto busy nodes is an admin's
        csrf = hidden(tab.text, "csrf")
        forced = await member.post(
            f"{base}/checks", data={"csrf": csrf, "check": "dcgm-diag", "force": "1"}
        )
        assert forced.status_code == 403
        unknown = await member.post(f"{base}/checks", data={"csrf": csrf, "check": "nope"})
        assert unknown.status_code == 422 and "choose a check" in unknown.text
        started = await member.post(
            f"{base}/checks",
            data={"csrf": csrf, "check": "dcgm-diag", "level": "1", "nodes": "train-001"},
        )
        assert started.status_code == 303
        run_page = started.headers["location"]
        run_id = run_page.rsplit("/", 1)[1]
        assert "dcgm-diag started on 1 node(s)." in (await member.get(run_page)).text

        async def ended() -> dict[str, object] | None:
            run = (await fleet.app.client.get(f"/api/v1/checks/{run_id}")).json()
            return run if run["status"] not in ("pending", "running") else None

        run = await fleet.until(ended, what="the check run to end")
        page = (await member.get(run_page)).text
        assert "train-001" in page and "not judged yet" not in page
        assert f"st-{run['status']}" in page
        listed = (await member.get(f"{base}/checks")).text
        assert run_id[-8:] in listed and "dcgm-diag" in listed
        output = await member.get(f"{run_page}/output")
        assert output.status_code == 200
        assert output.headers["content-type"].startswith("text/plain")
        assert output.headers["x-content-type-options"] == "nosniff"
        assert "dcgmi diag -r 1" in output.text


async def test_acceptance_reports_are_listed_and_download(
    fleet: SimFleet, admin: httpx.AsyncClient
) -> None:
    started = await fleet.app.client.post(
        f"/api/v1/clusters/{fleet.cluster_id}/acceptance",
        json={"nodes": ["train-001"], "reason": "console test"},
    )
    assert started.status_code == 202, started.text
    run_id = started.json()["id"]

    async def reported() -> dict[str, object] | None:
        run = (await fleet.app.client.get(f"/api/v1/acceptance/{run_id}")).json()
        return run if run["report_sha256"] else None

    # The suite's checks take minutes of (fake) time: dcgm-diag level 3, NCCL, ib_write_bw.
    run = await fleet.until(reported, ticks=60, seconds=120.0, what="the acceptance report")
    tab = (await admin.get(f"/clusters/{fleet.cluster_id}/checks")).text
    html_link = f"/api/v1/acceptance/{run_id}/report.html"
    json_link = f"/api/v1/acceptance/{run_id}/report.json"
    assert html_link in tab and json_link in tab and str(run["report_sha256"])[:12] in tab
    report = await admin.get(json_link)  # the console's session reads the API's route
    assert report.status_code == 200
    assert hashlib.sha256(report.content).hexdigest() == run["report_sha256"]
    page = await admin.get(html_link)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
