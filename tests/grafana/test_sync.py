"""``gpufleet grafana sync`` against the Grafana STAND-IN (gpufleet.testing.grafana_standin):
no Grafana server runs here, so these prove the calls match the documented API shapes
as the stand-in checks them, not that a real Grafana accepts them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpufleet.dashboards.export import DASHBOARDS, render
from gpufleet.grafana.client import GrafanaClient, GrafanaError
from gpufleet.grafana.sync import (
    DATASOURCE_UID,
    FOLDER_UID,
    Member,
    ProjectSpec,
    org_name,
    sync_project,
)
from gpufleet.testing.grafana_standin import GrafanaStandIn

PROXY = "https://fleet.example/api/v1/projects/ml/prometheus"
ALICE = Member(login="alice", email="alice@example.com", name="Alice", role="admin")
BOB = Member(login="bob", email="bob@example.com", name="Bob", role="member")


@pytest.fixture
def standin() -> GrafanaStandIn:
    return GrafanaStandIn(admin_user="admin", admin_password="pw")


@pytest.fixture
def grafana(standin: GrafanaStandIn) -> Iterator[GrafanaClient]:
    client = GrafanaClient(
        "http://grafana.test", user="admin", password="pw", transport=standin.transport()
    )
    yield client
    client.close()


@pytest.fixture(scope="module")
def dashboards() -> list[dict[str, Any]]:
    return [render(spec) for spec in DASHBOARDS]


class Tokens:
    def __init__(self) -> None:
        self.made: list[str] = []

    def __call__(self, project: str) -> str:
        self.made.append(project)
        return f"gf-token-{project}-{len(self.made)}"


def _sync(
    grafana: GrafanaClient, dashboards: list[dict[str, Any]], tokens: Tokens, *members: Member
) -> list[str]:
    spec = ProjectSpec(name="ml", members=members, proxy_url=PROXY)
    return sync_project(grafana, spec, dashboards=dashboards, new_token=tokens).changes


def test_a_sync_provisions_the_project(
    standin: GrafanaStandIn, grafana: GrafanaClient, dashboards: list[dict[str, Any]]
) -> None:
    tokens = Tokens()
    changes = _sync(grafana, dashboards, tokens, ALICE, BOB)
    org = standin.org_named(org_name("ml"))
    assert org.folders[FOLDER_UID]["title"] == "ml (gpufleet)"
    ds = org.datasources[DATASOURCE_UID]
    assert (ds["type"], ds["url"], ds["access"], ds["isDefault"]) == (
        "prometheus",
        PROXY,
        "proxy",
        True,
    )
    assert ds["jsonData"]["httpHeaderName1"] == "Authorization"
    assert ds["secureJsonData"] == {"httpHeaderValue1": "Bearer gf-token-ml-1"}
    assert not any("gf-token" in c for c in changes)  # the report never shows the token
    roles = {standin.login_of(uid): role for uid, role in org.members.items()}
    assert roles == {"admin": "Admin", "alice": "Admin", "bob": "Viewer"}
    assert set(org.dashboards) == {d["uid"] for d in dashboards}
    assert all(d["folderUid"] == FOLDER_UID for d in org.dashboards.values())


def test_a_second_sync_changes_nothing(
    standin: GrafanaStandIn, grafana: GrafanaClient, dashboards: list[dict[str, Any]]
) -> None:
    tokens = Tokens()
    _sync(grafana, dashboards, tokens, ALICE, BOB)
    writes = len(standin.writes)
    assert _sync(grafana, dashboards, tokens, ALICE, BOB) == []
    assert len(standin.writes) == writes
    assert tokens.made == ["ml"]  # no second token


def test_a_sync_repairs_what_was_deleted_or_changed(
    standin: GrafanaStandIn, grafana: GrafanaClient, dashboards: list[dict[str, Any]]
) -> None:
    tokens = Tokens()
    _sync(grafana, dashboards, tokens, ALICE, BOB)
    org = standin.org_named(org_name("ml"))
    first = dashboards[0]["uid"]
    del org.folders[FOLDER_UID]
    del org.datasources[DATASOURCE_UID]
    del org.dashboards[first]
    org.dashboards[dashboards[1]["uid"]]["dashboard"]["title"] = "edited by hand"
    changes = _sync(grafana, dashboards, tokens, ALICE, BOB)
    assert changes == [
        "created folder",
        "created data source",
        f"pushed dashboard {first}",
        f"pushed dashboard {dashboards[1]['uid']}",
    ]
    assert org.datasources[DATASOURCE_UID]["secureJsonData"] == {
        "httpHeaderValue1": "Bearer gf-token-ml-2"
    }
    assert org.dashboards[dashboards[1]["uid"]]["dashboard"]["title"] == dashboards[1]["title"]
    assert _sync(grafana, dashboards, tokens, ALICE, BOB) == []


def test_roles_follow_the_project(
    standin: GrafanaStandIn, grafana: GrafanaClient, dashboards: list[dict[str, Any]]
) -> None:
    tokens = Tokens()
    _sync(grafana, dashboards, tokens, ALICE, BOB)
    promoted = Member(login="bob", email="bob@example.com", name="Bob", role="admin")
    assert _sync(grafana, dashboards, tokens, promoted) == ["made bob Admin", "removed alice"]
    org = standin.org_named(org_name("ml"))
    roles = {standin.login_of(uid): role for uid, role in org.members.items()}
    assert roles == {"admin": "Admin", "bob": "Admin"}  # alice left the project: no role


def test_the_standin_rejects_what_grafana_would(standin: GrafanaStandIn) -> None:
    wrong = GrafanaClient(
        "http://grafana.test", user="admin", password="nope", transport=standin.transport()
    )
    with pytest.raises(GrafanaError, match="401"):
        wrong.create_org("x")
    good = GrafanaClient(
        "http://grafana.test", user="admin", password="pw", transport=standin.transport()
    )
    org_id = good.create_org("x")
    with pytest.raises(GrafanaError, match="unknown field"):
        good.create_datasource(
            org_id, {"name": "d", "type": "prometheus", "access": "proxy", "secret": "x"}
        )
    with pytest.raises(GrafanaError, match="invalid role"):
        good.add_org_user(org_id, login_or_email="admin", role="Owner")
    with pytest.raises(GrafanaError, match="X-Grafana-Org-Id"):
        good._call("GET", f"/api/folders/{FOLDER_UID}")
