"""The Configuration tab shows the cluster's provider and its configuration, the
credential by name only; an admin changes it there (a JSON object), a member cannot."""

from __future__ import annotations

import base64
import json
from pathlib import Path

from webhelpers import APP_URL, browser, hidden, log_in, member_token

from gpufleet.testing.app import make_settings, running_app

KEY = base64.urlsafe_b64encode(bytes(range(32))).decode()
SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYpage7"  # made up; must never show


async def test_the_configuration_tab_shows_the_provider_configuration(
    database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(
        data_dir=tmp_path / "data", database_url=database_url, secret_key=KEY, public_url=APP_URL
    )
    async with running_app(settings) as app:
        assert (await app.client.post("/api/v1/projects", json={"name": "ml"})).is_success
        stored = await app.client.put(
            "/api/v1/projects/ml/credentials/aws-prod",
            json={"kind": "aws_key", "username": "AKIAIOSFODNN7EXAMPLE", "secret": SECRET_KEY},
        )
        assert stored.status_code == 200, stored.text
        config = {
            "region": "eu-west-1", "credential": "aws-prod", "auto_scaling_group": "gpu-h100",
            "tags": {"team": "ml"},
        }  # fmt: skip
        created = await app.client.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "cloud", "size": 1, "provider": "aws",
                  "provider_config": config, "acceptance_tests": False},
        )  # fmt: skip
        assert created.status_code == 201, created.text
        sim = await app.client.post(
            "/api/v1/clusters", json={"project": "ml", "name": "sim", "size": 1}
        )
        assert sim.status_code == 201, sim.text
        async with browser(app) as admin, browser(app) as member:
            assert (await log_in(admin, app.owner_token)).status_code == 303
            assert (await log_in(member, await member_token(app))).status_code == 303
            for client in (admin, member):
                page = await client.get(f"/clusters/{created.json()['id']}/configuration")
                assert page.status_code == 200, page.text
                html = page.text
                assert "Provider: aws" in html and "eu-west-1" in html
                assert "aws-prod" in html and "gpu-h100" in html and "team=ml" in html
                assert SECRET_KEY not in html and "AKIAIOSFODNN7EXAMPLE" not in html
            other = await admin.get(f"/clusters/{sim.json()['id']}/configuration")
            assert "Nothing to configure per cluster for sim" in other.text

            # An admin changes it on the page; a bad one is refused naming the field.
            base = f"/clusters/{created.json()['id']}"
            page = await admin.get(f"{base}/configuration")
            assert 'name="provider_config"' in page.text
            csrf = hidden(page.text, "csrf")
            changed = {**config, "tags": {"team": "infra"}}
            saved = await admin.post(
                f"{base}/provider-config",
                data={"csrf": csrf, "provider_config": json.dumps(changed), "reason": "infra"},
            )
            assert saved.status_code == 303, saved.text
            shown = (await app.client.get(f"/api/v1{base}/provider-config")).json()
            assert shown["config"]["tags"] == {"team": "infra"}
            for text, words in (
                (json.dumps({**config, "zone": "a"}), "provider_config.zone"),
                ("{not json", "not valid JSON"),
                ("[1]", "a JSON object"),
            ):
                bad = await admin.post(
                    f"{base}/provider-config", data={"csrf": csrf, "provider_config": text}
                )
                assert bad.status_code == 422, bad.text
                assert words in bad.text.split('role="alert"')[1][:400]
            assert (await app.client.get(f"/api/v1{base}/provider-config")).json() == shown
            # A member sees no form, and a forged one is refused.
            member_page = await member.get(f"{base}/configuration")
            assert 'name="provider_config"' not in member_page.text
            forged = await member.post(
                f"{base}/provider-config",
                data={"csrf": hidden(member_page.text, "csrf"),
                      "provider_config": json.dumps(config)},
            )  # fmt: skip
            assert forged.status_code == 403, forged.text
