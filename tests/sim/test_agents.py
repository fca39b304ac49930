from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from gpufleet.core.agent_protocol import (
    CommandPoll,
    FindingAck,
    FindingBatch,
    FindingReport,
    FindingState,
    ReportAck,
    ReportBatch,
)
from gpufleet.core.clock import FakeClock
from gpufleet.sim.agents import SimFleetRunner
from gpufleet.sim.models import BootPlan, SimInstanceSpec
from gpufleet.sim.world import SimWorld
from gpufleet.testing.waits import eventually

PLAN = BootPlan((10.0, 10.0))


class ReportServer:
    """A tiny HTTP/1.1 server (keep-alive) that records agent batches (reports and
    finding changes) and acks them."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, ReportBatch]] = []
        self.findings: list[tuple[str, FindingReport]] = []
        self.polls: list[str] = []
        self.status = 200  # set to 503 to refuse
        self.tokens: set[str] | None = None  # None: every token is valid
        self.interval_s = 0.05
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.port, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    def by_token(self, token: str) -> list[ReportBatch]:
        return [b for t, b in self.batches if t == token]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while line := await reader.readline():
                findings = line.startswith(b"POST /api/v1/agent/findings ")
                poll = line.startswith(b"GET /api/v1/agent/commands?")
                assert findings or poll or line.startswith(b"POST /api/v1/agent/reports ")
                headers: dict[str, str] = {}
                while (h := await reader.readline()) not in (b"\r\n", b""):
                    key, _, value = h.decode().partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                token = headers["authorization"][7:]
                if poll:  # each boot asks once; nothing is queued here
                    self.polls.append(token)
                    status, payload = self.status, CommandPoll().model_dump_json().encode()
                elif findings:
                    status, payload = self._ack_findings(token, body)
                else:
                    status, payload = self._respond(token, body)
                writer.write(
                    f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(payload)}\r\n\r\n".encode()
                    + payload
                )
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    def _ack_findings(self, token: str, body: bytes) -> tuple[int, bytes]:
        # As the real server: a change is applied once, by seq (a resend after a lost ack
        # carries changes already applied).
        batch = FindingBatch.model_validate_json(body)
        held = max((f.seq for t, f in self.findings if t == token), default=0)
        fresh = [f for f in batch.findings if f.seq > held]
        self.findings += [(token, f) for f in fresh]
        last = max(held, *(f.seq for f in batch.findings))
        dups = len(batch.findings) - len(fresh)
        ack = FindingAck(node_id=token, accepted=len(fresh), duplicates=dups, last_seq=last)
        return 200, ack.model_dump_json().encode()

    def _respond(self, token: str, body: bytes) -> tuple[int, bytes]:
        if self.tokens is not None and token not in self.tokens:
            error = {"error": {"code": "unauthorized", "message": "bad node token"}}
            return 401, json.dumps(error).encode()
        if self.status != 200:
            return self.status, b'{"error": {"code": "unavailable", "message": "down"}}'
        batch = ReportBatch.model_validate_json(body)
        self.batches.append((token, batch))
        ack = ReportAck(
            node_id=token,
            accepted=len(batch.reports),
            duplicates=0,
            last_seq=batch.reports[-1].seq,
            report_interval_s=self.interval_s,
        )
        return 200, ack.model_dump_json().encode()


@pytest.fixture
async def server() -> AsyncIterator[ReportServer]:
    srv = ReportServer()
    await srv.start()
    yield srv
    await srv.stop()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=2.0) as client:
        yield client


def make_world(server: ReportServer, clock: FakeClock, n: int = 3) -> SimWorld:
    world = SimWorld(None, clock=clock, seed=4)
    for i in range(n):
        world.provision(
            SimInstanceSpec(
                client_token=f"ct-{i}",
                cluster_id="c1",
                node_name=f"c1-{i:03d}",
                gpu_model="NVIDIA H100 80GB HBM3",
                gpu_count=8,
                user_data={"gpufleet_url": server.url, "gpufleet_node_token": f"node-{i}"},
            ),
            plan=PLAN,
        )
    # One instance without a node token: the control plane has not set it up; no agent.
    world.provision(SimInstanceSpec("ct-x", "c1", "c1-999", "NVIDIA H100 80GB HBM3", 8), plan=PLAN)
    clock.advance(11)
    return world


async def until(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """The free-running agents under test report on real time (their interval); the
    world's fake clock only dates their samples and boots."""
    await eventually(cond, timeout_s=timeout_s)


def seqs(batches: list[ReportBatch]) -> list[int]:
    return [r.seq for b in batches for r in b.reports]


def assert_strictly_increasing(values: list[int]) -> None:
    assert all(a < b for a, b in itertools.pairwise(values)), values


async def test_agents_report_identity_then_telemetry(
    server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    world = make_world(server, clock)
    runner = SimFleetRunner(world, http=http, report_interval_s=0.05, seed=1)
    await runner.run_once()
    assert runner.stats().agents == 3
    await until(lambda: all(len(server.by_token(f"node-{i}")) >= 3 for i in range(3)))
    await runner.aclose()
    for i in range(3):
        batches = server.by_token(f"node-{i}")
        instance = world.list_instances()[i]
        first = batches[0].identity
        assert first is not None and first.hostname == f"c1-{i:03d}"
        assert first.serial == instance.serial
        assert all(b.identity is None for b in batches[1:])
        assert_strictly_increasing(seqs(batches))
        gpus = batches[-1].reports[-1].gpus
        assert [g.uuid for g in gpus] == [g.uuid for g in instance.gpus]
        assert {g.model for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert "" not in {t for t, _ in server.batches}
    stats = runner.stats()
    # An ack still in flight when the agents stopped is not counted: one per agent at most.
    assert stats.batches_sent >= len(server.batches) - 3 and stats.agents == 0
    assert stats.reports_sent >= stats.batches_sent


@pytest.mark.parametrize("outage", ["unreachable", "http-503"])
async def test_reports_kept_during_an_outage_are_replayed_in_order(
    outage: str, server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    world = make_world(server, clock, n=1)
    runner = SimFleetRunner(world, http=http, report_interval_s=0.05, seed=2)
    await runner.run_once()
    await until(lambda: len(server.batches) >= 2)
    if outage == "unreachable":
        await server.stop()
    else:
        server.status = 503
    before = len(server.batches)
    await until(lambda: runner.stats().errors >= 4)
    if outage == "unreachable":
        await server.start()  # same port
    else:
        server.status = 200
    await until(lambda: len(server.batches) >= before + 2)
    await runner.aclose()
    replay = server.batches[before][1]
    assert len(replay.reports) >= 4  # everything sampled while the server was away
    assert_strictly_increasing(seqs([b for _, b in server.batches]))


async def test_a_rejected_token_is_reread_from_user_data(
    server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    world = make_world(server, clock, n=1)
    server.tokens = {"rotated"}
    runner = SimFleetRunner(world, http=http, report_interval_s=0.05, seed=3)
    await runner.run_once()
    await until(lambda: runner.stats().unauthorized >= 2)
    assert server.batches == []
    url = server.url
    world.provision(
        SimInstanceSpec(
            "ct-0",
            "c1",
            "c1-000",
            "NVIDIA H100 80GB HBM3",
            8,
            user_data={"gpufleet_url": url, "gpufleet_node_token": "rotated"},
        ),
        plan=PLAN,
    )
    await until(lambda: len(server.batches) >= 1)
    await runner.aclose()
    token, batch = server.batches[0]
    assert token == "rotated" and batch.identity is not None  # identity not yet acked


async def test_agents_follow_reboots_and_terminations(
    server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    world = make_world(server, clock, n=2)
    runner = SimFleetRunner(world, http=http, report_interval_s=0.05, seed=5)
    await runner.run_once()
    await until(lambda: len(server.by_token("node-0")) >= 2)
    first, second = world.list_instances()[:2]
    world.terminate(second.instance_id)
    world.reboot(first.instance_id, plan=PLAN)
    await runner.run_once()
    assert runner.stats().agents == 0
    clock.advance(11)
    await runner.run_once()
    assert runner.stats().agents == 1
    seen = len(server.by_token("node-0"))
    await until(lambda: len(server.by_token("node-0")) >= seen + 2)
    await runner.aclose()
    batches = server.by_token("node-0")
    assert sum(1 for b in batches if b.identity is not None) == 2  # one per boot
    assert_strictly_increasing(seqs(batches))


async def test_server_interval_overrides_and_run_stops(
    server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    world = make_world(server, clock, n=1)
    server.interval_s = 0.02
    runner = SimFleetRunner(
        world, http=http, report_interval_s=0.1, supervise_interval_s=0.05, seed=6
    )
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await until(lambda: len(server.batches) >= 10, timeout_s=1.0)  # 10 at 0.1 s: 1 s
    stop.set()
    await asyncio.wait_for(task, timeout=2.0)
    assert runner.stats().agents == 0


async def test_busy_nodes_report_busy_gpus(
    server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    world = make_world(server, clock, n=3)
    world.advance()
    busy = world.busy_instance_ids()
    assert busy
    runner = SimFleetRunner(world, http=http, report_interval_s=0.05, seed=7)
    await runner.run_once()
    await until(lambda: all(len(server.by_token(f"node-{i}")) >= 2 for i in range(3)))
    await runner.aclose()
    for i, inst in enumerate(world.list_instances()[:3]):
        last = server.by_token(f"node-{i}")[-1].reports[-1]
        utils = [g.utilization_pct for g in last.gpus]
        if inst.instance_id in busy:
            # Every synthetic job uses all its GPUs, at its kind's level: 50 % and up.
            assert min(utils) > 40
        else:
            assert max(utils) <= 3


async def test_a_sticky_fault_is_reported_again_after_a_reboot(
    server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    world = make_world(server, clock, n=1)
    (instance,) = world.list_instances()[:1]
    iid = instance.instance_id
    world.inject_fault(iid, signature_id="xid-48", gpu_index=3, sticky=True)
    world.inject_fault(iid, signature_id="xid-79", gpu_index=0)
    runner = SimFleetRunner(world, http=http, report_interval_s=0.05, seed=8)

    def changes() -> list[tuple[str, FindingState, int]]:
        return [(f.signature_id, f.state, f.count) for t, f in server.findings if t == "node-0"]

    await runner.run_once()
    await until(lambda: len(changes()) == 2)
    world.reboot(iid, plan=PLAN)
    rebooted = clock.now()
    await runner.run_once()
    assert runner.stats().agents == 0  # booting
    clock.advance(11)
    await runner.run_once()  # a new agent: the reboot's clear goes out
    await until(lambda: ("xid-79", FindingState.CLEARED, 1) in changes())
    clock.advance(5)  # past the first recurrence (2-5 s after the boot), before a repeat
    await runner.run_once()
    await until(lambda: ("xid-48", FindingState.OPEN, 2) in changes())
    await runner.aclose()
    assert sorted(changes()) == [
        ("xid-48", FindingState.OPEN, 1),
        ("xid-48", FindingState.OPEN, 2),
        ("xid-79", FindingState.CLEARED, 1),
        ("xid-79", FindingState.OPEN, 1),
    ]
    again = next(f for _, f in server.findings if f.count == 2)
    assert again.last_seen > rebooted + dt.timedelta(seconds=10)  # after the boot
    assert again.key == f"xid-48/{instance.gpus[3].uuid}"
    seqs = [f.seq for _, f in server.findings]
    assert seqs == sorted(seqs)


async def test_a_gpu_being_reset_is_left_out_of_reports(
    server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    world = make_world(server, clock, n=1)
    (instance,) = world.list_instances()[:1]
    world.reset_gpu(instance.instance_id, gpu_index=2, plan=BootPlan((10.0, 10.0)))
    runner = SimFleetRunner(world, http=http, report_interval_s=0.05, seed=9)
    await runner.run_once()
    await until(lambda: len(server.by_token("node-0")) >= 2)
    assert [g.index for g in server.by_token("node-0")[-1].reports[-1].gpus] == [
        0, 1, 3, 4, 5, 6, 7,
    ]  # fmt: skip
    clock.advance(11)
    await runner.run_once()
    seen = len(server.by_token("node-0"))
    await until(lambda: len(server.by_token("node-0")) >= seen + 2)
    await runner.aclose()
    assert len(server.by_token("node-0")[-1].reports[-1].gpus) == 8


async def test_a_step_sends_one_report_and_every_finding_change_then_nothing_runs(
    server: ReportServer, http: httpx.AsyncClient, clock: FakeClock
) -> None:
    """Stepped agents (tests on a fake clock): each step is one report per agent and the
    finding changes since the last, all sent when step() returns; no task is left."""
    world = make_world(server, clock, n=2)
    (first, _second) = world.list_instances()[:2]
    runner = SimFleetRunner(world, http=http, seed=10)
    await runner.step()
    assert [len(server.by_token(f"node-{i}")) for i in range(2)] == [1, 1]
    assert runner.stats().agents == 2 and runner.stats().batches_sent == 2
    world.inject_fault(first.instance_id, signature_id="xid-79", gpu_index=1)
    clock.advance(30)
    await runner.step()
    assert [len(server.by_token(f"node-{i}")) for i in range(2)] == [2, 2]
    assert [(t, f.signature_id, f.state) for t, f in server.findings] == [
        ("node-0", "xid-79", FindingState.OPEN)
    ]
    batches = server.by_token("node-0")
    assert batches[0].identity is not None and batches[1].identity is None
    assert batches[1].reports[0].sampled_at == clock.now()
    assert [g.index for g in batches[1].reports[0].gpus] == [0, 2, 3, 4, 5, 6, 7]  # off the bus
    with pytest.raises(RuntimeError, match="stepped"):
        await runner.run_once()  # one way to run a runner's agents, not both
    await runner.aclose()
    assert runner.stats().agents == 0
