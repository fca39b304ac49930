"""``POST /api/v1/clusters/{id}/providers/check`` against the real peers — ipmi_sim, the
sushy emulator, a real sshd — with their hosts and credentials imported through the API
(sealed under the server's key), on SQLite and PostgreSQL; and what it refuses."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from apihelpers import create_cluster, create_project, error_of
from inventoryhelpers import import_hosts, keyed_app, put_credential
from sqlalchemy import select

from gpufleet.server.db.tables import AuditLogRow, EventRow
from gpufleet.testing.app import RunningApp
from providers.peers import PeerHost, ipmi_peer, redfish_peer, ssh_peer, unreachable_redfish_row

# ipmi_sim lacks Get Channel Cipher Suites: pinning the suite saves ~3.5 s per call.
SETTINGS = {"ipmi_cipher_suite": 3}
WRONG_PASSWORD = "wrong-Pa55-zq8"  # IPMI passwords are 20 bytes at most


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, PeerHost]]:
    """Each peer once per module."""
    with (
        ipmi_peer(tmp_path_factory.mktemp("ipmi")) as ipmi,
        redfish_peer(tmp_path_factory.mktemp("redfish")) as redfish,
        ssh_peer(tmp_path_factory.mktemp("sshd")) as ssh,
    ):
        yield {"ipmi": ipmi, "redfish": redfish, "ssh": ssh}


async def _inventory(app: RunningApp, peers: dict[str, PeerHost]) -> dict[str, str]:
    """One sim cluster per peer (bare-metal kinds cannot make a cluster yet), each with its
    peer's host; the redfish one also with a BMC nobody answers for. Returns cluster ids."""
    await create_project(app.client, "ml")
    clusters: dict[str, str] = {}
    rows: list[dict[str, Any]] = []
    for kind, peer in peers.items():
        stored = await put_credential(
            app.client, peer.credential, secret=peer.secret,
            kind=peer.credential_kind, username=peer.username,
        )  # fmt: skip
        assert stored.status_code == 200, stored.text
        clusters[kind] = (await create_cluster(app.client, name=f"lab-{kind}", size=1))["id"]
        rows.append(peer.row(cluster=f"lab-{kind}"))
    rows.append(unreachable_redfish_row(cluster="lab-redfish", credential="redfish-bmc"))
    # The real BMC, opened with a wrong password: refused, and that password never shows.
    wrong = peers["ipmi"]
    stored = await put_credential(
        app.client, "ipmi-wrong", secret=WRONG_PASSWORD, username=wrong.username
    )
    assert stored.status_code == 200, stored.text
    rows.append(wrong.row(cluster="lab-ipmi", hostname="ipmi-wrongpw", credential="ipmi-wrong"))
    imported = await import_hosts(app.client, rows)
    assert imported.status_code == 200, imported.text
    return clusters


async def _check(client: httpx.AsyncClient, cluster_id: str, **body: Any) -> httpx.Response:
    return await client.post(f"/api/v1/clusters/{cluster_id}/providers/check", json=body)


async def test_each_peer_is_reached_and_an_unreachable_bmc_is_a_row(
    database_url: str,
    tmp_path: Path,
    peers: dict[str, PeerHost],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    async with keyed_app(database_url, tmp_path, **SETTINGS) as app:
        clusters = await _inventory(app, peers)
        mark = await _rows(app)
        answers: dict[str, dict[str, Any]] = {}
        for kind in ("ipmi", "redfish", "ssh"):
            response = await _check(app.client, clusters[kind], provider=kind)
            texts.append(response.text)
            assert response.status_code == 200, response.text
            answers[kind] = response.json()

        ipmi, refused = answers["ipmi"]["hosts"]
        assert answers["ipmi"]["provider"] == "ipmi"
        assert (ipmi["hostname"], ipmi["reachable"], ipmi["power"]) == ("ipmi-01", True, "on")
        assert ipmi["detail"] == "BMC answered: power on"
        assert (refused["hostname"], refused["reachable"]) == ("ipmi-wrongpw", False)
        assert refused["detail"].startswith("credentials refused"), refused["detail"]

        up, down = answers["redfish"]["hosts"]  # by hostname
        assert (up["hostname"], up["reachable"], up["power"]) == ("redfish-01", True, "on")
        assert up["detail"].startswith("Redfish 1.") and "power On" in up["detail"]
        assert (down["hostname"], down["reachable"], down["power"]) == (
            "redfish-down", False, "unknown",
        )  # fmt: skip
        assert "cannot reach the BMC" in down["detail"]

        ((ssh,),) = [answers["ssh"]["hosts"]]
        assert (ssh["hostname"], ssh["reachable"], ssh["power"]) == ("ssh-01", True, "on")
        assert ssh["detail"].startswith("boot id ")

        # Each host row names its inventory id; the check changed nothing but the audit log.
        listed = (await app.client.get("/api/v1/projects/ml/hosts")).json()
        ids = {h["hostname"]: h["id"] for h in listed}
        assert {ipmi["host_id"], up["host_id"], down["host_id"], ssh["host_id"]} == {
            ids["ipmi-01"], ids["redfish-01"], ids["redfish-down"], ids["ssh-01"],
        }  # fmt: skip
        assert {h["state"] for h in listed} == {"in_service"}
        events, audits = await _rows(app)
        assert events == mark[0]
        checks = [a for a in audits[len(mark[1]) :] if a.action == "providers.check"]
        assert [(a.detail["provider"], a.detail["unreachable"]) for a in checks] == [
            ("ipmi", 1), ("redfish", 1), ("ssh", 0),
        ]  # fmt: skip
        texts += [f"{a.action} {a.detail}" for a in audits]
    assert peers["ipmi"].peer.transitions() == []  # the BMC was asked to change nothing
    texts += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    texts.append(caplog.text)
    secrets = [s for peer in peers.values() for s in peer.secrets()] + [WRONG_PASSWORD]
    for secret in secrets:
        assert not any(secret in text for text in texts), f"a secret leaked: {secret[:4]}..."


async def test_what_the_check_refuses(
    database_url: str, tmp_path: Path, peers: dict[str, PeerHost]
) -> None:
    async with keyed_app(database_url, tmp_path, **SETTINGS) as app:
        clusters = await _inventory(app, peers)
        # The cluster's own provider is sim: it has no reach check.
        sim = await _check(app.client, clusters["ipmi"])
        assert sim.status_code == 422, sim.text
        error = error_of(sim)
        assert error["field"] == "provider" and "'sim' has no reach check" in error["message"]
        # AWS machines are a cluster's own instances: a sim cluster has none to check.
        aws = await _check(app.client, clusters["ipmi"], provider="aws")
        assert aws.status_code == 422 and "no aws configuration" in error_of(aws)["message"]
        bad = await _check(app.client, clusters["ipmi"], provider="pxe")
        assert bad.status_code == 422
        extra = await _check(app.client, clusters["ipmi"], provider="ipmi", hosts=["x"])
        assert extra.status_code == 422
        missing = await _check(app.client, "0" * 32, provider="ipmi")
        assert missing.status_code == 404
        # A host of another kind is a row saying so, never a call to the wrong BMC.
        wrong = await _check(app.client, clusters["ssh"], provider="redfish")
        assert wrong.status_code == 200
        ((row,),) = [wrong.json()["hosts"]]
        assert (
            not row["reachable"]
            and row["detail"] == "not checked: its bmc_type is ssh, not redfish"
        )
        # A cluster with no hosts: an empty answer.
        empty = await create_cluster(app.client, name="empty", size=1)
        none = await _check(app.client, empty["id"], provider="ssh")
        assert none.status_code == 200 and none.json()["hosts"] == []
        # A bare-metal cluster is checked as its own provider (its agents enroll).
        metal = await app.client.post(
            "/api/v1/clusters",
            json={"project": "ml", "name": "bm-ipmi", "size": 1, "provider": "ipmi"},
        )
        assert metal.status_code == 201, metal.text
        own = await _check(app.client, metal.json()["id"])
        assert own.status_code == 200 and own.json()["provider"] == "ipmi", own.text


async def _rows(app: RunningApp) -> tuple[int, list[AuditLogRow]]:
    async with app.ctx.db.session() as session:
        events = len((await session.scalars(select(EventRow))).all())
        audits = list(await session.scalars(select(AuditLogRow).order_by(AuditLogRow.ts)))
    return events, audits


def test_the_server_builds_the_bare_metal_drivers_without_loading_their_clients(
    tmp_path: Path,
) -> None:
    # ipmitool runs, and sushy and asyncssh load, on a driver's first call.
    code = (
        "import sys, pathlib\n"
        "from gpufleet.server.app import create_app\n"
        "from gpufleet.testing.app import make_settings\n"
        f"data = pathlib.Path({str(tmp_path)!r})\n"
        "app = create_app(make_settings(data_dir=data, database_url=f'sqlite+aiosqlite:///{data}/x.db'))\n"
        "assert sorted(app.state.ctx.drivers.providers) == ['ipmi', 'redfish', 'sim', 'ssh']\n"
        "loaded = [m for m in ('sushy', 'asyncssh', 'requests') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
