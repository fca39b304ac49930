"""The agent's daemon supervisor, on real processes and a fake clock."""

from __future__ import annotations

import datetime as dt
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.agent.daemons import DaemonSpec, DaemonSupervisor, SupervisorPolicy, _proc_state
from gpufleet.agent.outbox import Outbox


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonSpec]:
    pidfile = tmp_path / "fake.pid"
    start = ("bash", "-c", f"setsid sleep 300 </dev/null >/dev/null 2>&1 & echo $! > {pidfile}")
    spec = DaemonSpec("slurmd", pidfile, start)
    yield spec
    pid = _pid(spec)
    if pid:
        os.kill(pid, signal.SIGKILL)


def _pid(spec: DaemonSpec) -> int:
    try:
        return int(spec.pidfile.read_text())
    except (OSError, ValueError):
        return 0


def _kill(pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    os.kill(pid, sig)
    deadline = time.monotonic() + 5
    while sig == signal.SIGKILL and _proc_state(pid) not in (None, "Z"):
        assert time.monotonic() < deadline
        time.sleep(0.02)


POLICY = SupervisorPolicy(
    check_s=0, hang_s=2, backoff_initial_s=5, backoff_max_s=20, stable_s=100,
    flap_restarts=3, flap_window_s=60,
)  # fmt: skip


async def test_dead_daemon_is_restarted_with_backoff_and_flapping_is_a_condition(
    daemon: DaemonSpec, tmp_path: Path
) -> None:
    clock = Clock()
    sup = DaemonSupervisor([daemon], state_dir=tmp_path / "state", policy=POLICY, clock=clock)
    assert await sup.check(daemon) == "absent"  # never started: not ours to start
    await sup._run(daemon.start)
    assert await sup.check(daemon) == "up"

    old = _pid(daemon)
    _kill(old)
    assert await sup.check(daemon) == "restarted"  # the first crash: restarted at once
    assert _pid(daemon) != old and _proc_state(_pid(daemon)) in ("S", "R")
    backoffs = [sup._history["slurmd"].backoff_s]
    for _ in range(2):
        _kill(_pid(daemon))
        assert await sup.check(daemon) == "waiting"  # backing off: not restarted yet
        clock.t += backoffs[-1]
        assert await sup.check(daemon) == "restarted"
        backoffs.append(sup._history["slurmd"].backoff_s)
    restarts = 3
    assert backoffs == [5, 10, 20]  # doubling, capped at backoff_max_s
    result = await sup.collect(dt.datetime.now(dt.UTC))
    [cond] = result.conditions
    assert cond.condition == "daemon_flapping" and cond.active and cond.component == "slurmd"
    events = [e for _, e in Outbox(tmp_path / "state").pending(50)]
    assert len(events) == restarts
    assert all(e.kind.value == "node.daemon" and e.data["daemon"] == "slurmd" for e in events)
    assert "dead" in events[0].message and events[0].data["restarted"] is True

    # The history survives an agent restart.
    again = DaemonSupervisor([daemon], state_dir=tmp_path / "state", policy=POLICY, clock=clock)
    assert (await again.collect(dt.datetime.now(dt.UTC))).conditions[0].active

    # Up for stable_s: the backoff resets and the condition clears.
    assert await again.check(daemon) == "up"
    clock.t += POLICY.stable_s
    assert await again.check(daemon) == "up"
    assert again._history["slurmd"].backoff_s == 0
    assert not (await again.collect(dt.datetime.now(dt.UTC))).conditions[0].active


async def test_hung_daemon_is_killed_and_restarted(daemon: DaemonSpec, tmp_path: Path) -> None:
    clock = Clock()
    sup = DaemonSupervisor([daemon], state_dir=tmp_path, policy=POLICY, clock=clock)
    await sup._run(daemon.start)
    hung = _pid(daemon)
    os.kill(hung, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while _proc_state(hung) != "T":
        assert time.monotonic() < deadline
        time.sleep(0.02)  # noqa: ASYNC251 - waiting on another process
    assert await sup.check(daemon) == "hung?"  # not for hang_s yet
    clock.t += POLICY.hang_s
    assert await sup.check(daemon) == "restarted"
    assert _proc_state(hung) in (None, "Z")  # SIGKILLed
    assert _pid(daemon) != hung
    [(_, event)] = Outbox(tmp_path).pending(5)
    assert "hung" in event.message


async def test_a_clean_stop_is_left_alone_and_a_failing_start_is_reported(
    daemon: DaemonSpec, tmp_path: Path
) -> None:
    clock = Clock()
    sup = DaemonSupervisor([daemon], state_dir=tmp_path, policy=POLICY, clock=clock)
    await sup._run(daemon.start)
    assert await sup.check(daemon) == "up"
    _kill(_pid(daemon))
    daemon.pidfile.unlink()  # what `systemctl stop` does
    assert await sup.check(daemon) == "absent"
    broken = DaemonSpec("munge", tmp_path / "m.pid", ("false",))
    (tmp_path / "m.pid").write_text("999999999\n")  # a stale pid file
    sup2 = DaemonSupervisor([broken], state_dir=tmp_path / "s2", policy=POLICY, clock=clock)
    assert await sup2.check(broken) == "restart failed"
    [(_, event)] = Outbox(tmp_path / "s2").pending(5)
    assert event.data["restarted"] is False and "munge" in event.message
