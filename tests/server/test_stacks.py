"""Software stacks (issue 17, items 1 and 2): the owner's catalog with one latest; new
clusters take the latest unless pinned; a node's reported software against its
cluster's stack — skew on the node, a finding for the driver that opens and clears
(SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from apihelpers import (
    create_cluster,
    create_project,
    error_of,
    member_client,
    node_tokens,
    nodes_of,
    report_batch,
    run_loops,
    send_report,
)

from gpufleet.testing.app import RunningApp
from gpufleet.testing.fleet import sim_app

OLD = {"os_image": "ubuntu-22.04-gpu-2026.09", "driver": "570.172.08", "slurm": "24.05.8"}
NEW = {"os_image": "ubuntu-24.04-gpu-2026.12", "driver": "580.95.05", "slurm": "25.05.3"}


async def _stack(app: RunningApp, name: str, **body: Any) -> dict[str, Any]:
    made = await app.client.post("/api/v1/stacks", json={"name": name, **body})
    assert made.status_code == 201, made.text
    stack: dict[str, Any] = made.json()
    return stack


async def test_new_clusters_take_the_latest_stack_unless_pinned(app: RunningApp) -> None:
    await create_project(app.client)
    before = await create_cluster(app.client, name="before")
    assert before["stack"] is None  # no stack defined yet

    first = await _stack(app, "gpu-2026.09", latest=True, notes="first", **OLD)
    assert first["latest"] and first["driver"] == "570.172.08" and first["created_by"]
    await _stack(app, "gpu-2026.12", **NEW)
    assert (await create_cluster(app.client, name="a"))["stack"] == "gpu-2026.09"
    pinned = await create_cluster(app.client, name="b", stack="gpu-2026.12")
    assert pinned["stack"] == "gpu-2026.12"

    latest = await app.client.post("/api/v1/stacks/gpu-2026.12/latest")
    assert latest.status_code == 200 and latest.json()["latest"]
    listed = (await app.client.get("/api/v1/stacks")).json()["items"]
    assert [(s["name"], s["latest"]) for s in listed] == [
        ("gpu-2026.12", True),
        ("gpu-2026.09", False),
    ]
    assert (await create_cluster(app.client, name="c"))["stack"] == "gpu-2026.12"
    shown = await app.client.get(f"/api/v1/clusters/{pinned['id']}")
    assert shown.json()["stack"] == "gpu-2026.12"

    # Bad input: an unknown stack, a name taken, a bad name, a field no stack has.
    unknown = await app.client.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "d", "size": 1, "stack": "gpu-1999"},
    )
    assert unknown.status_code == 404 and error_of(unknown)["field"] == "stack"
    again = await app.client.post("/api/v1/stacks", json={"name": "gpu-2026.12"})
    assert again.status_code == 409
    bad = await app.client.post("/api/v1/stacks", json={"name": "Bad Name"})
    assert bad.status_code == 422
    extra = await app.client.post("/api/v1/stacks", json={"name": "x1", "kernel": "6.8"})
    assert extra.status_code == 422
    missing = await app.client.get("/api/v1/stacks/gpu-1999")
    assert missing.status_code == 404

    # Everyone signed in reads stacks; only the owner makes them.
    async with await member_client(app) as member:
        assert (await member.get("/api/v1/stacks")).status_code == 200
        refused = await member.post("/api/v1/stacks", json={"name": "mine"})
        assert refused.status_code == 403


def _with_software(batch: dict[str, Any], **software: str) -> dict[str, Any]:
    batch["identity"]["software"] = software
    return batch


async def test_a_node_on_another_driver_is_skewed_until_it_runs_the_stacks(
    app: RunningApp,
) -> None:
    await create_project(app.client)
    await _stack(app, "gpu-2026.12", latest=True, **NEW)
    cluster = await create_cluster(app.client, size=2)
    for _ in range(3):
        await run_loops(app)
    tokens_now = await node_tokens(app, cluster["id"])
    by_name = {n["name"]: n for n in await nodes_of(app, cluster["id"])}
    odd, good = sorted(tokens_now)

    # The odd node still runs last quarter's driver; the good one runs the stack.
    sent = await send_report(
        app,
        tokens_now[odd],
        _with_software(
            report_batch(1, hostname=odd),
            os_image=NEW["os_image"], kernel="6.8.0-48-generic", driver="570.172.08",
            slurm=NEW["slurm"], agent="0.1.0",
        ),
    )  # fmt: skip
    assert sent.status_code == 200, sent.text
    sent = await send_report(
        app,
        tokens_now[good],
        _with_software(report_batch(1, hostname=good), driver=NEW["driver"], slurm="25.05.3"),
    )
    assert sent.status_code == 200, sent.text

    node = (await app.client.get(f"/api/v1/nodes/{by_name[odd]['id']}")).json()
    assert node["software"]["driver"] == "570.172.08"
    assert node["software"]["kernel"] == "6.8.0-48-generic"
    assert node["stack_skew"] == [
        {"component": "driver", "want": "580.95.05", "have": "570.172.08"}
    ]
    fine = (await app.client.get(f"/api/v1/nodes/{by_name[good]['id']}")).json()
    # It reports no OS image: a component it does not report is skew too.
    assert [s["component"] for s in fine["stack_skew"]] == ["os_image"]

    findings = (
        await app.client.get("/api/v1/findings", params={"signature": "stack-driver-skew"})
    ).json()["items"]
    assert [(f["node_id"], f["severity"], f["source"]) for f in findings] == [
        (by_name[odd]["id"], "warning", "stack")
    ]
    assert "570.172.08" in findings[0]["evidence"] and "580.95.05" in findings[0]["evidence"]
    events = (
        await app.client.get(
            "/api/v1/events", params={"node": by_name[odd]["id"], "kind": "node.software"}
        )
    ).json()["items"]
    assert len(events) == 1 and "driver - → 570.172.08" in events[0]["message"]

    # The same software again: nothing new. The node reinstalled: the finding clears.
    again = _with_software(report_batch(2, hostname=odd), driver="570.172.08")
    again["identity"]["software"] = node["software"]
    assert (await send_report(app, tokens_now[odd], again)).status_code == 200
    fixed = _with_software(
        report_batch(3, hostname=odd), **{**node["software"], "driver": NEW["driver"]}
    )
    assert (await send_report(app, tokens_now[odd], fixed)).status_code == 200
    open_now = (
        await app.client.get(
            "/api/v1/findings", params={"signature": "stack-driver-skew", "open": "true"}
        )
    ).json()["items"]
    assert open_now == []
    node = (await app.client.get(f"/api/v1/nodes/{by_name[odd]['id']}")).json()
    assert node["stack_skew"] == []
    events = (
        await app.client.get(
            "/api/v1/events", params={"node": by_name[odd]["id"], "kind": "node.software"}
        )
    ).json()["items"]
    assert len(events) == 2


async def test_simulated_machines_run_the_stack_their_cluster_was_made_with(
    database_url: str, tmp_path: Path
) -> None:
    async with sim_app(database_url, tmp_path) as fleet:
        made = await fleet.app.client.post(
            "/api/v1/stacks", json={"name": "gpu-2026.12", "latest": True, **NEW}
        )
        assert made.status_code == 201, made.text
        created = await fleet.app.client.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "train", "size": 2, "acceptance_tests": False},
        )
        assert created.status_code == 201, created.text
        cid = created.json()["id"]

        async def reported() -> list[dict[str, Any]] | None:
            nodes = (await fleet.get("/api/v1/nodes", cluster=cid))["items"]
            return nodes if all(n["software"] for n in nodes) else None

        nodes = await fleet.until(reported, what="software reported")
        for listed in nodes:
            assert listed["software"]["driver"] == NEW["driver"]
            assert listed["software"]["os_image"] == NEW["os_image"]
            node = await fleet.get(f"/api/v1/nodes/{listed['id']}")
            assert node["stack_skew"] == []
        skewed = await fleet.get("/api/v1/findings", signature="stack-driver-skew")
        assert skewed["items"] == []
