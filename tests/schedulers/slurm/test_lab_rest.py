"""``SlurmScheduler`` reading through the lab's real slurmrestd (Slurm 22.05.8, API
v0.0.38): the one on a unix socket with local auth, and the one on TCP with JWT auth.
Writes still go through scontrol. Every test leaves the lab idle (``reset``)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpufleet.core.errors import DriverError
from gpufleet.schedulers.base import SchedNodeState
from gpufleet.schedulers.slurm.config import SlurmConfig
from gpufleet.schedulers.slurm.driver import SlurmScheduler
from gpufleet.testing.slurm_lab import SlurmLab

pytestmark = pytest.mark.slow


def sbatch(lab: SlurmLab, *args: str) -> str:
    out = lab.run("sbatch", "--parsable", "--chdir=/tmp", "--output=/dev/null", *args).stdout
    return out.strip().split(";")[0]


def wait_running(lab: SlurmLab, job_id: str) -> None:
    def running() -> bool:
        out = lab.run("squeue", "-h", "-j", job_id, "-o", "%T", check=False)
        return out.stdout.strip() == "RUNNING"

    lab.wait_until(running, timeout_s=20, what=f"job {job_id} RUNNING")


def signed_jwt(lab: SlurmLab, *, user: str, exp: int, key: bytes | None = None) -> str:
    """An HS256 JWT as ``scontrol token`` makes it, signed with the lab's key (or
    ``key``), expiring at ``exp``: so an expired token needs no waiting."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64(json.dumps({"exp": exp, "iat": exp - 600, "sun": user}).encode())
    secret = key if key is not None else (lab.dir / "etc" / "jwt_hs256.key").read_bytes()
    signature = hmac.new(secret, f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{b64(signature)}"


class RestLab:
    """Three schedulers on the session's lab: ``rest`` reads through slurmrestd and has
    no Slurm commands at all (its ``bin_dir`` is empty, so a read that fell back to the
    CLI would fail), ``full`` reads through slurmrestd and writes with scontrol, ``cli``
    is the plain CLI driver to compare with."""

    def __init__(self, lab: SlurmLab, *, via: str, no_commands: Path) -> None:
        self.lab = lab
        self.via = via
        env = lab.env()
        url, token = (
            (f"unix://{lab.rest_socket}", None)
            if via == "socket"
            else (lab.rest_url, lab.jwt("root"))
        )
        self.rest = SlurmScheduler(
            SlurmConfig(env=env, rest_url=url, rest_token=token, bin_dir=str(no_commands))
        )
        self.full = SlurmScheduler(SlurmConfig(env=env, rest_url=url, rest_token=token))
        self.cli = SlurmScheduler(SlurmConfig(env=env))

    async def close(self) -> None:
        for sched in (self.rest, self.full, self.cli):
            await sched.aclose()


@pytest.fixture(params=["socket", "jwt"])
async def rest_lab(
    slurm_lab: SlurmLab, request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[RestLab]:
    (tmp_path / "no-commands").mkdir()
    lab = RestLab(slurm_lab, via=request.param, no_commands=tmp_path / "no-commands")
    yield lab
    await lab.close()
    slurm_lab.reset()


async def test_list_nodes_over_rest_equals_the_cli(rest_lab: RestLab) -> None:
    lab = rest_lab.lab
    job_id = sbatch(lab, "--uid=nobody", "--gres=gpu:2", "-w", "lab-002", "--wrap=sleep 60")
    wait_running(lab, job_id)
    await rest_lab.full.drain("lab-001", reason="gpufleet: r-1 xid-79")  # scontrol
    lab.run("scontrol", "update", "nodename=lab-003", "state=drain", "reason=hc: ECC")
    over_rest = await rest_lab.rest.list_nodes()
    assert over_rest == await rest_lab.cli.list_nodes()
    assert [
        (n.name, n.state, n.reason, n.gpus, n.gpus_allocated, n.job_ids) for n in over_rest
    ] == [
        ("lab-001", SchedNodeState.DRAINED, "gpufleet: r-1 xid-79", 8, 0, ()),
        ("lab-002", SchedNodeState.MIXED, None, 8, 2, (job_id,)),
        ("lab-003", SchedNodeState.DRAINED, "hc: ECC", 8, 0, ()),
    ]


async def test_jobs_on_node_and_pending_demand_over_rest(rest_lab: RestLab) -> None:
    lab = rest_lab.lab
    job_id = sbatch(lab, "--uid=nobody", "--gres=gpu:1", "-w", "lab-002", "--wrap=sleep 60")
    wait_running(lab, job_id)
    (job,) = await rest_lab.rest.jobs_on_node("lab-002")
    assert (job.job_id, job.user, job.state, job.nodes, job.gpus) == (
        job_id,
        "nobody",
        "RUNNING",
        ("lab-002",),
        1,
    )
    assert job.started_at is not None and job.extra["partition"] == "gpu"
    assert [job] == await rest_lab.cli.jobs_on_node("lab-002")
    assert await rest_lab.rest.jobs_on_node("lab-001") == []
    assert await rest_lab.rest.pending_gpu_demand() == 0
    sbatch(lab, "--uid=nobody", "-N", "3", "--gres=gpu:8", "--wrap=true")  # waits: Resources
    sbatch(lab, "-H", "--gres=gpu:4", "--wrap=true")  # held: no demand
    assert await rest_lab.rest.pending_gpu_demand() == 24


async def test_unknown_node_over_rest_raises(rest_lab: RestLab) -> None:
    with pytest.raises(DriverError) as caught:
        await rest_lab.rest.jobs_on_node("nosuch")
    message = caught.value.message
    assert message.startswith("slurm: node nosuch: slurmrestd ")
    assert "`GET /slurm/v0.0.38/node/nosuch` answered HTTP 500: Invalid node name" in message
    with pytest.raises(DriverError, match="node nosuch"):
        await rest_lab.full.drain("nosuch", reason="gpufleet: x")


async def test_writes_stay_on_scontrol(rest_lab: RestLab) -> None:
    await rest_lab.full.drain("lab-001", reason="gpufleet: xid 79")
    line = rest_lab.lab.run("scontrol", "-o", "show", "node", "lab-001").stdout
    assert " State=IDLE+DRAIN " in line and "Reason=gpufleet: xid 79" in line
    await rest_lab.full.resume("lab-001")
    assert rest_lab.lab.wait_for_node_state("lab-001", "idle", timeout_s=20) == "idle"
    with pytest.raises(DriverError, match="could not start"):
        await rest_lab.rest.drain("lab-002", reason="gpufleet: x")  # no scontrol there


async def test_a_refused_jwt_raises_never_an_empty_list(slurm_lab: SlurmLab) -> None:
    now = int(time.time())
    good = signed_jwt(slurm_lab, user="root", exp=now + 600)
    expired = signed_jwt(slurm_lab, user="root", exp=now - 60)
    forged = signed_jwt(slurm_lab, user="root", exp=now + 600, key=b"x" * 32)

    def sched(token: str | None) -> SlurmScheduler:
        config = SlurmConfig(env=slurm_lab.env(), rest_url=slurm_lab.rest_url, rest_token=token)
        return SlurmScheduler(config)

    # the signing above is what scontrol does: the same token, unexpired, is accepted
    assert [n.name for n in await sched(good).list_nodes()] == list(slurm_lab.node_names)
    for token in (expired, forged, "not-a-jwt"):
        bad = sched(token)
        with pytest.raises(DriverError) as caught:
            await bad.list_nodes()
        assert "`GET /slurm/v0.0.38/nodes` answered HTTP 500: Unspecified error" in str(
            caught.value
        )
        assert "`scontrol token username=root`" in str(caught.value)
        with pytest.raises(DriverError, match="HTTP 500"):
            await bad.pending_gpu_demand()
        with pytest.raises(DriverError, match=r"node lab-001: .* HTTP 500"):
            await bad.jobs_on_node("lab-001")
        await bad.aclose()
    with pytest.raises(DriverError, match=r"HTTP 401: Authentication failure \(slurmrestd wants"):
        await sched(None).list_nodes()


async def test_stopped_slurmrestd_raises_and_recovers(slurm_lab: SlurmLab) -> None:
    env = slurm_lab.env()
    socket = SlurmScheduler(SlurmConfig(env=env, rest_url=f"unix://{slurm_lab.rest_socket}"))
    jwt = SlurmScheduler(
        SlurmConfig(env=env, rest_url=slurm_lab.rest_url, rest_token=slurm_lab.jwt())
    )
    for sched in (socket, jwt):
        assert len(await sched.list_nodes()) == 3  # version known, connection pooled
    slurm_lab.stop_slurmrestd("local")
    slurm_lab.stop_slurmrestd("jwt")
    try:
        for sched in (socket, jwt):
            for read in (sched.list_nodes, sched.pending_gpu_demand):
                with pytest.raises(DriverError, match=r"slurmrestd .* could not connect"):
                    await read()
            with pytest.raises(DriverError, match=r"node lab-001: slurmrestd .* could not connect"):
                await sched.jobs_on_node("lab-001")
    finally:
        slurm_lab.start_slurmrestd()
    for sched in (socket, jwt):
        assert len(await sched.list_nodes()) == 3  # back without a new driver
        await sched.aclose()
