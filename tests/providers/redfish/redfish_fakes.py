"""Test helpers for the Redfish provider tests: an in-memory host directory, a
sushy-emulator process, and small sockets that play a broken or scripted BMC.

``ScriptedBmc`` is a stand-in, not an emulator: it answers just the few Redfish calls the
driver makes, scripted per test, for what sushy-emulator cannot produce (a 202 with a
task monitor, a 501 for an advertised reset type, a 503 that goes away).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpufleet.providers.base import HostAccess

LAUNCHER = Path(__file__).with_name("emulator_launcher.py")

USER = "admin"
PASSWORD = "s3cret-BMC-pw-never-printed"
# uuid -> name and initial power
SYSTEMS = {
    "11111111-0000-0000-0000-000000000001": ("gpu-node-01", "Off"),
    "11111111-0000-0000-0000-000000000002": ("gpu-node-02", "On"),
    "11111111-0000-0000-0000-000000000003": ("gpu-node-03", "On"),
    "11111111-0000-0000-0000-000000000004": ("gpu-node-04", "On"),
    "11111111-0000-0000-0000-000000000005": ("gpu-node-05", "Off"),
    "11111111-0000-0000-0000-000000000006": ("gpu-node-06", "On"),
}


class InMemoryHostDirectory:
    """Test helper: a ``HostDirectory`` over a dict. Hosts without a cluster_id are
    spares of every cluster; a claim binds one to the cluster and the token."""

    def __init__(self, hosts: list[HostAccess]) -> None:
        self.by_id = {h.host_id: h for h in hosts}
        self.claims: dict[str, str] = {}  # client_token -> host_id
        self.released: list[str] = []
        self.spares: list[str] = []

    def add_spare(self, host: HostAccess) -> None:
        self.by_id[host.host_id] = host
        self.spares.append(host.host_id)

    async def host(self, host_id: str) -> HostAccess | None:
        return self.by_id.get(host_id)

    async def hosts(self, cluster_id: str) -> list[HostAccess]:
        return [h for h in self.by_id.values() if h.cluster_id == cluster_id]

    async def claim_spare(self, cluster_id: str, client_token: str) -> HostAccess | None:
        if client_token in self.claims:
            return self.by_id[self.claims[client_token]]
        if not self.spares:
            return None
        host_id = self.spares.pop(0)
        self.claims[client_token] = host_id
        self.by_id[host_id] = replace(self.by_id[host_id], cluster_id=cluster_id)
        return self.by_id[host_id]

    async def release(self, host_id: str) -> None:
        if host_id in self.by_id and host_id not in self.released:
            self.released.append(host_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Emulator:
    """A running sushy-emulator (fake driver) and its journal of power events."""

    port: int
    journal: Path
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def events(self, uuid: str) -> list[str]:
        """``reset <type>``, ``power <state>`` and ``boot <device>`` lines of one system,
        oldest first."""
        if not self.journal.exists():
            return []
        lines = self.journal.read_text().splitlines()
        return [line.split(" ", 1)[1] for line in lines if line.startswith(uuid + " ")]

    def system(self, uuid: str, *, auth: tuple[str, str]) -> dict[str, Any]:
        """The system as the emulator shows it (read directly, not through the driver)."""
        request = urllib.request.Request(f"http://{self.address}/redfish/v1/Systems/{uuid}")
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", "Basic " + token)
        with urllib.request.urlopen(request, timeout=5) as answer:  # noqa: S310 - loopback http
            doc: dict[str, Any] = json.loads(answer.read())
        return doc


def start_emulator(
    workdir: Path,
    *,
    systems: list[dict[str, Any]],
    users: dict[str, str],
    delay_s: int = 0,
) -> Emulator:
    """Start sushy-emulator with a fresh state dir under ``workdir`` on a free port."""
    bcrypt = __import__("bcrypt")  # sushy-tools' own dependency for its htpasswd file
    workdir.mkdir(parents=True, exist_ok=True)
    auth_file = workdir / "htpasswd"
    auth_file.write_text(
        "".join(
            f"{user}:{bcrypt.hashpw(pw.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
            for user, pw in users.items()
        )
    )
    conf = workdir / "emulator.conf"
    conf.write_text(
        "SUSHY_EMULATOR_FAKE_DRIVER = True\n"
        f"SUSHY_EMULATOR_STATE_DIR = {str(workdir / 'state')!r}\n"
        f"SUSHY_EMULATOR_AUTH_FILE = {str(auth_file)!r}\n"
        f"SUSHY_EMULATOR_FAKE_SYSTEMS = {systems!r}\n"
    )
    port = free_port()
    journal = workdir / "journal"
    log = workdir / "emulator.log"
    env = {
        **os.environ,
        "GPUFLEET_TEST_SUSHY_DELAY_S": str(delay_s),
        "GPUFLEET_TEST_SUSHY_JOURNAL": str(journal),
    }
    listen = ["-i", "127.0.0.1", "-p", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(LAUNCHER), "--config", str(conf), "--fake", *listen],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    emulator = Emulator(port=port, journal=journal, proc=proc, log=log)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/redfish/v1", timeout=1),
        ):
            return emulator
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"sushy-emulator did not start; its log:\n{log.read_text()[-3000:]}")


def stop_emulator(emulator: Emulator) -> None:
    emulator.proc.terminate()
    try:
        emulator.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        emulator.proc.kill()
        emulator.proc.wait()


@contextlib.contextmanager
def hung_bmc() -> Iterator[int]:
    """A port that accepts connections and never answers: a BMC whose web server hung."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def closed_port() -> int:
    """A port nothing listens on (bound once, then closed): connections are refused."""
    return free_port()


# --- ScriptedBmc -------------------------------------------------------------------------

SYSTEM_PATH = "/redfish/v1/Systems/s1"


@dataclass
class Script:
    """What the scripted BMC answers. ``reset_answers`` maps a ResetType to a status (204
    default; 202 starts a task whose monitor answers 202 ``task_running_polls`` times,
    then the task with ``task_state``)."""

    allowed: list[str] | None = field(
        default_factory=lambda: ["On", "ForceOff", "GracefulRestart", "ForceRestart"]
    )
    action_info: list[str] | None = None
    reset_answers: dict[str, int] = field(default_factory=dict)
    reset_bodies: dict[str, str] = field(default_factory=dict)
    task_running_polls: int = 2
    task_state: str = "Completed"
    fail_system_gets: int = 0  # answer 503 to that many GETs of the system first
    first_post_statuses: list[int] = field(default_factory=list)  # answers to the first POSTs
    boot_targets: list[str] | None = None  # BootSourceOverrideTarget@Redfish.AllowableValues
    patches: list[tuple[dict[str, Any], str | None]] = field(default_factory=list)  # body, If-Match
    power: str = "On"
    posts: list[str] = field(default_factory=list)
    gets: list[str] = field(default_factory=list)
    task_polls: int = 0


def _system_doc(script: Script) -> dict[str, Any]:
    reset: dict[str, Any] = {"target": f"{SYSTEM_PATH}/Actions/ComputerSystem.Reset"}
    if script.allowed is not None:
        reset["ResetType@Redfish.AllowableValues"] = script.allowed
    if script.action_info is not None:
        reset["@Redfish.ActionInfo"] = f"{SYSTEM_PATH}/ResetActionInfo"
    return {
        "@odata.id": SYSTEM_PATH,
        "Id": "s1",
        "PowerState": script.power,
        "Boot": {"BootSourceOverrideMode": "UEFI"}
        | (
            {"BootSourceOverrideTarget@Redfish.AllowableValues": script.boot_targets}
            if script.boot_targets is not None
            else {}
        ),
        "Actions": {"#ComputerSystem.Reset": reset},
    }


class ScriptedBmc:
    """A stand-in BMC on a free loopback port, answering from a ``Script``."""

    def __init__(self, script: Script) -> None:
        self.script = script
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _send(
                self, status: int, body: dict[str, Any] | None = None, **headers: str
            ) -> None:
                data = json.dumps(body).encode() if body is not None else b""
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                if body is not None:
                    self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                s = owner.script
                s.gets.append(self.path)
                if self.path.rstrip("/") == "/redfish/v1":
                    self._send(
                        200,
                        {
                            "RedfishVersion": "1.11.0",
                            "Systems": {"@odata.id": "/redfish/v1/Systems"},
                        },
                    )
                elif self.path == "/redfish/v1/Systems":
                    self._send(200, {"Members": [{"@odata.id": SYSTEM_PATH}]})
                elif self.path == SYSTEM_PATH:
                    if s.fail_system_gets > 0:
                        s.fail_system_gets -= 1
                        self._send(
                            503,
                            {
                                "error": {
                                    "code": "Base.1.0.ServiceTemporarilyUnavailable",
                                    "message": "busy",
                                }
                            },
                        )
                    else:
                        self._send(200, _system_doc(s), ETag='W/"v1"')
                elif self.path == f"{SYSTEM_PATH}/ResetActionInfo":
                    self._send(
                        200,
                        {"Parameters": [{"Name": "ResetType", "AllowableValues": s.action_info}]},
                    )
                elif self.path == "/redfish/v1/TaskMonitors/1":
                    s.task_polls += 1
                    if s.task_polls <= s.task_running_polls:
                        self._send(202, {"TaskState": "Running"}, Location=self.path)
                    else:
                        self._send(
                            200,
                            {
                                "TaskState": s.task_state,
                                "TaskStatus": "OK" if s.task_state == "Completed" else "Critical",
                                "Messages": [{"Message": f"task {s.task_state}"}],
                            },
                        )
                else:
                    self._send(
                        404, {"error": {"code": "Base.1.0.ResourceMissingAtURI", "message": "no"}}
                    )

            def do_PATCH(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                owner.script.patches.append((body, self.headers.get("If-Match")))
                self._send(204)

            def do_POST(self) -> None:
                s = owner.script
                length = int(self.headers.get("Content-Length", "0"))
                reset_type = json.loads(self.rfile.read(length) or b"{}").get("ResetType", "")
                s.posts.append(reset_type)
                status = s.reset_answers.get(reset_type, 204)
                if s.first_post_statuses:
                    status = s.first_post_statuses.pop(0)
                if status == 202:
                    self._send(202, None, Location="/redfish/v1/TaskMonitors/1")
                elif status >= 400:
                    message = s.reset_bodies.get(reset_type, f"{reset_type} is not supported")
                    self._send(
                        status, {"error": {"code": "Base.1.0.GeneralError", "message": message}}
                    )
                else:
                    self._send(status)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def __enter__(self) -> ScriptedBmc:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
