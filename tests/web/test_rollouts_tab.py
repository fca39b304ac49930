"""The cluster's Rollouts tab on the sim: a rollout of three nodes, one at a time, inside
a window open now, caught with one node done and the next migrating. The tab shows its
status, window, limits, counts and each node with its repair; a member reads it, someone
outside the project gets a 404. A screenshot of the tab, rendered by Debian's Chromium,
goes to ``test-artifacts/console/14-rollouts.png``."""

from __future__ import annotations

import datetime as dt
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_env import CHROMIUM, launch, shot
from playwright.async_api import Route, async_playwright
from webhelpers import APP_URL, browser, log_in, member_token

from gpufleet.testing.fleet import SimFleet

sys.path.append(str(Path(__file__).resolve().parents[1] / "server"))  # its bringup
from acceptancehelpers import QUICK_SUITE, bringup  # type: ignore[import-not-found]

pytestmark = pytest.mark.long

STEP_S = 30.0  # fake seconds a tick, as tests/server/test_rollouts.py
OLD = {"driver": "570.133.20", "cuda": "12.8", "nccl": "2.26.2", "os_image": "gpu-2026.09"}
NEW = {"driver": "580.95.05", "cuda": "12.9", "nccl": "2.27.3", "os_image": "gpu-2026.12"}


async def _cluster(fleet: SimFleet) -> str:
    for name, spec in (("gpu-2026.09", OLD), ("gpu-2026.12", NEW)):
        made = await fleet.app.client.post(
            "/api/v1/stacks", json={"name": name, **spec, "latest": name == "gpu-2026.09"}
        )
        assert made.status_code == 201, made.text
    response = await fleet.app.client.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "train", "size": 3, "gpus_per_node": 8,
              "acceptance_suite": QUICK_SUITE},
    )  # fmt: skip
    assert response.status_code == 201, response.text
    cid: str = response.json()["id"]
    await fleet.until(lambda: fleet.status_is(cid, "ready"), ticks=400, what="cluster ready")
    return cid


def _window(fleet: SimFleet) -> str:
    """Every day in UTC from a minute ago, for two hours: open now."""
    opened = fleet.clock.now().astimezone(dt.UTC) - dt.timedelta(minutes=1)
    return f"daily {opened:%H:%M}/2h"


async def _one_done_one_migrating(fleet: SimFleet, cid: str) -> dict[str, Any]:
    """A rollout in a window open now, at most one node out, driven until its first node
    is done and its second migrating."""
    made = await fleet.app.client.post(
        f"/api/v1/clusters/{cid}/rollouts",
        json={"to_stack": "gpu-2026.12", "window": _window(fleet), "tz": "UTC",
              "max_unavailable": "1", "failure_budget": 1, "reason": "driver 580"},
    )  # fmt: skip
    assert made.status_code == 201, made.text
    rid = made.json()["id"]

    async def caught() -> dict[str, Any] | None:
        body: dict[str, Any] = await fleet.get(f"/api/v1/rollouts/{rid}")
        assert body["status"] in ("scheduled", "running"), body
        wanted = {"done": 1, "migrating": 1, "pending": 1}
        ok = body["counts"] == wanted and all(n["repair_id"] for n in body["nodes"][:2])
        return body if ok else None

    found: dict[str, Any] = await fleet.until(caught, ticks=400, what="one done, one migrating")
    return found


async def test_the_tab_shows_a_rollout_under_way(database_url: str, tmp_path: Path) -> None:
    fleet: SimFleet
    async with bringup(database_url, tmp_path, step_s=STEP_S) as fleet:
        cid = await _cluster(fleet)
        rollout = await _one_done_one_migrating(fleet, cid)
        path = f"/clusters/{cid}/rollouts"
        async with browser(fleet.app) as admin, browser(fleet.app) as member:
            assert (await log_in(admin, fleet.app.owner_token)).status_code == 303
            page = await admin.get(path)
            assert page.status_code == 200, page.text
            html = page.text
            _assert_shows(html, rollout, base=f"/clusters/{cid}")

            assert (await log_in(member, await member_token(fleet.app))).status_code == 303
            seen = await member.get(path)
            assert seen.status_code == 200, seen.text
            _assert_shows(seen.text, rollout, base=f"/clusters/{cid}")

            await take_screenshot(admin, path, "14-rollouts")

            # Aborted, then a newer one: newest first, only the one under way unfolded.
            aborted = await fleet.app.client.post(
                f"/api/v1/rollouts/{rollout['id']}/abort", json={"reason": "tab test"}
            )
            assert aborted.status_code == 200, aborted.text
            await fleet.until(lambda: _ended(fleet, rollout["id"]), ticks=400, what="aborted")
            again = await fleet.app.client.post(
                f"/api/v1/clusters/{cid}/rollouts",
                json={"to_stack": "gpu-2026.12", "window": _window(fleet)},
            )
            assert again.status_code == 201, again.text
            both = (await member.get(path)).text
            assert both.index(again.json()["id"]) < both.index(rollout["id"])
            assert both.count("<details open>") == 1 and both.count("<details>") == 1
            assert 'class="st">aborted<' in both

        other = await fleet.app.client.post("/api/v1/projects", json={"name": "other"})
        assert other.status_code == 201, other.text
        async with browser(fleet.app) as outsider:
            token = await member_token(fleet.app, "other")
            assert (await log_in(outsider, token)).status_code == 303
            refused = await outsider.get(path)
            assert refused.status_code == 404, refused.text
            assert "train-000" not in refused.text and "gpu-2026.12" not in refused.text


async def _ended(fleet: SimFleet, rollout_id: str) -> bool:
    body = await fleet.get(f"/api/v1/rollouts/{rollout_id}")
    return bool(body["status"] == "aborted")


def _assert_shows(html: str, rollout: dict[str, Any], *, base: str) -> None:
    assert 'aria-current="page">Rollouts<' in html
    assert "gpu-2026.09 → gpu-2026.12" in html
    assert 'class="st st-running">running<' in html  # the rollout's badge
    assert rollout["window_text"] in html and "open now" in html
    assert "1 node at once" in html
    assert "0 of 1 allowed" in html  # failures of the budget
    assert "1 / 3 nodes done" in html
    assert "1 done · 1 migrating · 1 pending" in html
    assert "<details open>" in html  # the rollout under way shows its nodes
    for node in rollout["nodes"]:
        row = re.search(rf'<tr id="rollout-{rollout["id"]}-node-{node["node_id"]}">.*?</tr>', html)
        assert row is not None, node["node_name"]
        cells = row.group(0)
        assert f'href="{base}/nodes/{node["node_id"]}">{node["node_name"]}</a>' in cells
        assert f">{node['status']}</span>" in cells, (node["node_name"], cells)
        if node["repair_id"]:
            assert f'href="{base}/repairs/{node["repair_id"]}"' in cells
            assert f"st-{node['repair_status']}" in cells, cells
        else:
            assert "/repairs/" not in cells
    statuses = [n["status"] for n in rollout["nodes"]]
    assert statuses == ["done", "migrating", "pending"], statuses


async def take_screenshot(client: httpx.AsyncClient, path: str, name: str) -> None:
    """Chromium on the page, every request answered by the in-process app as the
    logged-in ``client`` (as test_utilization_prometheus.py does): nothing leaves the
    test, and the page is the one the app rendered."""
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: apt-get install chromium"

    async def from_app(route: Route) -> None:
        request = route.request
        answer = await client.request(request.method, request.url)
        # httpx has undone any gzip already: the body goes as it is, its length anew.
        headers = {
            k: v for k, v in answer.headers.items()
            if k not in ("content-encoding", "content-length")
        }  # fmt: skip
        await route.fulfill(status=answer.status_code, headers=headers, body=answer.content)

    async with async_playwright() as playwright:
        chromium = await launch(playwright)
        try:
            context = await chromium.new_context(viewport={"width": 1400, "height": 900})
            await context.route("**/*", from_app)
            page = await context.new_page()
            await page.goto(APP_URL + path)
            assert await page.locator("h2", has_text="gpu-2026.12").count() == 1
            await shot(page, name)
        finally:
            await chromium.close()
