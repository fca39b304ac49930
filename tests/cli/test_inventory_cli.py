"""`gpufleet credentials` and `gpufleet hosts` against a real server process with a secret
key, and `gpufleet rotate-secret-key` on its store."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port, run_cli

pytestmark = pytest.mark.slow

KEY_A = base64.urlsafe_b64encode(bytes(range(32))).decode()
KEY_B = base64.urlsafe_b64encode(bytes(range(50, 82))).decode()
SECRET = "cli-canary-5d2e-bmc-password"

YAML = """\
- hostname: gpu-001
  bmc_type: redfish
  bmc_address: https://10.0.0.1
  system_id: /redfish/v1/Systems/1
  credential: bmc
  cluster: train
  rack: r1
- hostname: spare-001
  bmc_type: ipmi
  bmc_address: 10.0.0.2
  port: 623
  credential: bmc
  cluster: train
  role: spare
"""

CSV = """\
hostname,bmc_type,bmc_address,port,credential,cluster,rack,leaf_switch,pdu,role
gpu-002,ipmi,10.0.0.3,623,bmc,train,r2,leaf-1,pdu-1,member
gpu-003,ipmi,10.0.0.4,,bmc,train,r2,leaf-1,,spare
"""


def _flat(text: str) -> str:
    """The CLI wraps its messages at the pipe's width."""
    return " ".join(text.split())


@dataclass
class Server:
    url: str
    owner: str
    env: dict[str, str]
    tmp: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, url=self.url, token=self.owner)

    def ok(self, *args: str) -> str:
        out = self.run(*args)
        assert out.returncode == 0, (args, out.stdout, out.stderr)
        assert SECRET not in out.stdout + out.stderr
        return out.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--output", "json"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("inventory-cli")
    port = free_port()
    token_file = tmp / "owner-token"
    env = fast_sim_server_env(data_dir=tmp / "data", port=port, token_file=token_file)
    env["GPUFLEET_SECRET_KEY"] = KEY_A
    process = ServerProcess(args=["server"], env=env, log_path=tmp / "server.log")
    process.start()
    try:
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(url)
        yield Server(url=url, owner=token_file.read_text().strip(), env=env, tmp=tmp)
    finally:
        process.stop()
        assert SECRET not in (tmp / "server.log").read_text()


def test_credentials_and_hosts_from_yaml_and_csv(server: Server) -> None:
    server.ok("projects", "create", "ml")
    server.ok("clusters", "create", "train", "--project", "ml", "--size", "1")
    secret_file = server.tmp / "bmc-password"
    secret_file.write_text(SECRET + "\n")
    stored = server.json(
        "credentials", "set", "bmc", "-p", "ml", "--kind", "bmc_password", "--username", "root",
        "--secret-file", str(secret_file),
    )  # fmt: skip
    assert stored["name"] == "bmc" and "secret" not in stored
    assert "bmc_password" in server.ok("credentials", "list", "-p", "ml")
    no_file = server.run("credentials", "set", "x", "-p", "ml", "--kind", "ssh_key",
                         "--secret-file", str(server.tmp / "missing"))  # fmt: skip
    assert no_file.returncode == 2 and "cannot read" in _flat(no_file.stderr)

    yaml_file = server.tmp / "hosts.yaml"
    yaml_file.write_text(YAML)
    csv_file = server.tmp / "hosts.csv"
    csv_file.write_text(CSV)
    assert "2 created" in server.ok("hosts", "import", str(yaml_file), "-p", "ml")
    assert "2 created" in server.ok("hosts", "import", str(csv_file), "-p", "ml")
    assert "2 unchanged" in server.ok("hosts", "import", str(csv_file), "-p", "ml")
    hosts = server.json("hosts", "list", "-p", "ml", "--cluster", "train")
    assert [(h["hostname"], h["state"]) for h in hosts] == [
        ("gpu-001", "in_service"), ("gpu-002", "in_service"), ("gpu-003", "spare"),
        ("spare-001", "spare"),
    ]  # fmt: skip
    shown = server.json("hosts", "show", "gpu-002", "-p", "ml")
    assert (shown["port"], shown["leaf_switch"], shown["credential"]) == (623, "leaf-1", "bmc")
    assert "spare-001" in server.ok("hosts", "list", "-p", "ml")

    moved = server.json(
        "hosts", "set-state", "gpu-003", "out_of_service", "-p", "ml", "--reason", "bad PSU"
    )
    assert moved["state"] == "out_of_service"
    claimed = server.run("hosts", "set-state", "gpu-003", "claimed", "-p", "ml")
    assert claimed.returncode == 2 and "only by a failover" in _flat(claimed.stderr)

    in_use = server.run("credentials", "delete", "bmc", "-p", "ml")
    assert in_use.returncode == 2 and "gpu-001" in _flat(in_use.stderr)


@pytest.mark.parametrize(
    ("name", "content", "said"),
    [
        ("bad.csv", "hostname,bmc_type,bmc_address\nok-1,ipmi,10.0.0.1\nbad-2,ilo,10.0.0.2\n",
         "row 2 (bad-2): bmc_type"),
        ("bad.yaml", "- hostname: ok-1\n  bmc_type: ipmi\n  bmc_address: 10.0.0.1\n"
         "- hostname: bad-2\n  bmc_type: ipmi\n", "row 2 (bad-2): bmc_address"),
        ("bad.yaml", "- hostname: ok-9\n  bmc_type: ipmi\n  bmc_address: 10.0.0.1\n"
         "  credential: nope\n", "row 1 (ok-9): credential"),
        ("bad.yaml", "- [unclosed\n", "not valid YAML"),
    ],
)  # fmt: skip
def test_a_bad_inventory_file_exits_2_naming_the_row_and_writes_nothing(
    server: Server, name: str, content: str, said: str
) -> None:
    server.run("projects", "create", "bad")  # once per server: later tries are refused
    path = server.tmp / name
    path.write_text(content)
    out = server.run("hosts", "import", str(path), "-p", "bad")
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert said in _flat(out.stderr), out.stderr
    assert server.json("hosts", "list", "-p", "bad") == []


def test_rotate_secret_key_reencrypts_every_credential(server: Server) -> None:
    server.ok("projects", "create", "rot")
    secret_file = server.tmp / "rot-secret"
    secret_file.write_text(SECRET)
    server.ok("credentials", "set", "k", "-p", "rot", "--kind", "ssh_key",
              "--secret-file", str(secret_file))  # fmt: skip
    env = {**os.environ, **server.env, "GPUFLEET_SECRET_KEY": KEY_B,
           "GPUFLEET_PREVIOUS_SECRET_KEYS": json.dumps([KEY_A])}  # fmt: skip
    command = [sys.executable, "-c", "from gpufleet.cli.main import run; run()"]
    out = subprocess.run(
        [*command, "rotate-secret-key"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "re-encrypted" in out.stdout and "credential(s) under key k-" in out.stdout
    env.pop("GPUFLEET_PREVIOUS_SECRET_KEYS")
    env["GPUFLEET_SECRET_KEY"] = base64.urlsafe_b64encode(bytes(32)).decode()
    wrong = subprocess.run(
        [*command, "rotate-secret-key"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert wrong.returncode == 2 and "which this server does not have" in _flat(wrong.stderr)
    assert SECRET not in wrong.stdout + wrong.stderr


def test_a_secret_comes_from_stdin_and_never_from_argv(server: Server) -> None:
    server.run("projects", "create", "stdin")  # once per server
    env = {**os.environ, "GPUFLEET_URL": server.url, "GPUFLEET_TOKEN": server.owner}
    env.pop("COLUMNS", None)
    command = [sys.executable, "-c", "from gpufleet.cli.main import run; run()"]
    piped = subprocess.run(
        [*command, "credentials", "set", "piped", "-p", "stdin", "--kind", "aws_key",
         "--output", "json"],
        input="AKIAEXAMPLE:" + SECRET + "\n", env=env, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert json.loads(piped.stdout)["kind"] == "aws_key" and SECRET not in piped.stdout
    argv = subprocess.run(
        [*command, "credentials", "set", "argv", "-p", "stdin", "--kind", "ssh_key",
         "--secret", SECRET],
        input="", env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert argv.returncode == 2  # no such option: a secret on the command line is refused
    names = [c["name"] for c in server.json("credentials", "list", "-p", "stdin")]
    assert names == ["piped"]
