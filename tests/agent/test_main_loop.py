from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import pytest
from recording_server import RecordingServer

from gpufleet.agent.collectors.base import CollectorResult, Event
from gpufleet.agent.main import build_agent
from gpufleet.agent.runtime import Agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import FindingSource
from gpufleet.testing.waits import eventually


class Broken:
    name = "broken"

    async def collect(self, now: dt.datetime) -> CollectorResult:
        raise RuntimeError("sensor on fire")

    async def close(self) -> None:
        return None


class Gpus:
    name = "gpus"

    async def collect(self, now: dt.datetime) -> CollectorResult:
        from gpufleet.agent.collectors.base import Sample

        return CollectorResult(samples=[Sample("gpu", {"utilization_pct": 90.0}, 0, "GPU-a")])

    async def close(self) -> None:
        return None


def xid_event(i: int, at: dt.datetime) -> Event:
    # A different GPU address each time: a distinct finding, not a fold.
    bus = f"0000:{i:02x}:00.0"
    return Event("xid-48", at, FindingSource.KERNEL_LOG, f"line {i}", pci_bus_id=bus)


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    s = RecordingServer()
    yield s
    with contextlib.suppress(AssertionError):
        s.down()


class Running:
    def __init__(self, server: RecordingServer, state_dir: Path, clock: FakeClock) -> None:
        settings = AgentSettings(
            server_url=server.url,
            node_token="node-token",
            state_dir=state_dir,  # type: ignore[arg-type]
            hostname="gpu-node-07",
            retry_initial_s=0.02,
            retry_max_s=0.1,
            sample_interval_s=0.05,
            metrics_listen=None,
        )
        # Generous: a request that times out on a loaded machine is sent again, rightly,
        # and the no-resend test would count it.
        self.http = httpx.AsyncClient(timeout=15.0)
        client = AgentClient(base_url=server.url, node_token="node-token", http=self.http)
        self.agent: Agent = build_agent(
            settings, client=client, collectors=[Broken(), Gpus()], sources=[], clock=clock
        )
        self.stop = asyncio.Event()
        self.task = asyncio.create_task(self.agent.run(self.stop))

    async def close(self) -> None:
        self.stop.set()
        await self.task
        self.agent.spool.close()
        await self.http.aclose()


async def until(predicate: Callable[[], bool]) -> None:
    await eventually(predicate, timeout_s=20.0)


@pytest.fixture
async def clock() -> AsyncIterator[FakeClock]:
    yield FakeClock()


async def test_findings_go_at_once(
    server: RecordingServer, tmp_path: Path, clock: FakeClock
) -> None:
    run = Running(server, tmp_path, clock)
    await run.agent.on_events([xid_event(1, clock.now())])
    await until(lambda: len(server.stored) == 1)  # well before any report interval
    assert server.stored[0]["signature_id"] == "xid-48"
    await run.close()


async def test_server_down_then_up_every_finding_once_in_order(
    server: RecordingServer, tmp_path: Path, clock: FakeClock
) -> None:
    run = Running(server, tmp_path, clock)
    for i in range(5):
        await run.agent.on_events([xid_event(i, clock.now())])
    await until(lambda: len(server.stored) == 5)
    server.down()
    for i in range(5, 30):
        clock.advance(1)
        await run.agent.on_events([xid_event(i, clock.now())])
    # The agent's retries run on real timers (20-100 ms): let several fail.
    await asyncio.sleep(0.3)  # real sleep: the real agent's retry timers are under test
    assert run.agent.spool.findings.depth() == 25
    server.up()
    await until(lambda: len(server.stored) == 30)
    await until(lambda: run.agent.spool.findings.depth() == 0)  # all acked: nothing resent
    assert [f["evidence"] for f in server.stored] == [f"line {i}" for i in range(30)]
    seqs = [f["seq"] for f in server.stored]
    assert seqs == sorted(seqs) and len(set(seqs)) == 30
    assert run.agent.spool.findings.depth() == 0
    await run.close()


async def test_agent_restart_sends_no_duplicates(
    server: RecordingServer, tmp_path: Path, clock: FakeClock
) -> None:
    server.down()
    first = Running(server, tmp_path, clock)
    for i in range(10):
        await first.agent.on_events([xid_event(i, clock.now())])
    await first.close()  # stopped with everything still spooled
    server.up()
    second = Running(server, tmp_path, clock)
    await until(lambda: len(server.stored) == 10)
    await second.agent.on_events([xid_event(10, clock.now())])
    await until(lambda: len(server.stored) == 11)
    # Stored is not yet acked: closed between the two (a loaded machine), the agent would
    # rightly send line 10 again. Acked, nothing is left to resend.
    await until(lambda: second.agent.spool.findings.depth() == 0)
    await second.close()
    third = Running(server, tmp_path, clock)
    await third.agent.on_events([xid_event(11, clock.now())])
    await until(lambda: len(server.stored) == 12)
    await third.close()
    evidence = [f["evidence"] for f in server.received]
    assert evidence == [f"line {i}" for i in range(12)]  # nothing was even resent
    seqs = [f["seq"] for f in server.stored]
    assert seqs == sorted(seqs)


async def test_restart_keeps_folding_open_findings(
    server: RecordingServer, tmp_path: Path, clock: FakeClock
) -> None:
    first = Running(server, tmp_path, clock)
    await first.agent.on_events([xid_event(1, clock.now())])
    await until(lambda: len(server.stored) == 1)
    await first.close()
    clock.advance(60)
    second = Running(server, tmp_path, clock)
    await second.agent.on_events([xid_event(1, clock.now())])
    await until(lambda: len(server.stored) == 2)
    assert server.stored[1]["count"] == 2 and server.stored[1]["key"] == server.stored[0]["key"]
    await second.close()


async def test_broken_collector_does_not_stop_metrics(
    server: RecordingServer, tmp_path: Path, clock: FakeClock
) -> None:
    run = Running(server, tmp_path, clock)
    await until(lambda: bool(run.agent.latest))  # the sample loop runs past "broken"
    run.agent.report_once()
    await until(lambda: len(server.reports) == 1)
    await run.close()
