"""A cluster's provider configuration through the API: given at create, shown, replaced by
an admin; checked against the provider and the project's credentials (422 naming the
field, nothing written); never a secret in an answer, an event or an audit row. On SQLite
and PostgreSQL. The aws clusters here never reach AWS: provisioning is not run (an aws
cluster against moto: test_aws_clusters.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from apihelpers import (
    assert_only_refusal_written,
    count_rows,
    create_project,
    error_of,
    member_client,
)
from inventoryhelpers import keyed_app, put_credential
from sqlalchemy import select

from gpufleet.core.errors import DriverError
from gpufleet.providers.base import (
    Provider,
    SupportsPower,
    SupportsReachCheck,
    SupportsReboot,
    SupportsReplace,
    SupportsReprovision,
)
from gpufleet.server.db.tables import AuditLogRow, ClusterRow, EventRow
from gpufleet.server.services.aws_providers import AwsProviders, ClusterAwsProvider
from gpufleet.testing.app import RunningApp

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYzq8pw3x"  # made up; must never show
CONFIG: dict[str, Any] = {
    "region": "us-east-1",
    "credential": "aws-prod",
    "auto_scaling_group": "gpu-h100",
    "launch_template_name": "gpu-h100",
    "tags": {"team": "ml"},
}


async def _setup(app: RunningApp) -> None:
    await create_project(app.client, "ml")
    stored = await put_credential(
        app.client, "aws-prod", secret=f"{ACCESS_KEY}:{SECRET_KEY}", kind="aws_key",
        username=None,
    )  # fmt: skip
    assert stored.status_code == 200, stored.text
    bmc = await put_credential(app.client, "bmc", secret="Pa55-bmc-zq8", kind="bmc_password")
    assert bmc.status_code == 200, bmc.text


async def _create(app: RunningApp, name: str = "cloud", **extra: Any) -> httpx.Response:
    body = {
        "project": "ml", "name": name, "size": 2, "acceptance_tests": False,
        "provider": "aws", "provider_config": CONFIG, **extra,
    }  # fmt: skip
    return await app.client.post("/api/v1/clusters", json=body)


def _path(cluster_id: str) -> str:
    return f"/api/v1/clusters/{cluster_id}/provider-config"


async def test_given_at_create_shown_and_replaced_by_an_admin(
    database_url: str, tmp_path: Path
) -> None:
    texts: list[str] = []
    async with keyed_app(database_url, tmp_path) as app:
        await _setup(app)
        created = await _create(app)
        assert created.status_code == 201, created.text
        cluster = created.json()
        assert cluster["provider"] == "aws"
        shown = await app.client.get(_path(cluster["id"]))
        assert shown.status_code == 200, shown.text
        body = shown.json()
        assert (body["cluster_id"], body["cluster_name"], body["provider"]) == (
            cluster["id"], "cloud", "aws",
        )  # fmt: skip
        assert body["config"] == {
            **CONFIG, "endpoint_url": None, "launch_template_id": None,
            "launch_template_version": "$Default", "instance_type": None, "subnet_id": None,
        }  # fmt: skip

        changed = {**CONFIG, "tags": {"team": "infra"}, "instance_type": "p5.48xlarge"}
        put = await app.client.put(
            _path(cluster["id"]), json={"config": changed, "reason": "bigger machines"}
        )
        assert put.status_code == 200, put.text
        assert put.json()["config"]["instance_type"] == "p5.48xlarge"
        assert (await app.client.get(_path(cluster["id"]))).json() == put.json()
        # The same again: audited, no event (nothing changed).
        again = await app.client.put(_path(cluster["id"]), json={"config": changed})
        assert again.status_code == 200, again.text

        async with app.ctx.db.session() as session:
            audits = list(
                await session.scalars(
                    select(AuditLogRow)
                    .where(AuditLogRow.action == "cluster.provider_config")
                    .order_by(AuditLogRow.ts)
                )
            )
            events = list(
                await session.scalars(select(EventRow).where(EventRow.cluster_id == cluster["id"]))
            )
            all_audits = list(await session.scalars(select(AuditLogRow)))
        assert [a.detail["changed"] for a in audits] == [["instance_type", "tags"], []]
        assert audits[0].detail["reason"] == "bigger machines"
        assert audits[0].detail["after"]["credential"] == "aws-prod"
        updates = [e for e in events if e.kind == "cluster.updated"]
        assert len(updates) == 1
        assert updates[0].data["changed"] == [
            "provider_config.instance_type", "provider_config.tags",
        ]  # fmt: skip
        texts += [created.text, shown.text, put.text, again.text]
        texts += [f"{e.message} {e.data}" for e in events]
        texts += [f"{a.action} {a.detail}" for a in all_audits]
        texts.append((await app.client.get(f"/api/v1/clusters/{cluster['id']}")).text)
    for text in texts:
        assert SECRET_KEY not in text and ACCESS_KEY not in text


async def test_bad_configurations_are_422_naming_the_field_and_write_nothing(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        await _setup(app)
        cases: list[tuple[dict[str, Any], str, str]] = [
            ({"provider_config": {}}, "provider_config.region", "field required"),
            (
                {"provider_config": {**CONFIG, "subnet": "subnet-1"}},
                "provider_config.subnet",
                "unknown field",
            ),
            ({"provider_config": {**CONFIG, "region": "moon"}}, "provider_config.region", "e.g."),
            (
                {"provider_config": {**CONFIG, "credential": "nope"}},
                "provider_config.credential",
                "no credential 'nope'",
            ),
            (
                {"provider_config": {**CONFIG, "credential": "bmc"}},
                "provider_config.credential",
                "not an aws_key",
            ),
            (
                {"provider_config": {k: v for k, v in CONFIG.items() if k not in (
                    "auto_scaling_group", "launch_template_name")}},
                "provider_config.auto_scaling_group",
                "needs auto_scaling_group",
            ),
            (
                {"provider_config": {**CONFIG, "launch_template_id": "lt-0abc"}},
                "provider_config.launch_template_id",
                "not both",
            ),
            (
                {"provider_config": {**CONFIG, "tags": {"gpufleet:node": "x"}}},
                "provider_config.tags.gpufleet:node",
                "set by gpufleet",
            ),
            # Empty for the other providers: any field is unknown.
            ({"provider": "sim", "provider_config": {"region": "us-east-1"}},
             "provider_config.region", "takes: nothing"),
        ]  # fmt: skip
        for extra, field, words in cases:
            before = await count_rows(app)
            refused = await _create(app, **extra)
            assert refused.status_code == 422, (extra, refused.text)
            error = error_of(refused)
            assert error["field"] == field, (extra, error)
            assert words in error["message"], (extra, error)
            await assert_only_refusal_written(app, before, refused, audited=True)

        created = await _create(app)
        assert created.status_code == 201, created.text
        cluster_id = created.json()["id"]
        shown = (await app.client.get(_path(cluster_id))).json()
        for body, field in [
            ({"config": {**CONFIG, "credential": "bmc"}}, "provider_config.credential"),
            ({"config": {**CONFIG, "zone": "a"}}, "provider_config.zone"),
            ({"config": CONFIG, "extra": 1}, "extra"),
        ]:
            before = await count_rows(app)
            refused = await app.client.put(_path(cluster_id), json=body)
            assert refused.status_code == 422, refused.text
            assert error_of(refused)["field"] == field
            await assert_only_refusal_written(app, before, refused, audited=True)
        assert (await app.client.get(_path(cluster_id))).json() == shown

        # A sim cluster: an empty configuration, shown and set as such.
        sim = await app.client.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "sim", "size": 1, "acceptance_tests": False},
        )
        assert sim.status_code == 201, sim.text
        sim_config = await app.client.get(_path(sim.json()["id"]))
        assert sim_config.json()["config"] == {} and sim_config.json()["provider"] == "sim"
        assert (await app.client.put(_path(sim.json()["id"]), json={"config": {}})).is_success


async def test_a_member_sees_the_configuration_and_cannot_change_it(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        await _setup(app)
        created = await _create(app)
        assert created.status_code == 201, created.text
        cluster_id = created.json()["id"]
        member = await member_client(app)
        seen = await member.get(_path(cluster_id))
        assert seen.status_code == 200 and seen.json()["config"]["credential"] == "aws-prod"
        before = await count_rows(app)
        refused = await member.put(_path(cluster_id), json={"config": {**CONFIG, "tags": {}}})
        assert refused.status_code == 403, refused.text
        await assert_only_refusal_written(app, before, refused, audited=True)
        # The credential it names cannot be deleted while it does.
        deleted = await app.client.delete("/api/v1/projects/ml/credentials/aws-prod")
        assert deleted.status_code == 409, deleted.text
        assert "aws cluster(s) cloud" in error_of(deleted)["message"]
        # Another project's admin does not even see the cluster.
        await create_project(app.client, "other")
        outsider = await member_client(app, "other")
        assert (await outsider.get(_path(cluster_id))).status_code == 404


async def test_the_server_builds_one_aws_driver_per_cluster_and_rebuilds_it_on_a_new_key(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        await _setup(app)
        created = await _create(app)
        assert created.status_code == 201, created.text
        async with app.ctx.db.session() as session:
            row = await session.get(ClusterRow, created.json()["id"])
        assert row is not None
        driver = app.ctx.drivers.provider_for(row)
        assert isinstance(driver, ClusterAwsProvider)
        for capability in (Provider, SupportsPower, SupportsReboot, SupportsReprovision,
                           SupportsReplace, SupportsReachCheck):  # fmt: skip
            assert isinstance(driver, capability)
        providers = app.ctx.drivers.per_cluster["aws"]
        assert isinstance(providers, AwsProviders)
        where = {"cluster_id": row.id, "cluster_name": row.name, "project_id": row.project_id}
        first = await providers.build(**where, raw=row.provider_config)
        assert await providers.build(**where, raw=row.provider_config) is first
        # The key replaced (rotated): the next call builds with the new one.
        replaced = await put_credential(
            app.client, "aws-prod", secret=f"{ACCESS_KEY}:{SECRET_KEY}x", kind="aws_key",
            username=None,
        )  # fmt: skip
        assert replaced.status_code == 200, replaced.text
        second = await providers.build(**where, raw=row.provider_config)
        assert second is not first
        # What cannot be built fails the call, naming the cluster and the fix, no secret.
        errors: list[str] = []
        with pytest.raises(DriverError, match="cluster cloud: no usable provider config") as e:
            await providers.build(**where, raw={})
        errors.append(e.value.message)
        wrong = await put_credential(app.client, "aws-prod", secret=SECRET_KEY, kind="aws_key",
                                     username=None)  # fmt: skip
        assert wrong.status_code == 200, wrong.text
        with pytest.raises(DriverError, match="not an access key pair") as e:
            await providers.build(**where, raw=row.provider_config)
        errors.append(e.value.message)
        for message in errors:
            assert SECRET_KEY not in message
