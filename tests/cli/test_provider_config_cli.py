"""`gpufleet clusters provider-config show|set`, `clusters create --provider aws
--provider-config`, and `gpufleet providers check` of an aws cluster, against a real
server process whose provisioning loop launches the cluster's machine in moto's server
mode (tests/providers/aws/moto_lab.py). The machine never boots an agent here (that is
tests/server/test_aws_clusters.py): the check reaches the instance through EC2."""

from __future__ import annotations

import base64
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpufleet.client.api import ApiClient
from gpufleet.core.inventory import CredentialKind
from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port, run_cli
from providers.aws.moto_lab import GROUP, REGION, TEMPLATE, Aws, admin_clients, moto_server, seed

pytestmark = pytest.mark.slow

KEY = base64.urlsafe_b64encode(bytes(range(9, 41))).decode()
ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYcli42"  # made up; must never show


def _flat(text: str) -> str:
    return " ".join(text.split())


@dataclass
class Lab:
    url: str
    owner: str
    tmp: Path
    aws: Aws

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = run_cli(*args, url=self.url, token=self.owner)
        print(f"$ gpufleet {' '.join(args)}  (exit {out.returncode})")
        print(out.stdout + out.stderr)
        assert SECRET_KEY not in out.stdout + out.stderr
        assert ACCESS_KEY not in out.stdout + out.stderr
        return out

    def file(self, name: str, text: str) -> str:
        path = self.tmp / name
        path.write_text(text)
        return str(path)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("provider-config-cli")
    port = free_port()
    token_file = tmp / "owner-token"
    env = fast_sim_server_env(data_dir=tmp / "data", port=port, token_file=token_file)
    env["GPUFLEET_SECRET_KEY"] = KEY
    process = ServerProcess(args=["server"], env=env, log_path=tmp / "server.log")
    with moto_server() as endpoint:
        ec2, asg = admin_clients(endpoint)
        aws = seed(endpoint, ec2, asg, desired=0)
        process.start()
        try:
            url = f"http://127.0.0.1:{port}"
            process.wait_ready(url)
            owner = token_file.read_text().strip()
            with ApiClient(base_url=url, token=owner) as client:
                client.create_project("ml")
                client.put_credential(
                    "ml", "aws-lab", kind=CredentialKind.AWS_KEY, username=ACCESS_KEY,
                    secret=SECRET_KEY,
                )  # fmt: skip
                client.put_credential(
                    "ml", "bmc", kind=CredentialKind.BMC_PASSWORD, username="root",
                    secret="Pa55-bmc-cli",
                )  # fmt: skip
            yield Lab(url=url, owner=owner, tmp=tmp, aws=aws)
        finally:
            process.stop()
    log = (tmp / "server.log").read_text()
    assert SECRET_KEY not in log


def _config(endpoint: str, **changes: Any) -> str:
    values: dict[str, Any] = {
        "region": REGION, "endpoint_url": endpoint, "credential": "aws-lab",
        "auto_scaling_group": GROUP, "launch_template_name": TEMPLATE,
        "launch_template_version": "$Latest", "tags": {"team": "ml"}, **changes,
    }  # fmt: skip
    return json.dumps(values)  # JSON is YAML


def test_create_show_set_and_check_an_aws_cluster(lab: Lab) -> None:
    config = lab.file("aws.yaml", _config(lab.aws.endpoint))
    created = lab.run(
        "clusters", "create", "cloud", "-p", "ml", "--size", "1", "--provider", "aws",
        "--provider-config", config, "--no-acceptance-tests",
    )  # fmt: skip
    assert created.returncode == 0

    shown = lab.run("clusters", "provider-config", "show", "cloud", "-p", "ml")
    assert shown.returncode == 0
    text = _flat(shown.stdout)
    assert "provider aws" in text and "credential aws-lab" in text
    assert f"auto_scaling_group {GROUP}" in text and "tags team=ml" in text

    changed = lab.file("changed.yaml", "region: us-east-1\ncredential: aws-lab\n"
                       f"endpoint_url: {lab.aws.endpoint}\nauto_scaling_group: {GROUP}\n"
                       f"launch_template_name: {TEMPLATE}\nlaunch_template_version: $Latest\n"
                       "tags:\n  team: infra\n")  # fmt: skip
    set_ = lab.run(
        "clusters", "provider-config", "set", "cloud", "-p", "ml", "--file", changed,
        "--reason", "infra owns it", "-o", "json",
    )  # fmt: skip
    assert set_.returncode == 0
    assert json.loads(set_.stdout)["config"]["tags"] == {"team": "infra"}

    # The provisioning loop launched the machine in moto; the check reaches it there.
    # (A bounded wait for the server's own loop, not a timing assertion.)
    deadline = time.monotonic() + 60
    while not lab.aws.members() and time.monotonic() < deadline:
        time.sleep(0.3)
    [instance_id] = lab.aws.members()
    checked = lab.run("providers", "check", "cloud", "-p", "ml")
    assert checked.returncode == 0
    line = _flat(checked.stdout)
    assert f"cloud-000 {instance_id} yes on" in line, line
    assert "aws: 1 of 1 host(s) reachable" in line


def test_bad_input_exits_2_naming_the_field(lab: Lab) -> None:
    with ApiClient(base_url=lab.url, token=lab.owner) as client:
        client.create_cluster(project="ml", name="plain", size=1, acceptance_tests=False)
    not_a_mapping = lab.file("list.yaml", "- region\n- us-east-1\n")
    out = lab.run("clusters", "provider-config", "set", "plain", "-p", "ml", "-f", not_a_mapping)
    assert out.returncode == 2 and "expected a mapping" in _flat(out.stderr)
    unknown = lab.file("unknown.yaml", "region: us-east-1\n")
    out = lab.run("clusters", "provider-config", "set", "plain", "-p", "ml", "-f", unknown)
    assert out.returncode == 2
    assert "provider_config.region: unknown field" in _flat(out.stderr)
    wrong_kind = lab.file("bmc.yaml", _config(lab.aws.endpoint, credential="bmc"))
    out = lab.run(
        "clusters", "create", "cloud2", "-p", "ml", "--size", "1", "--provider", "aws",
        "--provider-config", wrong_kind, "--no-acceptance-tests",
    )  # fmt: skip
    assert out.returncode == 2 and "not an aws_key" in _flat(out.stderr)
