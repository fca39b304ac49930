"""Storage volumes: project-scoped, attached to the project's own clusters only."""

from __future__ import annotations

from typing import Any

import pytest
from apihelpers import count_rows, create_cluster, create_project, error_of, member_client

from gpufleet.testing.app import RunningApp

VOLUMES = "/api/v1/projects/ml/volumes"


async def _volume(app: RunningApp, **body: Any) -> dict[str, Any]:
    payload = {"name": "datasets", "size_gb": 500, "mount_path": "/data/datasets", **body}
    response = await app.client.post(VOLUMES, json=payload)
    assert response.status_code == 201, response.text
    volume: dict[str, Any] = response.json()
    return volume


async def test_create_attach_grow_detach_delete(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, project="ml", name="train", size=1)
    volume = await _volume(app)
    assert (volume["name"], volume["size_gb"], volume["cluster_ids"]) == ("datasets", 500, [])
    url = f"{VOLUMES}/{volume['id']}"
    attached = await app.client.post(f"{url}/attachments", json={"cluster": cluster["id"]})
    assert attached.status_code == 201, attached.text
    assert attached.json()["cluster_ids"] == [cluster["id"]]
    by_name = await app.client.get(f"{VOLUMES}/datasets")
    assert by_name.json() == attached.json()
    busy = await app.client.delete(url)
    assert busy.status_code == 409 and "detach it first" in error_of(busy)["message"]
    shrink = await app.client.patch(url, json={"size_gb": 100})
    assert shrink.status_code == 422 and error_of(shrink)["field"] == "size_gb"
    grown = await app.client.patch(url, json={"size_gb": 800})
    assert grown.json()["size_gb"] == 800
    detached = await app.client.delete(f"{url}/attachments/{cluster['id']}")
    assert detached.status_code == 200 and detached.json()["cluster_ids"] == []
    assert (await app.client.delete(url)).status_code == 200
    assert (await app.client.get(VOLUMES)).json() == []


async def test_names_and_mount_paths_do_not_clash(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    cluster = await create_cluster(app.client, project="ml", name="train", size=1)
    first = await _volume(app)
    dup = await app.client.post(
        VOLUMES, json={"name": "datasets", "size_gb": 1, "mount_path": "/data/x"}
    )
    assert dup.status_code == 409 and error_of(dup)["field"] == "name"
    second = await _volume(app, name="scratch", mount_path="/data/datasets")
    for volume in (first, second)[:1]:
        await app.client.post(
            f"{VOLUMES}/{volume['id']}/attachments", json={"cluster": cluster["id"]}
        )
    clash = await app.client.post(
        f"{VOLUMES}/{second['id']}/attachments", json={"cluster": cluster["id"]}
    )
    assert clash.status_code == 409 and error_of(clash)["field"] == "mount_path"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mount_path": "data"}, "mount_path"),
        ({"mount_path": "/data/../etc"}, "mount_path"),
        ({"mount_path": "/etc/x"}, "mount_path"),
        ({"mount_path": "/data x"}, "mount_path"),
        ({"size_gb": 0}, "size_gb"),
        ({"name": "Big Data"}, "name"),
    ],
)
async def test_bad_volumes_are_refused(app: RunningApp, body: dict[str, Any], field: str) -> None:
    await create_project(app.client, "ml")
    before = await count_rows(app)
    payload = {"name": "datasets", "size_gb": 5, "mount_path": "/data/d", **body}
    response = await app.client.post(VOLUMES, json=payload)
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == field
    assert await count_rows(app) == before


async def test_a_volume_attaches_only_to_its_own_project_s_clusters(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    await create_project(app.client, "infra")
    other = await create_cluster(app.client, project="infra", name="serve", size=1)
    volume = await _volume(app)
    response = await app.client.post(
        f"{VOLUMES}/{volume['id']}/attachments", json={"cluster": other["id"]}
    )
    assert response.status_code == 422, response.text
    assert "another project" in error_of(response)["message"]


async def test_members_see_volumes_admins_change_them(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    volume = await _volume(app)
    async with await member_client(app) as member:
        assert [v["id"] for v in (await member.get(VOLUMES)).json()] == [volume["id"]]
        refused = await member.delete(f"{VOLUMES}/{volume['id']}")
    assert refused.status_code == 403
    assert (await app.client.get(f"{VOLUMES}/{volume['id']}")).status_code == 200
