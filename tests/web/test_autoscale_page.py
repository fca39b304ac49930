"""The Configuration tab's autoscaling card: the mode, bounds and thresholds, the recent
changes of size with their reasons; an admin changes them there, a member cannot, and a
bad value is refused naming the field with nothing written."""

from __future__ import annotations

from pathlib import Path

from webhelpers import APP_URL, browser, hidden, log_in, member_token

from gpufleet.testing.app import make_settings, running_app


async def test_the_autoscaling_card_shows_and_changes_the_policy(
    database_url: str, tmp_path: Path
) -> None:
    settings = make_settings(data_dir=tmp_path / "data", database_url=database_url,
                             public_url=APP_URL)  # fmt: skip
    async with running_app(settings) as app:
        assert (await app.client.post("/api/v1/projects", json={"name": "ml"})).is_success
        created = await app.client.post(
            "/api/v1/clusters", json={"project": "ml", "name": "inf", "size": 2}
        )
        assert created.status_code == 201, created.text
        cluster_id = created.json()["id"]
        base = f"/clusters/{cluster_id}"
        async with browser(app) as admin, browser(app) as member:
            assert (await log_in(admin, app.owner_token)).status_code == 303
            assert (await log_in(member, await member_token(app))).status_code == 303
            page = await member.get(f"{base}/configuration")
            assert page.status_code == 200, page.text
            assert "Autoscaling: off" in page.text and "No change of size yet." in page.text
            assert 'action="' + base + '/autoscale"' not in page.text  # members: no form

            page = await admin.get(f"{base}/configuration")
            csrf = hidden(page.text, "csrf")
            form = {
                "csrf": csrf, "mode": "gpufleet", "min_nodes": "1", "max_nodes": "6",
                "scale_up_after_s": "90", "scale_down_after_s": "600", "up_cooldown_s": "60",
                "down_cooldown_s": "300", "max_step": "2", "reason": "inference pilot",
            }  # fmt: skip
            saved = await admin.post(f"{base}/autoscale", data=form)
            assert saved.status_code == 303, saved.text
            shown = (await app.client.get(f"/api/v1{base}/autoscale")).json()
            assert (shown["mode"], shown["min_nodes"], shown["max_nodes"]) == ("gpufleet", 1, 6)
            assert (shown["scale_up_after_s"], shown["max_step"]) == (90.0, 2)
            page = await admin.get(f"{base}/configuration")
            assert "Autoscaling: gpufleet" in page.text and "at most 2 node(s)" in page.text

            for field, value, words in (
                ("max_nodes", "0", "max_nodes"),
                ("min_nodes", "9", "must not exceed"),
                ("scale_up_after_s", "soon", "scale_up_after_s"),
                ("mode", "slurm", "slurm clusters"),
            ):
                bad = await admin.post(f"{base}/autoscale", data={**form, field: value})
                assert bad.status_code == 422, bad.text
                assert words in bad.text.split('role="alert"')[1][:400], (field, bad.text)
            after = (await app.client.get(f"/api/v1{base}/autoscale")).json()
            assert after == shown  # nothing half-written
            refused = await member.post(f"{base}/autoscale", data={**form, "csrf": hidden(
                (await member.get(f"{base}/configuration")).text, "csrf")})  # fmt: skip
            assert refused.status_code == 403
