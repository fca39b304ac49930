"""The Checks tab: a member runs an active check from the console (no force: that is an
admin's), follows it to its end, reads each node's verdict and the raw output."""

from __future__ import annotations

from webhelpers import Fleet, browser, hidden, log_in, member_token


async def test_a_member_runs_a_check_and_reads_its_verdict(fleet: Fleet) -> None:
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
