"""The gpufleet CLI against an httpx.MockTransport serving the server's response shapes.

Unit level: parsing, rendering, exit codes. The CLI builds its client only through
``gpufleet.cli.config.make_client``, which these tests replace.
"""

from __future__ import annotations

import json
import stat
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpufleet.cli import config
from gpufleet.cli.main import app
from gpufleet.client.api import ApiClient

URL = "http://gpufleet.test"
T0 = "2026-01-01T00:00:00Z"
PROJECT_ID = "0190a1b2-c3d4-7e5f-8a9b-000000000001"
CLUSTER_ID = "0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
NODE_ID = "0190a1b2-c3d4-7e5f-8a9b-00000000a001"

PROJECT = {"id": PROJECT_ID, "name": "ml", "description": "training", "created_at": T0}
CLUSTER = {
    "id": CLUSTER_ID,
    "project_id": PROJECT_ID,
    "name": "train-a",
    "scheduler": "sim",
    "provider": "sim",
    "gpu_model": "NVIDIA H100 80GB HBM3",
    "gpus_per_node": 8,
    "size": 2,
    "status": "degraded",
    "health": "degraded",
    "acceptance_tests": True,
    "startup_scripts": [],
    "autoscale_min": None,
    "autoscale_max": None,
    "labels": {"team": "ml"},
    "created_at": T0,
    "updated_at": T0,
}
COUNTS = {
    "total": 2,
    "by_state": {"in_service": 2},
    "by_health": {"healthy": 1, "unknown": 1},
    "gpus": 16,
}
GPU = {
    "id": "g0",
    "node_id": NODE_ID,
    "index": 0,
    "uuid": "GPU-5a1c0f3e-1111-2222-3333-444455556666",
    "serial": "1654922000001",
    "model": "NVIDIA H100 80GB HBM3",
    "health": "unhealthy",
    "utilization_pct": 97.0,
    "memory_used_mib": 40960.0,
    "memory_total_mib": 81559.0,
    "temperature_c": 71.0,
    "power_w": 650.0,
    "sm_clock_mhz": 1980.0,
    "ecc_sbe_volatile": 3,
    "ecc_dbe_volatile": 1,
    "ecc_sbe_aggregate": 3,
    "ecc_dbe_aggregate": 1,
    "sampled_at": T0,
}
NODE = {
    "id": NODE_ID,
    "cluster_id": CLUSTER_ID,
    "name": "node-1",
    "hostname": "gpu-001",
    "scheduler_name": "gpu-001",
    "serial": None,
    "provider_instance_id": "sim-1",
    "state": "in_service",
    "health": "unknown",
    "rack": "r1",
    "leaf_switch": None,
    "pdu": None,
    "expected_gpus": 8,
    "last_report_at": None,
    "last_report_seq": 0,
    "created_at": T0,
    "updated_at": T0,
}
EVENT = {
    "id": "e1",
    "ts": T0,
    "kind": "node.health",
    "message": "node-1 is unknown: no report for 60 s",
    "project_id": PROJECT_ID,
    "cluster_id": CLUSTER_ID,
    "node_id": NODE_ID,
    "actor": None,
    "data": {"from": "healthy", "to": "unknown"},
}
ME = {
    "user": {
        "id": "u1",
        "name": "ada",
        "email": "ada@example.com",
        "is_owner": False,
        "created_at": T0,
    },
    "memberships": [{"project_id": PROJECT_ID, "user_id": "u1", "role": "admin"}],
    "token": {"id": "t1", "project_id": None, "role": None},
}
TOKEN = {
    "token": "gft_secret_123",
    "info": {
        "id": "t1",
        "user_id": "u1",
        "name": "ci",
        "project_id": PROJECT_ID,
        "role": "member",
        "prefix": "gft_sec",
        "created_at": T0,
        "expires_at": None,
        "revoked_at": None,
        "last_used_at": None,
    },
}


def page(*items: dict[str, Any]) -> dict[str, Any]:
    return {"items": list(items), "next_cursor": None}


class FakeApi:
    """Routes by (method, path); ``errors`` forces a response for a path."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []
        self.creds: list[config.Credentials] = []
        self.errors: dict[str, httpx.Response] = {}
        self.routes: dict[tuple[str, str], Callable[[httpx.Request], Any]] = {
            ("GET", "/api/v1/me"): lambda _: ME,
            ("GET", "/api/v1/projects"): lambda _: page(PROJECT),
            ("POST", "/api/v1/projects"): lambda r: {**PROJECT, **json.loads(r.content)},
            ("GET", f"/api/v1/projects/{PROJECT_ID}"): lambda _: PROJECT,
            ("POST", "/api/v1/tokens"): lambda _: TOKEN,
            ("GET", "/api/v1/clusters"): lambda _: page(CLUSTER),
            ("POST", "/api/v1/clusters"): lambda _: {**CLUSTER, "status": "provisioning"},
            ("GET", f"/api/v1/clusters/{CLUSTER_ID}"): lambda _: {**CLUSTER, "nodes": COUNTS},
            ("DELETE", f"/api/v1/clusters/{CLUSTER_ID}"): lambda _: {
                **CLUSTER,
                "status": "deleting",
            },
            ("GET", f"/api/v1/clusters/{CLUSTER_ID}/status"): lambda _: {
                "id": CLUSTER_ID,
                "name": "train-a",
                "status": "degraded",
                "health": "degraded",
                "size": 2,
                "nodes": COUNTS,
            },
            ("GET", "/api/v1/nodes"): lambda _: page(NODE),
            ("GET", f"/api/v1/nodes/{NODE_ID}"): lambda _: {**NODE, "gpus": [GPU]},
            ("GET", "/api/v1/events"): lambda _: page(EVENT),
        }

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path in self.errors:
            return self.errors[request.url.path]
        route = self.routes.get((request.method, request.url.path))
        if route is None:
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "nope"}})
        return httpx.Response(200, json=route(request))

    def make_client(self, creds: config.Credentials) -> ApiClient:
        self.creds.append(creds)
        return ApiClient(
            base_url=creds.url, token=creds.token, transport=httpx.MockTransport(self.handle)
        )

    def last(self, method: str, path: str) -> httpx.Request:
        return [r for r in self.requests if (r.method, r.url.path) == (method, path)][-1]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("GPUFLEET_URL", raising=False)
    monkeypatch.delenv("GPUFLEET_TOKEN", raising=False)
    monkeypatch.setenv("COLUMNS", "200")  # rich would otherwise wrap at 80
    return tmp_path / "cfg"


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch, home: Path) -> FakeApi:
    fake = FakeApi()
    monkeypatch.setattr(config, "make_client", fake.make_client)
    return fake


@pytest.fixture
def cli(api: FakeApi) -> Callable[..., Any]:
    runner = CliRunner()
    env = {"GPUFLEET_URL": URL, "GPUFLEET_TOKEN": "tok-env"}

    def invoke(*args: str, **kwargs: Any) -> Any:
        return runner.invoke(app, list(args), env={**env, **kwargs.pop("env", {})}, **kwargs)

    return invoke


def test_login_saves_owner_only_credentials(api: FakeApi, home: Path) -> None:
    result = CliRunner().invoke(app, ["login", "--url", URL + "/", "--token", "tok-1"])
    assert result.exit_code == 0, result.output
    assert "ada" in result.stdout and "ml (admin)" in result.stdout
    path = home / "gpufleet" / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert json.loads(path.read_text()) == {"url": URL, "token": "tok-1"}
    assert api.last("GET", "/api/v1/me").headers["Authorization"] == "Bearer tok-1"

    # Later commands use the saved login.
    result = CliRunner().invoke(app, ["projects", "list"])
    assert result.exit_code == 0, result.output
    assert api.creds[-1] == config.Credentials(url=URL, token="tok-1")


def test_login_rejected_saves_nothing(api: FakeApi, home: Path) -> None:
    api.errors["/api/v1/me"] = httpx.Response(
        401, json={"error": {"code": "unauthorized", "message": "invalid token", "field": None}}
    )
    result = CliRunner().invoke(app, ["login", "--url", URL, "--token", "bad"])
    assert result.exit_code == 2
    assert "error: invalid token" in result.stderr
    assert not (home / "gpufleet" / "credentials.json").exists()


def test_env_overrides_saved_credentials(api: FakeApi, home: Path) -> None:
    config.save_credentials(config.Credentials(url=URL, token="tok-saved"))
    env = {"GPUFLEET_TOKEN": "tok-env"}
    assert CliRunner().invoke(app, ["projects", "list"], env=env).exit_code == 0
    assert api.creds[-1] == config.Credentials(url=URL, token="tok-env")


def test_saved_token_is_not_sent_to_another_url(api: FakeApi, home: Path) -> None:
    config.save_credentials(config.Credentials(url=URL, token="tok-saved"))
    result = CliRunner().invoke(app, ["projects", "list"], env={"GPUFLEET_URL": "http://evil"})
    assert result.exit_code == 2
    assert "no API token" in result.stderr
    assert api.creds == []


def test_no_credentials_is_exit_2(api: FakeApi, home: Path) -> None:
    result = CliRunner().invoke(app, ["clusters", "list"])
    assert result.exit_code == 2
    assert "gpufleet login" in result.stderr


def test_projects_list_json_is_the_api_page(cli: Callable[..., Any]) -> None:
    result = cli("projects", "list", "--output", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == page({**PROJECT, "created_at": "2026-01-01T00:00:00Z"})


def test_projects_create_and_show(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("projects", "create", "vision", "--description", "cv team", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(api.last("POST", "/api/v1/projects").content) == {
        "name": "vision",
        "description": "cv team",
    }
    result = cli("projects", "show", PROJECT_ID)
    assert result.exit_code == 0 and "training" in result.stdout


def test_clusters_list_table(cli: Callable[..., Any]) -> None:
    result = cli("clusters", "list")
    assert result.exit_code == 0, result.output
    header = result.stdout.splitlines()[0].split()
    assert header[:4] == ["NAME", "STATUS", "HEALTH", "SIZE"]
    assert "train-a" in result.stdout and "degraded" in result.stdout


def test_clusters_create_sends_labels_and_flags(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli(
        "clusters", "create", "train-a", "--project", "ml", "--size", "4",
        "--no-acceptance-tests", "--label", "team=ml", "--label", "tier=prod",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    body = json.loads(api.last("POST", "/api/v1/clusters").content)
    assert body["labels"] == {"team": "ml", "tier": "prod"}
    assert body["acceptance_tests"] is False and body["size"] == 4
    assert body["gpu_model"] == "NVIDIA H100 80GB HBM3" and body["gpus_per_node"] == 8
    assert "provisioning" in result.stdout


@pytest.mark.parametrize("label", ["novalue", "=x", "bad key=x"])
def test_bad_label_is_exit_2_and_sends_nothing(
    cli: Callable[..., Any], api: FakeApi, label: str
) -> None:
    result = cli("clusters", "create", "x", "--project", "ml", "--label", label)
    assert result.exit_code == 2
    assert "KEY=VALUE" in result.output
    assert api.requests == []


def test_cluster_show_by_name_fetches_counts(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("clusters", "show", "train-a", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nodes"] == COUNTS
    assert api.last("GET", "/api/v1/clusters").url.params["name"] == "train-a"

    table = cli("clusters", "show", "train-a")
    assert "unknown 1" in table.stdout and "healthy 1" in table.stdout


def test_cluster_status_and_delete(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("clusters", "status", CLUSTER_ID)
    assert result.exit_code == 0, result.output
    assert "in_service 2" in result.stdout

    refused = cli("clusters", "delete", CLUSTER_ID, input="n\n")
    assert refused.exit_code == 1
    assert not [r for r in api.requests if r.method == "DELETE"]

    result = cli("clusters", "delete", CLUSTER_ID, "--yes")
    assert result.exit_code == 0, result.output
    assert "deleting" in result.stdout


def test_api_error_4xx_is_exit_2_with_field(cli: Callable[..., Any], api: FakeApi) -> None:
    api.errors["/api/v1/clusters"] = httpx.Response(
        409,
        json={"error": {"code": "conflict", "message": "name is taken", "field": "name"}},
    )
    result = cli("clusters", "create", "train-a", "--project", "ml")
    assert result.exit_code == 2
    assert "error: name is taken (field: name)" in result.stderr
    assert result.stdout == ""


def test_api_error_5xx_is_exit_1(cli: Callable[..., Any], api: FakeApi) -> None:
    api.errors["/api/v1/projects"] = httpx.Response(
        500, json={"error": {"code": "internal", "message": "database is locked", "field": None}}
    )
    result = cli("projects", "list")
    assert result.exit_code == 1
    assert "error: database is locked" in result.stderr


def test_unreachable_server_is_exit_1(
    cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    def make(creds: config.Credentials) -> ApiClient:
        return ApiClient(
            base_url=creds.url, token=creds.token, transport=httpx.MockTransport(refuse)
        )

    monkeypatch.setattr(config, "make_client", make)
    result = cli("projects", "list")
    assert result.exit_code == 1
    assert "cannot reach the gpufleet server at http://gpufleet.test" in result.stderr


def test_tokens_create_prints_secret_once(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("tokens", "create", "--project", "ml", "--role", "member", "--name", "ci")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("gft_secret_123") == 1
    assert json.loads(api.last("POST", "/api/v1/tokens").content) == {
        "name": "ci",
        "project": "ml",
        "role": "member",
        "expires_in_days": None,
    }
    as_json = cli("tokens", "create", "--name", "ci", "-o", "json")
    assert json.loads(as_json.stdout)["token"] == "gft_secret_123"


def test_unknown_role_is_exit_2(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("tokens", "create", "--project", "ml", "--role", "root")
    assert result.exit_code == 2
    assert api.requests == []


def test_nodes_list_resolves_cluster_name(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("nodes", "list", "--cluster", "train-a", "--health", "unknown", "--limit", "5")
    assert result.exit_code == 0, result.output
    params = api.last("GET", "/api/v1/nodes").url.params
    assert params["cluster"] == CLUSTER_ID and params["health"] == "unknown"
    assert params["limit"] == "5"
    row = next(line for line in result.stdout.splitlines() if "node-1" in line)
    assert "unknown" in row and "healthy" not in row and "never" in row


def test_node_show_gpu_table(cli: Callable[..., Any]) -> None:
    result = cli("nodes", "show", "node-1", "--cluster", "train-a")
    assert result.exit_code == 0, result.output
    out = result.stdout
    for column in ("IDX", "UUID", "UTIL %", "MEM GiB", "TEMP °C", "POWER W", "SM MHz"):
        assert column in out
    row = next(line for line in out.splitlines() if GPU["uuid"] in line)
    assert row.split()[2:6] == ["97", "40.0/79.6", "71", "650"]
    assert "3/1" in row and "unhealthy" in row and "ago" in row

    as_json = cli("nodes", "show", NODE_ID, "-o", "json")
    assert json.loads(as_json.stdout)["gpus"][0]["uuid"] == GPU["uuid"]


def test_node_show_by_a_name_unique_without_cluster(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("nodes", "show", "node-1")
    assert result.exit_code == 0, result.output
    assert "cluster" not in api.last("GET", "/api/v1/nodes").url.params

    twin = {**NODE, "id": "0190a1b2-c3d4-7e5f-8a9b-00000000a002", "cluster_id": "c2"}
    api.routes[("GET", "/api/v1/nodes")] = lambda _: page(NODE, twin)
    ambiguous = cli("nodes", "show", "node-1")
    assert ambiguous.exit_code == 2
    said = " ".join(ambiguous.stderr.split())
    assert "2 nodes are named 'node-1'" in said and "--cluster" in said
    assert f"node-1 in cluster train-a ({NODE_ID})" in said and str(twin["id"]) in said


def test_events_since_and_table(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("events", "--cluster", CLUSTER_ID, "--kind", "node.health", "--since", "2h")
    assert result.exit_code == 0, result.output
    params = api.last("GET", "/api/v1/events").url.params
    assert params["cluster"] == CLUSTER_ID and params["kind"] == "node.health"
    assert params["since"].endswith("+00:00") and params["limit"] == "50"
    assert "node-1" in result.stdout and "no report for 60 s" in result.stdout

    iso = cli("events", "--since", "2026-01-01T00:00:00", "-o", "json")
    assert api.last("GET", "/api/v1/events").url.params["since"] == "2026-01-01T00:00:00+00:00"
    assert json.loads(iso.stdout)["items"][0]["data"] == {"from": "healthy", "to": "unknown"}


def test_bad_since_is_exit_2(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("events", "--since", "yesterday-ish")
    assert result.exit_code == 2
    assert "ISO 8601" in result.output
    assert api.requests == []


def test_server_and_demo_call_the_server_package(
    monkeypatch: pytest.MonkeyPatch, home: Path, tmp_path: Path
) -> None:
    calls: list[tuple[str, Any]] = []
    fake = types.ModuleType("gpufleet.server.main")
    fake.run_server = lambda settings: calls.append(("server", settings))  # type: ignore[attr-defined]
    fake.run_demo = lambda **kw: calls.append(("demo", kw))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpufleet.server.main", fake)
    # `from gpufleet.server import main` reads the package's attribute first: once another
    # test in this process imported the real module, only this replaces it.
    import gpufleet.server

    monkeypatch.setattr(gpufleet.server, "main", fake, raising=False)

    result = CliRunner().invoke(app, ["server", "--port", "9090", "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    kind, settings = calls[-1]
    assert kind == "server" and settings.port == 9090 and settings.data_dir == tmp_path

    result = CliRunner().invoke(app, ["demo", "--port", "8181"])
    assert result.exit_code == 0, result.output
    assert calls[-1] == ("demo", {"port": 8181, "data_dir": None, "slurm": False})


def test_a_span_too_long_is_exit_2_not_a_traceback(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("events", "--since", "99999999999999d")
    assert result.exit_code == 2, result.output
    assert "before the year 1" in result.output and "Traceback" not in result.output
    assert api.requests == []


def test_events_take_a_node_by_name_and_show_names(cli: Callable[..., Any], api: FakeApi) -> None:
    result = cli("events", "--cluster", CLUSTER_ID, "--node", "node-1")
    assert result.exit_code == 0, result.output
    assert api.last("GET", "/api/v1/events").url.params["node"] == NODE_ID
    assert "node-1" in result.stdout
    # Without --cluster the table still names the node (looked up by its id).
    plain_run = cli("events", "--kind", "node.health")
    assert plain_run.exit_code == 0, plain_run.output
    assert "node-1" in plain_run.stdout and NODE_ID not in plain_run.stdout
    # A name unique among the caller's nodes needs no --cluster.
    by_name = cli("events", "--node", "node-1")
    assert by_name.exit_code == 0, by_name.output
    assert api.last("GET", "/api/v1/events").url.params["node"] == NODE_ID


@pytest.mark.parametrize(
    ("name", "kind"),
    [("dcgmi", "dcgm-diag"), ("all_reduce_perf", "nccl"), ("alltoall_perf", "nccl"),
     ("ib_write_bw", "ib-write-bw"), ("gpu_burn", "gpu-burn"), ("NCCL", "nccl")],
)  # fmt: skip
def test_checks_parse_takes_the_tools_own_names(
    cli: Callable[..., Any], name: str, kind: str, tmp_path: Path
) -> None:
    saved = tmp_path / "out.txt"
    saved.write_text("nothing a tool wrote\n")
    result = cli("checks", "parse", name, str(saved), "-o", "json")
    assert json.loads(result.stdout)["kind"] == kind, result.output


def test_checks_parse_an_unknown_tool_is_exit_2(cli: Callable[..., Any], tmp_path: Path) -> None:
    result = cli("checks", "parse", "nvbandwidth", str(tmp_path / "x"))
    assert result.exit_code == 2 and "all_reduce_perf" in result.output


@pytest.mark.parametrize(
    ("args", "path", "empty"),
    [
        (("nodes", "list"), "/api/v1/nodes", "no nodes"),
        (("events",), "/api/v1/events", "no events"),
        (("findings",), "/api/v1/findings", "no findings"),
        (("projects", "list"), "/api/v1/projects", "no projects"),
        (("audit", "list"), "/api/v1/audit", "no audit entries"),
        (("clusters", "list"), "/api/v1/clusters", "no clusters"),
        (("repairs", "list"), "/api/v1/repairs", "no repairs"),
    ],
)
def test_an_empty_list_says_so(
    cli: Callable[..., Any], api: FakeApi, args: tuple[str, ...], path: str, empty: str
) -> None:
    """A table with no rows is followed by what it would have listed (kubectl's "No
    resources found"), so an empty answer does not read as a cut-off one; JSON stays the
    API's page."""
    api.routes[("GET", path)] = lambda _: page()
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1] == empty
    as_json = cli(*args, "-o", "json")
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)["items"] == []
