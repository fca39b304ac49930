"""`gpufleet providers check CLUSTER` against a real server process and the real peers
(ipmi_sim, the sushy emulator, sshd), their hosts and sealed credentials in the inventory."""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpufleet.client.api import ApiClient
from gpufleet.core.inventory import CredentialKind, HostSpec
from gpufleet.testing.processes import ServerProcess, fast_sim_server_env, free_port, run_cli
from providers.peers import PeerHost, ipmi_peer, redfish_peer, ssh_peer, unreachable_redfish_row

pytestmark = pytest.mark.slow

KEY = base64.urlsafe_b64encode(bytes(range(7, 39))).decode()


def _flat(text: str) -> str:
    return " ".join(text.split())


@dataclass
class Lab:
    url: str
    owner: str
    log: Path
    peers: dict[str, PeerHost]

    def check(self, *args: str) -> subprocess.CompletedProcess[str]:
        out = run_cli("providers", "check", *args, "-p", "ml", url=self.url, token=self.owner)
        print(f"$ gpufleet providers check {' '.join(args)} -p ml  (exit {out.returncode})")
        print(out.stdout + out.stderr)
        for peer in self.peers.values():
            for secret in peer.secrets():
                assert secret not in out.stdout + out.stderr
        return out


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    tmp = tmp_path_factory.mktemp("providers-cli")
    port = free_port()
    token_file = tmp / "owner-token"
    env = fast_sim_server_env(data_dir=tmp / "data", port=port, token_file=token_file)
    env["GPUFLEET_SECRET_KEY"] = KEY
    env["GPUFLEET_IPMI_CIPHER_SUITE"] = "3"  # ipmi_sim cannot list its cipher suites
    process = ServerProcess(args=["server"], env=env, log_path=tmp / "server.log")
    with (
        ipmi_peer(tmp / "ipmi") as ipmi,
        redfish_peer(tmp / "redfish") as redfish,
        ssh_peer(tmp / "sshd") as ssh,
    ):
        peers = {"ipmi": ipmi, "redfish": redfish, "ssh": ssh}
        process.start()
        try:
            url = f"http://127.0.0.1:{port}"
            process.wait_ready(url)
            owner = token_file.read_text().strip()
            _inventory(ApiClient(base_url=url, token=owner), peers)
            yield Lab(url=url, owner=owner, log=tmp / "server.log", peers=peers)
        finally:
            process.stop()
    log = (tmp / "server.log").read_text()
    for peer in peers.values():
        for secret in peer.secrets():
            assert secret not in log, f"{peer.hostname}: secret in the server log"


def _inventory(client: ApiClient, peers: dict[str, PeerHost]) -> None:
    """Set up through the API (the CLI's own import and credentials commands have their
    tests): one sim cluster per peer, the redfish one with a BMC that is down."""
    with client:
        client.create_project("ml")
        rows: list[HostSpec] = []
        for kind, peer in peers.items():
            client.put_credential(
                "ml", peer.credential, kind=CredentialKind(peer.credential_kind),
                username=peer.username, secret=peer.secret,
            )  # fmt: skip
            client.create_cluster(project="ml", name=f"lab-{kind}", size=1, acceptance_tests=False)
            rows.append(HostSpec.model_validate(peer.row(cluster=f"lab-{kind}")))
        down = unreachable_redfish_row(cluster="lab-redfish", credential="redfish-bmc")
        rows.append(HostSpec.model_validate(down))
        client.import_hosts("ml", rows)


def test_each_peer_reachable_exits_0(lab: Lab) -> None:
    ipmi = lab.check("lab-ipmi", "--provider", "ipmi")
    assert ipmi.returncode == 0, ipmi.stderr
    assert "ipmi-01" in ipmi.stdout and "BMC answered: power on" in ipmi.stdout
    assert "ipmi: 1 of 1 host(s) reachable" in _flat(ipmi.stdout)
    ssh = lab.check("lab-ssh", "--provider", "ssh")
    assert ssh.returncode == 0, ssh.stderr
    (row,) = [line for line in ssh.stdout.splitlines() if line.startswith("ssh-01 ")]
    assert " yes " in row and " on " in row and "boot id " in row


def test_a_cluster_with_an_unreachable_bmc_prints_both_and_exits_1(lab: Lab) -> None:
    out = lab.check("lab-redfish", "--provider", "redfish")
    assert out.returncode == 1, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:5] == ["HOSTNAME", "HOST", "ID", "REACHABLE", "POWER"]
    up = next(line for line in lines if line.startswith("redfish-01 "))
    down = next(line for line in lines if line.startswith("redfish-down "))
    assert " yes " in up and " on " in up and "Redfish 1." in up
    assert " no " in down and " unknown " in down and "cannot reach the BMC" in down
    assert "redfish: 1 of 2 host(s) reachable" in _flat(out.stdout)
    as_json = lab.check("lab-redfish", "--provider", "redfish", "-o", "json")
    assert as_json.returncode == 1
    answer = json.loads(as_json.stdout)
    assert answer["provider"] == "redfish"
    assert [(h["hostname"], h["reachable"], h["power"]) for h in answer["hosts"]] == [
        ("redfish-01", True, "on"), ("redfish-down", False, "unknown"),
    ]  # fmt: skip


def test_bad_input_exits_2(lab: Lab) -> None:
    sim = lab.check("lab-ipmi")  # the cluster's own provider: sim, which has no reach check
    assert sim.returncode == 2 and "'sim' has no reach check" in _flat(sim.stderr)
    unknown = lab.check("no-such-cluster", "--provider", "ipmi")
    assert unknown.returncode == 2 and "no cluster named 'no-such-cluster'" in _flat(unknown.stderr)
