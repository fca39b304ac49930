"""A real OpenSSH server on a loopback port, and an in-memory host inventory, for the
ssh provider's tests."""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.providers.base import Credential, HostAccess
from gpufleet.testing.processes import free_port

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")  # compiled into Debian's sshd; it refuses to start without


@dataclass(frozen=True)
class KeyPair:
    private: str = field(repr=False)  # OpenSSH PEM
    public: str  # "ssh-ed25519 AAAA... comment"


def make_key(path: Path, *, kind: str = "ed25519") -> KeyPair:
    """A fresh unencrypted key pair, written to ``path`` and ``path.pub``."""
    keygen = shutil.which("ssh-keygen")
    assert keygen is not None, "ssh-keygen is missing: apt-get install openssh-client"
    subprocess.run(
        [keygen, "-q", "-t", kind, "-N", "", "-C", f"gpufleet-test-{path.name}", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
    )
    return KeyPair(private=path.read_text(), public=path.with_suffix(".pub").read_text().strip())


@dataclass
class SshPeer:
    """sshd as a child process (``-D``: never a daemon), logging to ``log_path``."""

    root: Path
    port: int
    user: str
    host_key: KeyPair
    client_key: KeyPair
    proc: subprocess.Popen[bytes]
    log_path: Path

    def access(
        self,
        host_id: str = "h1",
        *,
        key: str | None = None,
        host_key: str | None = "pinned",
        port: int | None = None,
        username: str | None = "user",
        secret: str | None = None,
        cluster_id: str | None = "c1",
    ) -> HostAccess:
        """This server as one host of the inventory; ``"pinned"`` means its real key."""
        return HostAccess(
            host_id=host_id,
            hostname=f"{host_id}.test",
            address="127.0.0.1",
            port=self.port if port is None else port,
            credential=Credential(
                username=self.user if username == "user" else username,
                secret=secret if secret is not None else (key or self.client_key.private),
            ),
            host_key=self.host_key.public if host_key == "pinned" else host_key,
            cluster_id=cluster_id,
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)


def start_sshd(root: Path) -> SshPeer:
    """Start sshd on a free loopback port for the current user, key login only."""
    assert os.path.exists(SSHD), f"{SSHD} is missing: apt-get install openssh-server"
    root.mkdir(parents=True, exist_ok=True)
    user = getpass.getuser()
    if os.geteuid() == 0:
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
    host_key = make_key(root / "ssh_host_ed25519_key")
    client_key = make_key(root / "client_key")
    authorized = root / "authorized_keys"
    authorized.write_text(client_key.public + "\n")
    authorized.chmod(0o600)
    port = free_port()
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                "ListenAddress 127.0.0.1",
                f"Port {port}",
                f"HostKey {root / 'ssh_host_ed25519_key'}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                f"AllowUsers {user}",
                "PermitRootLogin prohibit-password",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "LogLevel VERBOSE",
                "",
            ]
        )
    )
    log_path = root / "sshd.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    peer = SshPeer(
        root=root,
        port=port,
        user=user,
        host_key=host_key,
        client_key=client_key,
        proc=proc,
        log_path=log_path,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"sshd exited {proc.returncode}: {log_path.read_text()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if s.recv(64).startswith(b"SSH-2.0-"):
                    return peer
        except OSError:
            time.sleep(0.05)
    peer.stop()
    raise AssertionError(f"sshd did not listen on {port} within 10 s: {log_path.read_text()}")


class MemoryHostDirectory:
    """A ``HostDirectory`` over a dict: ``hosts`` in service, ``spares`` per cluster."""

    def __init__(self, hosts: list[HostAccess], *, spares: tuple[HostAccess, ...] = ()) -> None:
        self.in_service = {h.host_id: h for h in hosts}
        self.spares = list(spares)
        self.claims: dict[str, str] = {}  # client token → host id
        self.released: list[str] = []

    async def host(self, host_id: str) -> HostAccess | None:
        for access in [*self.in_service.values(), *self.spares]:
            if access.host_id == host_id:
                return access
        return None

    async def hosts(self, cluster_id: str) -> list[HostAccess]:
        every = [*self.in_service.values(), *self.spares]
        return [h for h in every if h.cluster_id == cluster_id]

    async def claim_spare(self, cluster_id: str, client_token: str) -> HostAccess | None:
        if client_token in self.claims:
            return self.in_service[self.claims[client_token]]
        for access in self.spares:
            if access.cluster_id == cluster_id:
                self.spares.remove(access)
                self.in_service[access.host_id] = access
                self.claims[client_token] = access.host_id
                return access
        return None

    async def release(self, host_id: str) -> None:
        self.in_service.pop(host_id, None)
        self.released.append(host_id)
