"""Credentials: write-only in the API, sealed at rest (AES-256-GCM, key id stored, bound to
their row), rotation, no key configured, a wrong key; and one test that the secret never
shows in a response, a log line, an event, an audit row or an error text."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import fastapi.routing
import httpx
import pytest
from apihelpers import create_cluster, create_project, error_of
from inventoryhelpers import KEY_A, KEY_B, KEY_C, host, import_hosts, keyed_app, put_credential
from sqlalchemy import func, select

from gpufleet.core.errors import Conflict
from gpufleet.server.app import create_app
from gpufleet.server.db.tables import AuditLogRow, CredentialRow, EventRow
from gpufleet.server.main import rotate_secret_key
from gpufleet.server.services.credentials import open_credential
from gpufleet.server.services.host_directory import DbHostDirectory
from gpufleet.server.services.keyring import (
    Keyring,
    KeyringError,
    SecretUnavailable,
    decode_key,
    key_id_of,
)
from gpufleet.testing.app import RunningApp, make_settings

# Recognisable, and unlike anything else the server writes.
CANARY = "Canary-7f3e1d9c-SECRET-do-not-leak"
KEY_ID_A = key_id_of(decode_key(KEY_A, setting="test"))
KEY_ID_B = key_id_of(decode_key(KEY_B, setting="test"))


async def _credential_rows(app: RunningApp) -> list[CredentialRow]:
    async with app.ctx.db.session() as session:
        return list(await session.scalars(select(CredentialRow).order_by(CredentialRow.name)))


async def test_create_list_show_replace_delete_and_the_secret_never_comes_back(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        await create_project(app.client, "ml")
        created = await put_credential(app.client, "bmc", secret="pw-one")
        assert created.status_code == 200, created.text
        body = created.json()
        assert "secret" not in body and "ciphertext" not in body
        assert (body["name"], body["kind"], body["username"], body["key_id"]) == (
            "bmc", "bmc_password", "root", KEY_ID_A,
        )  # fmt: skip
        assert body["rotated_at"] is None
        replaced = await put_credential(
            app.client, "bmc", secret="pw-two", kind="ssh_key", username="admin"
        )
        assert replaced.json()["id"] == body["id"] and replaced.json()["rotated_at"] is not None
        assert (await put_credential(app.client, "aws", secret="AKIA:x", kind="aws_key")).is_success
        listed = (await app.client.get("/api/v1/projects/ml/credentials")).json()
        assert [(c["name"], c["kind"]) for c in listed] == [("aws", "aws_key"), ("bmc", "ssh_key")]
        shown = (await app.client.get("/api/v1/projects/ml/credentials/bmc")).json()
        assert shown["username"] == "admin" and shown["hosts"] == 0
        (row,) = [r for r in await _credential_rows(app) if r.name == "bmc"]
        assert open_credential(app.ctx.keyring, row) == "pw-two"

        # In use: refused, naming the host; free again: deleted.
        await create_cluster(app.client, project="ml", name="train", size=1)
        assert (await import_hosts(app.client, [host("h1", credential="bmc")])).is_success
        refused = await app.client.delete("/api/v1/projects/ml/credentials/bmc")
        assert refused.status_code == 409 and "h1" in error_of(refused)["message"]
        assert (await import_hosts(app.client, [host("h1")])).is_success
        deleted = await app.client.delete("/api/v1/projects/ml/credentials/bmc")
        assert deleted.status_code == 200 and deleted.json()["name"] == "bmc"
        missing = await app.client.get("/api/v1/projects/ml/credentials/bmc")
        assert missing.status_code == 404
        bad_name = await put_credential(app.client, "has space", secret="x")
        assert bad_name.status_code == 422


async def test_no_key_configured_refuses_to_store_and_the_server_still_runs(
    app: RunningApp,
) -> None:
    await create_project(app.client, "ml")
    assert not app.ctx.keyring.configured
    refused = await put_credential(app.client, "bmc", secret=CANARY)
    assert refused.status_code == 409
    message = error_of(refused)["message"]
    assert "GPUFLEET_SECRET_KEY" in message and "GPUFLEET_SECRET_KEY_FILE" in message
    assert CANARY not in refused.text
    assert await _credential_rows(app) == []
    assert (await app.client.get("/api/v1/projects/ml/credentials")).json() == []


async def test_ciphertext_is_not_the_plaintext_and_does_not_open_in_another_row(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        await create_project(app.client, "ml")
        for name in ("one", "two"):
            assert (await put_credential(app.client, name, secret=f"{CANARY}-{name}")).is_success
        one, two = await _credential_rows(app)
        for row in (one, two):
            assert CANARY.encode() not in row.ciphertext
            assert row.key_id == KEY_ID_A
            assert len(row.ciphertext) == 12 + len(f"{CANARY}-{row.name}") + 16
        # The same secret twice seals differently (a fresh nonce each time).
        assert (await put_credential(app.client, "one", secret=f"{CANARY}-one")).is_success
        (again, _) = await _credential_rows(app)
        assert again.ciphertext != one.ciphertext

        async with app.ctx.db.transaction() as session:
            a = await session.get(CredentialRow, one.id)
            b = await session.get(CredentialRow, two.id)
            assert a is not None and b is not None
            a.ciphertext, b.ciphertext = b.ciphertext, a.ciphertext
        swapped = await _credential_rows(app)
        for row in swapped:
            with pytest.raises(SecretUnavailable) as info:
                open_credential(app.ctx.keyring, row)
            assert KEY_ID_A in info.value.message and row.name in info.value.message
            assert CANARY not in info.value.message


async def test_rotation_reseals_under_the_new_key_and_the_old_key_alone_then_fails_clearly(
    database_url: str, tmp_path: Path
) -> None:
    async with keyed_app(database_url, tmp_path) as app:
        await create_project(app.client, "ml")
        for name in ("one", "two", "three"):
            assert (await put_credential(app.client, name, secret=f"pw-{name}")).is_success
        settings = make_settings(
            data_dir=tmp_path / "data", database_url=database_url,
            secret_key=KEY_B, previous_secret_keys=[KEY_A],
        )  # fmt: skip
        result = await asyncio.to_thread(rotate_secret_key, settings)
        assert (result.key_id, result.reencrypted) == (KEY_ID_B, 3)
        rows = await _credential_rows(app)
        assert {r.key_id for r in rows} == {KEY_ID_B}
        assert all(r.rotated_at is not None for r in rows)
        only_b = Keyring.from_keys(decode_key(KEY_B, setting="t"))
        assert sorted(open_credential(only_b, r) for r in rows) == ["pw-one", "pw-three", "pw-two"]
        only_a = Keyring.from_keys(decode_key(KEY_A, setting="t"))
        with pytest.raises(SecretUnavailable) as info:
            open_credential(only_a, rows[0])
        assert KEY_ID_B in info.value.message and "does not have" in info.value.message
        async with app.ctx.db.session() as session:
            audits = await session.scalar(
                select(func.count())
                .select_from(AuditLogRow)
                .where(AuditLogRow.action == "credential.rotate")
            )
            assert audits == 3

        # A key nobody has any more: the rotation fails naming it, and changes nothing.
        with pytest.raises(SecretUnavailable, match=KEY_ID_B):
            await asyncio.to_thread(
                rotate_secret_key,
                make_settings(
                    data_dir=tmp_path / "data", database_url=database_url, secret_key=KEY_C
                ),
            )
        assert {r.key_id for r in await _credential_rows(app)} == {KEY_ID_B}
        with pytest.raises(Conflict, match="GPUFLEET_SECRET_KEY"):
            await asyncio.to_thread(
                rotate_secret_key,
                make_settings(data_dir=tmp_path / "data", database_url=database_url),
            )


def test_bad_key_material_is_refused_naming_the_setting_never_the_key(tmp_path: Path) -> None:
    for bad, said in (("not base64 !!", "not base64"), ("c2hvcnQ=", "decodes to 5 bytes")):
        with pytest.raises(KeyringError) as info:
            Keyring.load(secret_key=bad, secret_key_file=None)
        assert "GPUFLEET_SECRET_KEY" in str(info.value) and said in str(info.value)
        assert bad not in str(info.value)
    key_file = tmp_path / "key"
    key_file.write_text(f"# gpufleet\n{KEY_B}\n{KEY_A}\n")
    ring = Keyring.load(secret_key=None, secret_key_file=key_file)
    assert ring.current_id == KEY_ID_B and ring.key_ids() == sorted([KEY_ID_A, KEY_ID_B])
    with pytest.raises(KeyringError, match="cannot read"):
        Keyring.load(secret_key=None, secret_key_file=tmp_path / "missing")
    assert not Keyring.load(secret_key=None, secret_key_file=None).configured
    assert decode_key(KEY_C, setting="t") == bytes(range(200, 232))  # standard alphabet


async def test_the_secret_never_appears_in_a_response_log_event_audit_row_or_error(
    database_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with keyed_app(database_url, tmp_path) as app:
        texts: list[str] = []
        hit: set[tuple[str, str]] = set()

        statuses: list[int] = []

        def seen(response: httpx.Response) -> None:
            statuses.append(response.status_code)
            texts.append(response.text)
            texts.extend(f"{k}: {v}" for k, v in response.headers.items())

        client = app.client
        await create_project(client, "ml")
        cluster = await create_cluster(client, project="ml", name="train", size=1)
        base = "/api/v1/projects/ml"
        calls: list[tuple[str, str, str, object]] = [
            ("PUT", "/credentials/{credential_ref}", "/credentials/bmc",
             {"kind": "bmc_password", "username": "root", "secret": CANARY}),
            ("PUT", "/credentials/{credential_ref}", "/credentials/bmc",
             {"kind": "bmc_password", "username": "root", "secret": CANARY + "-2"}),
            ("PUT", "/credentials/{credential_ref}", "/credentials/bad",
             {"kind": "nope", "secret": CANARY}),
            ("PUT", "/credentials/{credential_ref}", "/credentials/bad",
             {"kind": "ssh_key", "secret": CANARY, "extra": CANARY}),
            ("PUT", "/credentials/{credential_ref}", "/credentials/bad",
             {"kind": "ssh_key", "secret": CANARY * 1000}),
            ("PUT", "/credentials/{credential_ref}", "/credentials/bad", '{"secret": "' + CANARY),
            ("GET", "/credentials", "/credentials", None),
            ("GET", "/credentials/{credential_ref}", "/credentials/bmc", None),
            ("POST", "/hosts/import", "/hosts/import",
             {"hosts": [host("h1", credential="bmc", cluster="train", role="spare"),
                        host("h2", credential="bmc", cluster="train", role="spare")]}),
            ("GET", "/hosts", "/hosts", None),
            ("GET", "/hosts/{host_ref}", "/hosts/h1", None),
            ("POST", "/hosts/{host_ref}/bind", "/hosts/h1/bind", {"node_id": "nope"}),
            ("POST", "/hosts/{host_ref}/state", "/hosts/h1/state",
             {"state": "out_of_service", "reason": "maintenance"}),
            ("POST", "/hosts/{host_ref}/state", "/hosts/h1/state", {"state": "spare"}),
            ("DELETE", "/credentials/{credential_ref}", "/credentials/bmc", None),
            ("DELETE", "/credentials/{credential_ref}", "/credentials/missing", None),
        ]  # fmt: skip
        for method, template, path, body in calls:
            if isinstance(body, str):
                response = await client.request(
                    method, base + path, content=body, headers={"content-type": "application/json"}
                )
            else:
                response = await client.request(method, base + path, json=body)
            seen(response)
            hit.add((method, base.replace("ml", "{project_ref}") + template))
        # Created, replaced; four refusals of bad bodies; reads; import; a bad bind; out of
        # service and back; delete refused (in use) and not found.
        assert statuses == [
            200, 200, 422, 422, 422, 400, 200, 200, 200, 200, 200, 404, 200, 200, 409, 404,
        ]  # fmt: skip
        bound = await client.get(f"/api/v1/nodes?cluster={cluster['id']}")
        node_id = bound.json()["items"][0]["id"]
        response = await client.post(f"{base}/hosts/h2/bind", json={"node_id": node_id})
        assert response.status_code == 200, response.text
        seen(response)

        # The driver side: open, claim, release, and a failure to open; then a rotation.
        directory = DbHostDirectory(db=app.ctx.db, keyring=app.ctx.keyring, clock=app.ctx.clock)
        claimed = await directory.claim_spare(cluster["id"], "tok-1")
        assert claimed is not None and claimed.credential is not None
        assert claimed.credential.secret == CANARY + "-2"
        texts += [repr(claimed), str(claimed), repr(claimed.credential)]
        await directory.release(claimed.host_id)
        settings = make_settings(
            data_dir=tmp_path / "data", database_url=database_url,
            secret_key=KEY_B, previous_secret_keys=[KEY_A],
        )  # fmt: skip
        texts.append(repr(settings))
        texts.append(repr(app.ctx))
        await asyncio.to_thread(rotate_secret_key, settings)
        stale = DbHostDirectory(db=app.ctx.db, keyring=app.ctx.keyring, clock=app.ctx.clock)
        with pytest.raises(SecretUnavailable) as info:
            await stale.host(claimed.host_id)  # the app still has only key A
        texts.append(str(info.value))

        # Every inventory route of the app was exercised.
        routes = {
            (method, context.path)
            for context in fastapi.routing.iter_route_contexts(app.app.routes)
            if "/credentials" in context.path or "/hosts" in context.path
            for method in context.methods or ()
            if method != "HEAD"
        }
        assert routes <= hit, routes - hit

        async with app.ctx.db.session() as session:
            events = list(await session.scalars(select(EventRow)))
            audits = list(await session.scalars(select(AuditLogRow)))
            rows = list(await session.scalars(select(CredentialRow)))
        assert events and audits and rows
        texts += [f"{e.kind} {e.message} {e.data}" for e in events]
        texts += [f"{a.action} {a.object_type} {a.detail}" for a in audits]
        texts += [r.ciphertext.decode("latin-1") for r in rows]
        texts += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
        texts.append(caplog.text)
        assert any("credential.create" in t for t in texts)  # the scan sees the audit rows
        leaked = [t[:200] for t in texts if CANARY in t]
        assert not leaked, leaked


def test_a_malformed_key_stops_the_app_at_start_naming_the_setting(tmp_path: Path) -> None:
    settings = make_settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}",
        secret_key=CANARY,
    )
    with pytest.raises(KeyringError) as info:
        create_app(settings)
    assert "GPUFLEET_SECRET_KEY" in str(info.value) and CANARY not in str(info.value)
    assert CANARY not in repr(settings)
