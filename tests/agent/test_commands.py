"""The agent's command runner and journal, with real processes.

Exit codes, timeouts (SIGTERM, then SIGKILL), cancels, whole process groups killed,
bounded output tails, the environment a command gets, and the journal that turns a
command an agent crash interrupted into a failed result (killing what it left behind).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.agent.command_runner import AGENT_STOPPED, proc_start_time, run_command
from gpufleet.agent.commands import CommandJournal
from gpufleet.core.agent_protocol import (
    AGENT_RESTARTED,
    RESULT_BODY_BUDGET,
    CommandResult,
    NodeCommand,
    script_argv,
)
from gpufleet.core.ids import new_id

BOOT = "boot-test"


def command(argv: list[str], **extra: object) -> NodeCommand:
    now = dt.datetime.now(dt.UTC)
    values: dict[str, object] = {
        "id": new_id(),
        "argv": argv,
        "timeout_s": 30.0,
        "created_at": now,
        "expires_at": now + dt.timedelta(minutes=10),
        **extra,
    }
    return NodeCommand.model_validate(values)


async def run(
    cmd: NodeCommand,
    *,
    cancel: asyncio.Event | None = None,
    kill_grace_s: float = 5.0,
    env: dict[str, str] | None = None,
) -> CommandResult:
    pids: list[int] = []
    result = await run_command(
        cmd,
        boot_id=BOOT,
        kill_grace_s=kill_grace_s,
        cancel=cancel or asyncio.Event(),
        on_started=pids.append,
        base_env=env,
    )
    assert len(pids) == (0 if result.error else 1)
    return result


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_dead(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return False


async def test_exit_codes_and_output() -> None:
    ok = await run(command(["echo", "hello"]))
    assert (ok.exit_code, ok.signal, ok.timed_out, ok.error) == (0, None, False, None)
    assert ok.stdout == "hello\n" and ok.stdout_bytes == 6 and not ok.stdout_truncated
    assert ok.started_at is not None and ok.started_at <= ok.finished_at
    bad = await run(command(script_argv("echo oops >&2; exit 3")))
    assert bad.exit_code == 3 and bad.stderr == "oops\n" and bad.stdout == ""


async def test_a_program_that_cannot_start_is_an_error() -> None:
    missing = await run(command(["/nonexistent/dcgmi", "diag", "-r", "3"]))
    assert missing.exit_code is None and missing.signal is None and missing.started_at is None
    assert missing.error is not None and "/nonexistent/dcgmi" in missing.error
    not_here = await run(command(["true"], cwd="/nonexistent-dir"))
    assert not_here.error is not None


async def test_timeout_terminates_then_kills() -> None:
    polite = await run(command(["sleep", "30"], timeout_s=0.3))
    assert polite.timed_out and polite.signal == signal.SIGTERM and polite.exit_code is None
    # A process that ignores SIGTERM gets SIGKILL after the grace.
    stubborn = await run(
        command(script_argv("trap '' TERM; sleep 30 & wait; sleep 30"), timeout_s=0.3),
        kill_grace_s=0.3,
    )
    assert stubborn.timed_out and stubborn.signal == signal.SIGKILL


async def test_the_whole_process_group_dies(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    # On a timeout: the script and the child it started.
    timed = await run(command(script_argv(f"sleep 300 & echo $! > {pidfile}; wait"), timeout_s=0.5))
    assert timed.timed_out
    assert wait_dead(int(pidfile.read_text()))
    # After a normal exit: a leftover holding stdout open is killed, the run returns.
    pidfile.unlink()
    left = await run(command(script_argv(f"sleep 300 & echo $! > {pidfile}; echo done")))
    assert left.exit_code == 0 and left.stdout == "done\n"
    assert wait_dead(int(pidfile.read_text()))


async def test_a_process_that_left_the_group_does_not_hold_the_result(tmp_path: Path) -> None:
    pidfile = tmp_path / "daemon.pid"
    script = (
        f"setsid sh -c 'echo $$ > {pidfile}.tmp; mv {pidfile}.tmp {pidfile}; exec sleep 300' & "
        f"while [ ! -s {pidfile} ]; do sleep 0.01; done; echo started"
    )
    try:
        result = await run(command(script_argv(script)))
        assert result.exit_code == 0 and result.stdout == "started\n"
        assert alive(int(pidfile.read_text()))  # it was out of reach, as it meant to be
    finally:
        if pidfile.exists():
            os.kill(int(pidfile.read_text()), signal.SIGKILL)


async def test_a_cancel_kills_it() -> None:
    cancel = asyncio.Event()
    task = asyncio.create_task(run(command(["sleep", "30"]), cancel=cancel))
    await asyncio.sleep(0.2)
    cancel.set()
    result = await asyncio.wait_for(task, timeout=10)
    assert result.cancelled and not result.timed_out and result.signal == signal.SIGTERM


async def test_output_keeps_the_last_bytes() -> None:
    many = await run(
        command(
            script_argv("head -c 200000 /dev/zero | tr '\\0' a; printf END; echo tail >&2"),
            max_output_bytes=1000,
        )
    )
    assert many.stdout_bytes == 200_003 and many.stdout_truncated
    assert len(many.stdout) == 1000 and many.stdout.endswith("aaaEND")
    assert many.stderr == "tail\n" and not many.stderr_truncated
    # A cut through a UTF-8 character drops its leftover bytes: 1000 // 3 whole euros.
    euros = await run(command(["printf", "€" * 1000], max_output_bytes=1000))
    assert euros.stdout == "€" * 333 and euros.stdout_truncated and euros.stdout_bytes == 3000


async def test_output_that_escapes_badly_still_fits_one_request() -> None:
    # \x01 is 1 byte of output and 6 of JSON: 2 × 256 KiB would make a 3 MiB body.
    script = "head -c 262144 /dev/zero | tr '\\0' '\\001'; head -c 262144 /dev/zero >&2"
    result = await run(command(script_argv(script), max_output_bytes=262_144))
    assert len(result.model_dump_json().encode()) <= RESULT_BODY_BUDGET
    assert result.stdout_truncated and result.stdout_bytes == 262_144
    assert result.stdout and set(result.stdout) == {"\x01"}


async def test_environment_and_working_directory(tmp_path: Path) -> None:
    base = {"PATH": os.environ["PATH"], "GPUFLEET_AGENT_NODE_TOKEN": "gpfn_secret", "KEEP": "1"}
    cmd = command(
        script_argv(
            'echo "$KEEP $EXTRA $GPUFLEET_COMMAND_ID ${GPUFLEET_AGENT_NODE_TOKEN:-none}"; pwd'
        ),
        env={"EXTRA": "x y"},
        cwd=str(tmp_path),
    )
    result = await run(cmd, env=base)
    assert result.stdout == f"1 x y {cmd.id} none\n{tmp_path}\n"
    no_cwd = await run(command(["pwd"]))
    assert no_cwd.stdout == "/\n"


async def test_an_agent_stop_kills_the_command(tmp_path: Path) -> None:
    pids: list[int] = []
    task = asyncio.create_task(
        run_command(
            command(["sleep", "30"]),
            boot_id=BOOT,
            kill_grace_s=5,
            cancel=asyncio.Event(),
            on_started=pids.append,
        )
    )
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert wait_dead(pids[0])
    assert AGENT_STOPPED  # what the channel records for it (see test_node_commands)


def test_journal_keeps_results_until_forgotten(tmp_path: Path) -> None:
    journal = CommandJournal(tmp_path)
    cmd = command(["true"])
    journal.begin(cmd, boot_id=BOOT)
    assert cmd.id in journal and journal.ids() == [cmd.id] and journal.results() == []
    result = CommandResult(
        id=cmd.id, agent_boot_id=BOOT, exit_code=0, finished_at=dt.datetime.now(dt.UTC)
    )
    journal.finish(result)
    # A new agent on the same state dir sends it again; it is not "recovered" as failed.
    again = CommandJournal(tmp_path)
    assert again.recover(boot_id="boot-2") == []
    assert again.results() == [result]
    again.forget(cmd.id)
    assert again.ids() == [] and cmd.id not in again
    (tmp_path / "commands" / f"{new_id()}.json").write_text("{torn")
    assert again.results() == [] and len(list((tmp_path / "commands").glob("*.bad"))) == 1


def test_recovery_fails_a_command_an_earlier_agent_ran_and_kills_its_group(
    tmp_path: Path,
) -> None:
    leftover = subprocess.Popen(
        ["sh", "-c", "sleep 300 & wait"], start_new_session=True, stdin=subprocess.DEVNULL
    )
    try:
        journal = CommandJournal(tmp_path)
        cmd = command(["sleep", "300"])
        journal.begin(cmd, boot_id="boot-1")
        journal.started(cmd.id, pid=leftover.pid)
        never = command(["true"])
        journal.begin(never, boot_id="boot-1")  # the crash came before it started
        recovered = CommandJournal(tmp_path).recover(boot_id="boot-2")
        assert sorted(recovered) == sorted([cmd.id, never.id])
        assert leftover.wait(timeout=10) == -signal.SIGKILL
        results = {r.id: r for r in journal.results()}
        ran = results[cmd.id]
        assert ran.error is not None and ran.error.startswith(AGENT_RESTARTED)
        assert f"killed process group {leftover.pid}" in ran.error
        assert ran.agent_boot_id == "boot-2" and ran.started_at is not None
        assert ran.exit_code is None and ran.signal is None
        assert results[never.id].error == AGENT_RESTARTED and results[never.id].started_at is None
    finally:
        if leftover.poll() is None:
            os.killpg(leftover.pid, signal.SIGKILL)
            leftover.wait()


def test_recovery_never_kills_a_reused_pid(tmp_path: Path) -> None:
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        journal = CommandJournal(tmp_path)
        cmd = command(["sleep", "300"])
        journal.begin(cmd, boot_id="boot-1")
        journal.started(cmd.id, pid=stranger.pid)
        entry = journal.load(cmd.id)
        assert entry is not None and entry["pid_start"] == proc_start_time(stranger.pid)
        # As if our command's pid had been handed to this process since.
        entry["pid_start"] -= 1
        (tmp_path / "commands" / f"{cmd.id}.json").write_text(json.dumps(entry))
        journal.recover(boot_id="boot-2")
        assert stranger.poll() is None
        [result] = journal.results()
        assert result.error == AGENT_RESTARTED
    finally:
        stranger.kill()
        stranger.wait()


def test_recovery_after_a_reboot_kills_nothing(tmp_path: Path) -> None:
    """A new kernel boot id (read from the agent's ``boot_id_file``) says nothing of the
    earlier run survived: a process with the recorded pid now is someone else's."""
    boot_id_file = tmp_path / "boot_id"
    boot_id_file.write_text("11111111-aaaa\n")
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        journal = CommandJournal(tmp_path / "state", boot_id_file=boot_id_file)
        cmd = command(["sleep", "300"])
        journal.begin(cmd, boot_id="agent-1")
        journal.started(cmd.id, pid=stranger.pid)
        entry = journal.load(cmd.id)
        assert entry is not None and entry["kernel_boot_id"] == "11111111-aaaa"
        boot_id_file.write_text("22222222-bbbb\n")  # the machine booted again
        again = CommandJournal(tmp_path / "state", boot_id_file=boot_id_file)
        assert again.recover(boot_id="agent-2") == [cmd.id]
        assert stranger.poll() is None
        [result] = again.results()
        assert result.error == AGENT_RESTARTED
    finally:
        stranger.kill()
        stranger.wait()
