"""The slurmrestd client against a stand-in slurmrestd on a unix socket, for what the lab's
real one (22.05) cannot be made to do on cue: hang, speak a newer API version (23.02+,
served from the ``*-23.02-ref.json`` samples), answer 200 with an ``errors`` list (an
unknown node on 23.02+), or answer garbage. Plus the config and the server's wiring."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpufleet.core.errors import DriverError
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.schedulers.slurm.parsing import parse_jobs_json, parse_nodes_json
from gpufleet.server.drivers import slurm_scheduler
from gpufleet.server.settings import ServerSettings

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
HANG = (0, "")  # a route that never answers


@dataclass
class StandIn:
    """An HTTP/1.1 server on a unix socket: ``routes`` maps a path to (status, body);
    anything else is a 404, as slurmrestd answers an unknown path or API version. It
    records each request's path and headers."""

    socket: Path
    routes: dict[str, tuple[int, str]] = field(default_factory=dict)
    requests: list[tuple[str, dict[str, str]]] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            request_line, *lines = head.strip().split("\r\n")
            _, path, _ = request_line.split(" ")
            headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines)}
            self.requests.append((path, headers))
            status, body = self.routes.get(path, (404, "Unable find requested URL."))
            if (status, body) == HANG:
                await asyncio.sleep(3600)
            data = body.encode()
            writer.write(
                f"HTTP/1.1 {status} X\r\nContent-Length: {len(data)}\r\n"
                "Content-Type: application/json\r\nConnection: close\r\n\r\n".encode()
                + data
            )
            await writer.drain()
        finally:
            writer.close()
            self._tasks.discard(task)

    def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()


@pytest.fixture
async def standin(tmp_path: Path) -> AsyncIterator[StandIn]:
    stand_in = StandIn(socket=tmp_path / "slurmrestd.sock")
    server = await asyncio.start_unix_server(stand_in.handle, path=str(stand_in.socket))
    yield stand_in
    stand_in.cancel_all()
    server.close()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(server.wait_closed(), 5)


def serve_23_02(standin: StandIn) -> None:
    """What slurmrestd 23.02 routes: v0.0.39 (and v0.0.38), data_parser shapes."""
    ok = json.dumps({"meta": {}, "errors": [], "pings": [{"ping": "UP"}]})
    standin.routes.update(
        {
            "/slurm/v0.0.39/ping": (200, ok),
            "/slurm/v0.0.38/ping": (200, ok),
            "/slurm/v0.0.39/nodes": (
                200,
                (FIXTURES / "scontrol-show-node-23.02-ref.json").read_text(),
            ),
            "/slurm/v0.0.39/jobs": (200, (FIXTURES / "squeue-23.02-ref.json").read_text()),
        }
    )


def rest_scheduler(
    url: str,
    tmp_path: Path,
    *,
    timeout_s: float = 30.0,
    rest_token_file: str | None = None,
    rest_user: str = "root",
) -> SlurmScheduler:
    """A scheduler that can only read through slurmrestd (its bin_dir is empty)."""
    no_commands = tmp_path / "no-commands"
    no_commands.mkdir(exist_ok=True)
    config = SlurmConfig(
        rest_url=url,
        bin_dir=str(no_commands),
        timeout_s=timeout_s,
        rest_token_file=rest_token_file,
        rest_user=rest_user,
    )
    return SlurmScheduler(config)


async def test_newest_api_version_is_found_once_and_its_shapes_are_read(
    standin: StandIn, tmp_path: Path
) -> None:
    serve_23_02(standin)
    sched = rest_scheduler(standin.url, tmp_path)
    nodes = await sched.list_nodes()
    expected = parse_nodes_json((FIXTURES / "scontrol-show-node-23.02-ref.json").read_text())
    jobs = parse_jobs_json((FIXTURES / "squeue-23.02-ref.json").read_text())
    assert [n.name for n in nodes] == [n.name for n in expected]
    assert [(n.state, n.reason, n.gpus) for n in nodes] == [
        (n.state, n.reason, n.gpus) for n in expected
    ]
    running = {j.job_id for j in jobs if j.active}
    assert {i for n in nodes for i in n.job_ids} == running
    assert await sched.pending_gpu_demand() == 8
    pings = [p for p in standin.paths() if p.endswith("/ping")]
    assert pings == [f"/slurm/v0.0.{v}/ping" for v in (44, 43, 42, 41, 40, 39)]  # asked once
    assert "x-slurm-user-token" not in standin.requests[-1][1]  # local auth: no token
    await sched.aclose()


async def test_200_with_errors_is_an_error_not_an_empty_list(
    standin: StandIn, tmp_path: Path
) -> None:
    serve_23_02(standin)
    body = {
        "errors": [{"description": "Failure to query node bad-node", "error_number": 2018}],
        "nodes": [],
    }
    standin.routes["/slurm/v0.0.39/node/bad-node"] = (200, json.dumps(body))
    sched = rest_scheduler(standin.url, tmp_path)
    with pytest.raises(DriverError) as caught:
        await sched.jobs_on_node("bad-node")
    assert caught.value.message == (
        f"slurm: node bad-node: slurmrestd {standin.url} `GET /slurm/v0.0.39/node/bad-node` "
        "reported errors: Failure to query node bad-node (error 2018)"
    )
    standin.routes["/slurm/v0.0.39/jobs"] = (200, "<html>proxy error</html>")
    with pytest.raises(DriverError, match=r"`GET /slurm/v0\.0\.39/jobs`: could not read"):
        await sched.pending_gpu_demand()


async def test_a_node_name_is_quoted_in_the_path(standin: StandIn, tmp_path: Path) -> None:
    serve_23_02(standin)
    sched = rest_scheduler(standin.url, tmp_path)
    with pytest.raises(DriverError, match="HTTP 404"):
        await sched.jobs_on_node("a/b c")
    assert "/slurm/v0.0.39/node/a%2Fb%20c" in standin.paths()


async def test_a_hung_slurmrestd_times_out(standin: StandIn, tmp_path: Path) -> None:
    serve_23_02(standin)
    standin.routes["/slurm/v0.0.39/nodes"] = HANG
    sched = rest_scheduler(standin.url, tmp_path, timeout_s=0.3)
    with pytest.raises(DriverError) as caught:
        await sched.list_nodes()
    assert "`GET /slurm/v0.0.39/nodes` did not answer within 0.3 s" in caught.value.message


async def test_no_known_api_version_raises(standin: StandIn, tmp_path: Path) -> None:
    sched = rest_scheduler(standin.url, tmp_path)
    with pytest.raises(DriverError, match="routes none of the API versions"):
        await sched.list_nodes()


async def test_token_file_is_read_again_when_it_changes(standin: StandIn, tmp_path: Path) -> None:
    serve_23_02(standin)
    token_file = tmp_path / "jwt"
    token_file.write_text("SLURM_JWT=first\n")  # as `scontrol token` prints it
    sched = rest_scheduler(standin.url, tmp_path, rest_token_file=str(token_file), rest_user="svc")
    await sched.list_nodes()
    assert {h["x-slurm-user-token"] for _, h in standin.requests} == {"first"}
    assert {h["x-slurm-user-name"] for _, h in standin.requests} == {"svc"}
    token_file.write_text("second-and-longer\n")  # renewed by a cron job
    await sched.pending_gpu_demand()
    assert standin.requests[-1][1]["x-slurm-user-token"] == "second-and-longer"
    token_file.unlink()
    with pytest.raises(DriverError, match=f"cannot read the JWT file {token_file}"):
        await sched.pending_gpu_demand()
    token_file.write_text("\n")
    with pytest.raises(DriverError, match="is empty"):
        await sched.pending_gpu_demand()


@pytest.mark.parametrize(
    ("url", "socket"),
    [
        ("unix:///run/slurmrestd.sock", "/run/slurmrestd.sock"),
        ("unix:/run/slurmrestd.sock", "/run/slurmrestd.sock"),  # slurmrestd's own form
        ("http://127.0.0.1:6820", None),
        ("https://slurm.example:6820/", None),
    ],
)
def test_rest_url_forms(url: str, socket: str | None) -> None:
    assert SlurmConfig(rest_url=url).rest_socket == socket


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"rest_url": "127.0.0.1:6820"}, "must start with http://, https:// or unix://"),
        ({"rest_url": "unix://relative.sock"}, "needs an absolute path"),
        ({"rest_url": "unix:"}, "needs an absolute path"),
        ({"rest_token": "a", "rest_token_file": "/f"}, "not both"),
    ],
)
def test_bad_rest_config_is_refused(config: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlurmConfig(**config)  # type: ignore[arg-type]


def test_server_settings_reach_the_driver(tmp_path: Path) -> None:
    settings = ServerSettings(
        data_dir=tmp_path,
        slurm_conf=tmp_path / "slurm.conf",
        slurm_rest_url="http://slurm-head:6820",
        slurm_rest_token_file=tmp_path / "jwt",
        slurm_rest_user="gpufleet",
    )
    sched = slurm_scheduler(settings)
    assert sched is not None
    assert sched.config.env == {"SLURM_CONF": str(tmp_path / "slurm.conf")}
    assert (sched.config.rest_url, sched.config.rest_token_file, sched.config.rest_user) == (
        "http://slurm-head:6820",
        str(tmp_path / "jwt"),
        "gpufleet",
    )
    plain = slurm_scheduler(ServerSettings(data_dir=tmp_path, slurm_conf=tmp_path / "slurm.conf"))
    assert plain is not None and plain.config.rest_url is None
    with pytest.raises(ValueError, match="rest_url must start with"):
        slurm_scheduler(ServerSettings(data_dir=tmp_path, slurm_rest_url="slurm-head:6820"))
