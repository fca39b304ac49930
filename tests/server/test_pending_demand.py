"""The GPUs a cluster's pending jobs wait for: read from its scheduler by the accounting
loop, stored on the cluster, exported as ``gpufleet_pending_gpu_demand`` (SQLite and
PostgreSQL, the simulated scheduler)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.testing.fleet import SimFleet, sim_fleet


async def _demand(fleet: SimFleet) -> dict[str, float]:
    async with fleet.app.with_token(fleet.app.owner_token) as client:
        response = await client.get("/metrics")
    assert response.status_code == 200, response.text
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.name in (
                "gpufleet_pending_gpu_demand",
                "gpufleet_pending_gpu_demand_age_seconds",
            ):
                assert sample.labels == {"project": "ml", "cluster": fleet.cluster["name"]}
                found[sample.name] = sample.value
    return found


async def test_pending_jobs_show_as_demand_until_they_start(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_fleet(database_url, tmp_path, size=2) as fleet:
        cid = fleet.cluster_id
        await fleet.tick(60)
        assert (await _demand(fleet))["gpufleet_pending_gpu_demand"] == 0
        for hours in (1, 1, 3):  # two nodes: the third job waits for one
            fleet.world.submit_job(
                cluster_id=cid, node_count=1, gpus_per_node=8, duration_s=hours * 3600
            )
        await fleet.tick(60)
        assert len(fleet.world.running_jobs(cluster_id=cid)) == 2
        demand = await _demand(fleet)
        assert demand["gpufleet_pending_gpu_demand"] == 8
        assert 0 <= demand["gpufleet_pending_gpu_demand_age_seconds"] < 120
        await fleet.tick(3600)  # the first two end; the third starts
        assert (await _demand(fleet))["gpufleet_pending_gpu_demand"] == 0
