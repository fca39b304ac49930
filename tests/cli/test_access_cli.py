"""`gpufleet projects/users/tokens/volumes/audit` against a real server process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port, run_cli

pytestmark = pytest.mark.slow


@dataclass
class Server:
    url: str
    owner: str

    def ok(self, *args: str, token: str | None = None) -> str:
        out = run_cli(*args, url=self.url, token=token or self.owner)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        return out.stdout

    def json(self, *args: str, token: str | None = None) -> Any:
        return json.loads(self.ok(*args, "--output", "json", token=token))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("access-cli")
    port = free_port()
    token_file = tmp / "owner-token"
    env = fast_sim_server_env(data_dir=tmp / "data", port=port, token_file=token_file)
    process = ServerProcess(args=["server"], env=env, log_path=tmp / "server.log")
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(url)
        yield Server(url=url, owner=token_file.read_text().strip())
    finally:
        process.stop()


def test_owner_sets_up_a_project_and_its_admin_works_in_it(server: Server) -> None:
    server.ok("users", "create", "alice", "--unix-name", "alice", "--email", "a@example.com")
    server.ok("users", "create", "bob")
    server.ok("projects", "create", "ml", "--first-admin", "alice")
    created = server.json(
        "tokens", "create", "--user", "alice", "--project", "ml", "--role", "admin"
    )
    alice = created["token"]
    assert created["info"]["user_id"] != server.json("users", "list")[0]["id"]

    server.ok("projects", "add-member", "ml", "bob", token=alice)
    members = server.json("projects", "members", "ml", token=alice)
    assert [(m["user_name"], m["role"]) for m in members] == [("alice", "admin"), ("bob", "member")]
    last = run_cli("projects", "set-role", "ml", "alice", "member", url=server.url, token=alice)
    assert last.returncode != 0 and "at least one admin" in last.stderr

    server.ok("clusters", "create", "train", "--project", "ml", "--size", "1", token=alice)
    volume = server.json(
        "volumes", "create", "data", "--project", "ml", "--size-gb", "10",
        "--mount-path", "/data/d", token=alice,
    )  # fmt: skip
    attached = server.json("volumes", "attach", "data", "train", "--project", "ml", token=alice)
    assert attached["id"] == volume["id"] and len(attached["cluster_ids"]) == 1
    assert "/data/d" in server.ok("volumes", "list", "--project", "ml", token=alice)
    server.ok("volumes", "detach", "data", "train", "--project", "ml", token=alice)
    assert "deleted volume data" in server.ok("volumes", "delete", "data", "-p", "ml", token=alice)

    rows = server.json("audit", "list", "--project", "ml", "--action", "volume.", token=alice)
    assert [r["action"] for r in rows["items"]] == [
        "volume.delete", "volume.detach", "volume.attach", "volume.create",
    ]  # fmt: skip
    assert {r["actor"] for r in rows["items"]} == {"user:alice"}
    table = server.ok("audit", "list", "--project", "ml", "--limit", "5", token=alice)
    assert "volume.delete" in table and "ok" in table


def test_tokens_are_listed_and_revoked(server: Server) -> None:
    server.ok("projects", "create", "infra")
    made = server.json("tokens", "create", "--project", "infra", "--name", "ci")
    listed = server.json("tokens", "list")
    (ci,) = [t for t in listed if t["name"] == "ci"]
    assert made["token"] not in json.dumps(listed)
    assert "ci" in server.ok("tokens", "list", "--project", "infra")
    server.ok("tokens", "revoke", ci["id"])
    refused = run_cli("projects", "list", url=server.url, token=made["token"])
    assert refused.returncode != 0 and "revoked" in refused.stderr
    assert "revoked" in server.ok("tokens", "list", "--revoked")


def test_a_member_reads_but_does_not_change(server: Server) -> None:
    server.ok("users", "create", "carol")
    server.ok("projects", "create", "vision")
    server.ok("projects", "add-member", "vision", "carol")
    carol = server.json("tokens", "create", "--user", "carol", "--project", "vision")["token"]
    assert server.json("volumes", "list", "--project", "vision", token=carol) == []
    for args in (
        ("volumes", "create", "x", "-p", "vision", "--size-gb", "1", "--mount-path", "/x"),
        ("audit", "list", "--project", "vision"),
        ("users", "list"),
    ):
        out = run_cli(*args, url=server.url, token=carol)
        assert out.returncode != 0, args
        assert "forbidden" in out.stderr or "not allow" in out.stderr or "owner" in out.stderr
    server.ok("users", "set-unix-name", "carol", "carol_c")
    assert server.json("projects", "members", "vision", token=carol)[1]["unix_name"] == "carol_c"
