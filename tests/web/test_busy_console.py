"""The console's Utilization tab in a real browser against a ``gpufleet demo`` whose
simulated users run jobs (the other browser tests run none, for their repairs' timing):
the nodes running a job read busy, the idle ones idle, as the sim's jobs drive their
GPUs. The screenshot goes to ``test-artifacts/console/10-utilization-busy.png``.

Without Chromium this test fails; it never skips."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from browser_env import CHROMIUM, launch, loopback_context, shot
from playwright.async_api import async_playwright, expect

from gpufleet.testing.processes import ServerProcess, free_port, printed_value

pytestmark = pytest.mark.slow

BUSY_DEMO = {
    "GPUFLEET_DATABASE_URL": "",
    "GPUFLEET_SIM_PROVISION_DELAY_S": "[0.5, 1.0]",
    "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0",
    "GPUFLEET_SIM_BUSY_SHARE": "[0.5, 0.5]",  # half the nodes run jobs, half idle
    "GPUFLEET_SIM_JOB_MINUTES": "[30, 60]",  # none ends while the test looks
    "GPUFLEET_SIM_PROGRAM_TIME_SCALE": "0.002",  # acceptance in seconds
    "GPUFLEET_RECONCILE_INTERVAL_S": "0.3",
    "GPUFLEET_CHECK_INTERVAL_S": "0.3",
    "GPUFLEET_REPORT_INTERVAL_S": "0.5",
    "PYTHONUNBUFFERED": "1",
}


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """(url, owner token, the demo cluster's id) once its jobs have started."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (never playwright install)")
    workdir = tmp_path_factory.mktemp("busy-demo")
    proc = ServerProcess(
        args=["demo", "--port", str(free_port()), "--data-dir", str(workdir / "demo")],
        env=BUSY_DEMO,
        log_path=workdir / "demo.log",
    )
    proc.start()
    try:
        url = printed_value(proc, "GPUFLEET_URL")
        token = printed_value(proc, "GPUFLEET_TOKEN")
        proc.wait_ready(url)
        with httpx.Client(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        ) as api:
            cluster = api.get("/api/v1/clusters", params={"name": "demo"}).json()["items"][0]
            deadline = time.monotonic() + 240  # a readiness wait: acceptance, then jobs
            while True:
                status = api.get(f"/api/v1/clusters/{cluster['id']}/status").json()
                if status["status"] == "ready":
                    break
                assert time.monotonic() < deadline, f"demo not ready: {status}"
                time.sleep(0.5)
        yield url, token, cluster["id"]
    finally:
        proc.stop()


def _utils(cells: list[str]) -> list[float]:
    return [float(c.replace("%", "").replace(",", "").strip()) for c in cells]


async def test_running_jobs_show_on_the_utilization_tab(demo: tuple[str, str, str]) -> None:
    url, token, cluster_id = demo
    async with async_playwright() as playwright:
        browser = await launch(playwright)
        context, blocked = await loopback_context(browser)
        page = await context.new_page()
        await page.goto(url + "/")
        await page.get_by_label("Personal API token").fill(token)
        await page.get_by_role("button", name="Log in with token").click()
        await expect(page.get_by_role("heading", name="Projects", level=1)).to_be_visible()
        deadline = time.monotonic() + 120  # jobs start after acceptance; readings follow
        while True:
            await page.goto(f"{url}/clusters/{cluster_id}/utilization")
            column = page.locator("table.data tbody td:nth-of-type(1)")
            utils = _utils(await column.all_inner_texts())
            busy = [u for u in utils if u >= 40]
            idle = [u for u in utils if u < 5]
            if len(busy) >= 4 and len(idle) >= 4:
                break
            assert time.monotonic() < deadline, f"the tab never showed busy and idle: {utils}"
            await page.wait_for_timeout(2000)
        await shot(page, "10-utilization-busy")
        print(f"GPU util by node on the Utilization tab: {sorted(utils, reverse=True)}")
        assert not blocked
        await browser.close()
