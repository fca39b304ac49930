"""The command channel's server side: queue, hand out, answer, cancel, expire.

Every test runs on SQLite and PostgreSQL (the ``app`` / ``clocked_app`` fixtures). The
agent's side is driven over the real agent endpoints with real node tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from pathlib import Path
from typing import Any

import httpx
import pytest
from apihelpers import create_project, error_of, node_tokens, nodes_of, ready_cluster
from sqlalchemy import func, select

from gpufleet.agent.commands import CommandChannel, CommandJournal
from gpufleet.client.agent import AgentClient
from gpufleet.core.agent_protocol import (
    AGENT_RESTARTED,
    MAX_EXPIRES_IN_S,
    NodeCommand,
    script_argv,
)
from gpufleet.core.clock import FakeClock
from gpufleet.core.ids import new_id
from gpufleet.server.db.engine import Database
from gpufleet.server.db.tables import AuditLogRow, EventRow, NodeCommandRow
from gpufleet.server.services.command_records import ANSWER_GRACE_S
from gpufleet.server.services.command_signals import signals_for
from gpufleet.server.services.node_commands import (
    RETENTION_S,
    enqueue_command,
    get_command,
    list_commands,
)
from gpufleet.server.workers.base import LoopDeps
from gpufleet.server.workers.node_commands import CommandExpiryLoop
from gpufleet.testing.app import RunningApp
from gpufleet.testing.waits import eventually

BOOT = "boot-1"


async def two_nodes(app: RunningApp) -> tuple[list[dict[str, Any]], dict[str, str]]:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=2)
    nodes = sorted(await nodes_of(app, cluster["id"]), key=lambda n: n["name"])
    tokens = await node_tokens(app, cluster["id"])
    return nodes, {n["id"]: tokens[n["name"]] for n in nodes}


async def run(app: RunningApp, node_id: str, **body: Any) -> dict[str, Any]:
    response = await app.client.post(
        f"/api/v1/nodes/{node_id}/commands", json={"timeout_s": 30, **body}
    )
    assert response.status_code == 201, response.text
    record: dict[str, Any] = response.json()
    return record


async def poll(
    app: RunningApp, token: str, *, have: list[str] | None = None, **params: Any
) -> httpx.Response:
    query: dict[str, Any] = {"boot_id": BOOT, **params}
    if have:
        query["have"] = have
    async with app.with_token(token) as agent:
        return await agent.get("/api/v1/agent/commands", params=query)


async def answer(app: RunningApp, token: str, command_id: str, **result: Any) -> httpx.Response:
    now = dt.datetime.now(dt.UTC).isoformat()
    body = {
        "id": command_id,
        "agent_boot_id": BOOT,
        "started_at": now,
        "finished_at": now,
        **result,
    }
    if not {"exit_code", "signal", "error"} & set(result):
        body["exit_code"] = 0
    async with app.with_token(token) as agent:
        return await agent.post(f"/api/v1/agent/commands/{command_id}/result", json=body)


async def record_of(app: RunningApp, node_id: str, command_id: str) -> dict[str, Any]:
    response = await app.client.get(f"/api/v1/nodes/{node_id}/commands/{command_id}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def count(app: RunningApp, table: Any, **where: Any) -> int:
    async with app.ctx.db.session() as session:
        query = select(func.count()).select_from(table)
        for name, value in where.items():
            query = query.where(getattr(table, name) == value)
        return int(await session.scalar(query) or 0)


async def test_a_command_is_taken_answered_and_stored_once(app: RunningApp) -> None:
    (node, _other), tokens = await two_nodes(app)
    queued = await run(app, node["id"], argv=["echo", "ok"], env={"A": "secret"}, purpose="smoke")
    assert queued["status"] == "pending" and queued["env_names"] == ["A"]
    assert "secret" not in str(queued)

    got = await poll(app, tokens[node["id"]])
    assert got.status_code == 200, got.text
    [command] = got.json()["commands"]
    assert command["argv"] == ["echo", "ok"] and command["env"] == {"A": "secret"}
    assert command["id"] == queued["id"] and got.json()["cancel"] == []
    sent = await record_of(app, node["id"], queued["id"])
    assert sent["status"] == "sent" and sent["agent_boot_id"] == BOOT and sent["deliveries"] == 1
    again = await poll(app, tokens[node["id"]], have=[queued["id"]])
    assert again.json() == {"commands": [], "cancel": []}

    first = await answer(app, tokens[node["id"]], queued["id"], stdout="ok\n", stdout_bytes=3)
    assert first.status_code == 200, first.text
    assert first.json() == {
        "id": queued["id"],
        "status": "succeeded",
        "duplicate": False,
        "late": False,
    }
    twice = await answer(app, tokens[node["id"]], queued["id"], stdout="other\n")
    assert twice.status_code == 200
    assert twice.json()["duplicate"] is True and twice.json()["status"] == "succeeded"
    done = await record_of(app, node["id"], queued["id"])
    assert done["result"]["stdout"] == "ok\n" and done["result"]["exit_code"] == 0
    assert done["status"] == "succeeded" and done["late_result"] is False

    listed = await app.client.get(f"/api/v1/nodes/{node['id']}/commands")
    assert [c["id"] for c in listed.json()["items"]] == [queued["id"]]
    quiet = await app.client.get(f"/api/v1/nodes/{node['id']}/commands", params={"output": False})
    assert quiet.json()["items"][0]["result"]["stdout"] == ""
    # queued, pending → sent, sent → succeeded: one event and one audit row each.
    assert await count(app, EventRow, kind="node.command") == 3
    async with app.ctx.db.session() as session:
        actions = list(
            await session.scalars(
                select(AuditLogRow.action)
                .where(AuditLogRow.object_id == queued["id"])
                .order_by(AuditLogRow.id)
            )
        )
    assert actions == ["command.create", "command.status", "command.status"]


async def test_failures_and_timeouts_get_their_status(app: RunningApp) -> None:
    (node, _), tokens = await two_nodes(app)
    token = tokens[node["id"]]
    ids = [(await run(app, node["id"], argv=["x", str(i)]))["id"] for i in range(4)]
    got = await poll(app, token, max=4)
    assert [c["id"] for c in got.json()["commands"]] == ids  # oldest first
    await answer(app, token, ids[0], exit_code=3, stderr="boom")
    await answer(app, token, ids[1], signal=9, timed_out=True)
    await answer(app, token, ids[2], error="No such file or directory: 'x'")
    await answer(app, token, ids[3], signal=11)
    statuses = [(await record_of(app, node["id"], i))["status"] for i in ids]
    assert statuses == ["failed", "timed_out", "failed", "failed"]
    reasons = [(await record_of(app, node["id"], i))["status_reason"] for i in ids]
    assert reasons[0] == "exit 3" and reasons[3] == "killed by signal 11"
    assert reasons[1].startswith("timed out")


async def test_server_code_queues_through_the_service(app: RunningApp) -> None:
    (node, _), tokens = await two_nodes(app)
    async with app.ctx.db.transaction() as session:
        row = await enqueue_command(
            session,
            node_id=node["id"],
            argv=script_argv("echo ok"),
            timeout_s=60,
            purpose="startup script 1/1",
            requested_by="system:startup",
            ref="startup:run-1",
        )
    got = await poll(app, tokens[node["id"]])
    assert got.json()["commands"][0]["argv"] == ["/bin/sh", "-c", "echo ok"]
    await answer(app, tokens[node["id"]], row.id, stdout="ok\n")
    async with app.ctx.db.session() as session:
        [record] = await list_commands(session, ref="startup:run-1")
        assert record.result is not None and record.result.stdout == "ok\n"
        assert (await get_command(session, command_id=row.id)).status == "succeeded"


async def test_a_node_sees_and_answers_only_its_own_commands(app: RunningApp) -> None:
    (a, b), tokens = await two_nodes(app)
    queued = await run(app, a["id"], argv=["true"])
    got_b = await poll(app, tokens[b["id"]], have=[queued["id"]])
    assert got_b.json() == {"commands": [], "cancel": []}
    # B cannot answer A's command: 404 as for a command that does not exist.
    wrong = await answer(app, tokens[b["id"]], queued["id"])
    assert wrong.status_code == 404, wrong.text
    assert error_of(wrong)["field"] == "command_id"
    assert (await answer(app, tokens[b["id"]], new_id())).status_code == 404
    assert (await record_of(app, a["id"], queued["id"]))["status"] == "pending"
    [taken] = (await poll(app, tokens[a["id"]])).json()["commands"]
    assert (await answer(app, tokens[b["id"]], taken["id"])).status_code == 404
    assert (await record_of(app, a["id"], taken["id"]))["result"] is None
    # A user's token does not work on agent endpoints, nor a node token on user ones.
    async with app.with_token(app.owner_token) as user:
        refused = await user.get("/api/v1/agent/commands", params={"boot_id": BOOT})
    assert refused.status_code == 401
    async with app.with_token(tokens[a["id"]]) as agent:
        assert (await agent.get(f"/api/v1/nodes/{a['id']}/commands")).status_code == 401
    async with app.anonymous() as anonymous:
        assert (
            await anonymous.get("/api/v1/agent/commands", params={"boot_id": BOOT})
        ).status_code == 401


async def test_a_lost_answer_is_handed_out_again(app: RunningApp) -> None:
    (node, _), tokens = await two_nodes(app)
    token = tokens[node["id"]]
    queued = await run(app, node["id"], argv=["true"])
    assert len((await poll(app, token)).json()["commands"]) == 1
    # The agent never got it (the answer was lost): it does not list it in `have`.
    again = await poll(app, token)
    assert [c["id"] for c in again.json()["commands"]] == [queued["id"]]
    assert (await record_of(app, node["id"], queued["id"]))["deliveries"] == 2
    # Listed: never again, even with room for more.
    assert (await poll(app, token, have=[queued["id"]], max=4)).json()["commands"] == []
    # max=0 (the agent is busy): nothing handed out at all.
    second = await run(app, node["id"], argv=["true"])
    assert (await poll(app, token, have=[queued["id"]], max=0)).json()["commands"] == []
    assert (await record_of(app, node["id"], second["id"]))["status"] == "pending"


async def test_a_cancelled_command_is_killed_and_its_late_result_kept(app: RunningApp) -> None:
    (node, _), tokens = await two_nodes(app)
    token = tokens[node["id"]]
    pending = await run(app, node["id"], argv=["sleep", "100"])
    cancelled = await app.client.post(
        f"/api/v1/nodes/{node['id']}/commands/{pending['id']}/cancel", json={"reason": "oops"}
    )
    assert cancelled.status_code == 200, cancelled.text
    assert cancelled.json()["status"] == "cancelled"
    assert "oops" in cancelled.json()["status_reason"]
    assert (await poll(app, token)).json()["commands"] == []  # never handed out

    running = await run(app, node["id"], argv=["sleep", "100"])
    await poll(app, token)
    await app.client.post(f"/api/v1/nodes/{node['id']}/commands/{running['id']}/cancel")
    told = await poll(app, token, have=[running["id"]])
    assert told.json() == {"commands": [], "cancel": [running["id"]]}
    late = await answer(app, token, running["id"], signal=15, cancelled=True)
    assert late.json() == {
        "id": running["id"],
        "status": "cancelled",
        "duplicate": False,
        "late": True,
    }
    record = await record_of(app, node["id"], running["id"])
    assert record["status"] == "cancelled" and record["late_result"] is True
    assert record["result"]["signal"] == 15
    assert (await poll(app, token, have=[running["id"]])).json()["cancel"] == []
    # Cancelling again is a no-op; a command that ended cannot be cancelled.
    again = await app.client.post(f"/api/v1/nodes/{node['id']}/commands/{running['id']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    done = await run(app, node["id"], argv=["true"])
    await poll(app, token, have=[running["id"]])
    await answer(app, token, done["id"])
    ended = await app.client.post(f"/api/v1/nodes/{node['id']}/commands/{done['id']}/cancel")
    assert ended.status_code == 409, ended.text


async def test_commands_expire_untaken_or_unanswered(
    clocked_app: RunningApp, clock: FakeClock
) -> None:
    app = clocked_app
    (node, _), tokens = await two_nodes(app)
    token = tokens[node["id"]]
    loop = CommandExpiryLoop(
        LoopDeps(db=app.ctx.db, clock=clock, owner="test", lease_ttl_s=10), interval_s=1
    )
    untaken = await run(app, node["id"], argv=["true"], expires_in_s=60)
    clock.advance(59)
    await loop.run_once()
    assert (await record_of(app, node["id"], untaken["id"]))["status"] == "pending"
    clock.advance(2)
    assert (await poll(app, token)).json()["commands"] == []  # past expires_at: not handed out
    await loop.run_once()
    expired = await record_of(app, node["id"], untaken["id"])
    assert expired["status"] == "expired" and "no agent took it" in expired["status_reason"]

    taken = await run(app, node["id"], argv=["sleep", "30"], timeout_s=30)
    await poll(app, token)
    clock.advance(30 + ANSWER_GRACE_S - 1)
    await loop.run_once()
    assert (await record_of(app, node["id"], taken["id"]))["status"] == "sent"
    clock.advance(2)
    await loop.run_once()
    assert (await record_of(app, node["id"], taken["id"]))["status"] == "expired"
    told = await poll(app, token, have=[taken["id"]])
    assert told.json()["cancel"] == [taken["id"]]
    late = await answer(app, token, taken["id"], exit_code=0)
    assert late.json()["late"] is True and late.json()["status"] == "expired"

    # A month on, ended commands are deleted; one still waiting is not.
    waiting = await run(app, node["id"], argv=["true"], expires_in_s=MAX_EXPIRES_IN_S)
    clock.advance(RETENTION_S + 1)
    await loop.run_once()  # the waiting one expires now; the two older ones go
    listed = (await app.client.get(f"/api/v1/nodes/{node['id']}/commands")).json()["items"]
    assert [c["id"] for c in listed] == [waiting["id"]]
    assert listed[0]["status"] == "expired"


async def test_a_waiting_poll_returns_when_a_command_is_queued(app: RunningApp) -> None:
    (node, _), tokens = await two_nodes(app)
    signals = signals_for(app.ctx.db, clock=app.ctx.clock)
    waiting = asyncio.create_task(poll(app, tokens[node["id"]], wait_s=20))
    await eventually(lambda: signals.watched, what="the poll waiting")
    assert signals.watched == 1
    queued = await run(app, node["id"], argv=["true"])
    got = await asyncio.wait_for(waiting, timeout=15)
    assert [c["id"] for c in got.json()["commands"]] == [queued["id"]]
    assert signals.watched == 0

    # A cancel reaches a waiting poll too (the agent listed the command as running).
    waiting = asyncio.create_task(poll(app, tokens[node["id"]], wait_s=20, have=[queued["id"]]))
    await eventually(lambda: signals.watched, what="the poll waiting")
    await app.client.post(f"/api/v1/nodes/{node['id']}/commands/{queued['id']}/cancel")
    got = await asyncio.wait_for(waiting, timeout=15)
    assert got.json() == {"commands": [], "cancel": [queued["id"]]}
    # Nothing to hand out: the poll ends empty after wait_s.
    empty = await poll(app, tokens[node["id"]], wait_s=0.2, have=[queued["id"]])
    assert empty.json() == {"commands": [], "cancel": [queued["id"]]}


async def test_reports_say_when_commands_wait(app: RunningApp) -> None:
    (node, _), tokens = await two_nodes(app)
    token = tokens[node["id"]]

    async def report() -> bool:
        now = dt.datetime.now(dt.UTC)
        seq = int(now.timestamp() * 1e6)
        batch = {"reports": [{"seq": seq, "sampled_at": now.isoformat(), "gpus": []}]}
        async with app.with_token(token) as agent:
            response = await agent.post("/api/v1/agent/reports", json=batch)
        assert response.status_code == 200, response.text
        waiting: bool = response.json()["commands_waiting"]
        return waiting

    assert await report() is False
    await run(app, node["id"], argv=["true"])
    assert await report() is True
    await poll(app, token)
    assert await report() is False


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"argv": []}, "argv"),
        ({"argv": [""]}, "argv"),
        ({"argv": ["echo", "a\u0000b"]}, "argv"),
        ({"argv": ["echo", "x" * 131_072]}, "argv"),
        ({"argv": ["true"], "env": {"1BAD": "x"}}, "env"),
        ({"argv": ["true"], "timeout_s": 0}, "timeout_s"),
        ({"argv": ["true"], "timeout_s": 86_401}, "timeout_s"),
        ({"argv": ["true"], "cwd": "relative/dir"}, "cwd"),
        ({"argv": ["true"], "max_output_bytes": 10_000_000}, "max_output_bytes"),
        ({"argv": ["true"], "expires_in_s": -1}, "expires_in_s"),
        ({"argv": "echo hi"}, "argv"),
        ({"argv": ["true"], "shell": True}, "shell"),
    ],
)
async def test_bad_commands_are_refused_and_nothing_written(
    app: RunningApp, body: dict[str, Any], field: str
) -> None:
    (node, _), _tokens = await two_nodes(app)
    events = await count(app, EventRow)
    response = await app.client.post(
        f"/api/v1/nodes/{node['id']}/commands", json={"timeout_s": 30, **body}
    )
    assert response.status_code == 422, response.text
    assert error_of(response)["field"] == field
    assert await count(app, NodeCommandRow) == 0
    assert await count(app, EventRow) == events


async def test_bad_agent_input_is_refused(app: RunningApp) -> None:
    (node, _), tokens = await two_nodes(app)
    token = tokens[node["id"]]
    queued = await run(app, node["id"], argv=["true"])
    await poll(app, token)
    assert error_of(await poll(app, token, have=["not-an-id"]))["field"] == "have"
    bad_boot = await poll(app, token, boot_id="has spaces")
    assert bad_boot.status_code == 422 and error_of(bad_boot)["field"] == "boot_id"
    assert (await poll(app, token, wait_s=60)).status_code == 422
    both = await answer(app, token, queued["id"], exit_code=0, signal=9)
    assert both.status_code == 422
    neither = await answer(app, token, queued["id"], error="")
    assert neither.status_code == 422
    other_id = await answer(app, token, queued["id"], id=new_id())
    assert other_id.status_code == 422 and error_of(other_id)["field"] == "id"
    assert (await record_of(app, node["id"], queued["id"]))["status"] == "sent"


async def test_members_read_commands_admins_run_them(app: RunningApp) -> None:
    (node, _), _tokens = await two_nodes(app)
    queued = await run(app, node["id"], argv=["true"])
    created = await app.client.post(
        "/api/v1/tokens", json={"project": "ml", "role": "member", "name": "member"}
    )
    assert created.status_code == 201, created.text
    async with app.with_token(created.json()["token"]) as member:
        listed = await member.get(f"/api/v1/nodes/{node['id']}/commands")
        assert listed.status_code == 200 and len(listed.json()["items"]) == 1
        ran = await member.post(
            f"/api/v1/nodes/{node['id']}/commands", json={"argv": ["true"], "timeout_s": 5}
        )
        assert ran.status_code == 403, ran.text
        cancel = await member.post(f"/api/v1/nodes/{node['id']}/commands/{queued['id']}/cancel")
        assert cancel.status_code == 403
    await create_project(app.client, "other")
    outsider = await app.client.post(
        "/api/v1/tokens", json={"project": "other", "role": "admin", "name": "outsider"}
    )
    async with app.with_token(outsider.json()["token"]) as stranger:
        for path in ("", f"/{queued['id']}"):
            hidden = await stranger.get(f"/api/v1/nodes/{node['id']}/commands{path}")
            assert hidden.status_code == 404, hidden.text
    assert await count(app, NodeCommandRow) == 1


async def wait_for_status(
    app: RunningApp, node_id: str, command_id: str, statuses: set[str], timeout_s: float = 20
) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        record = await record_of(app, node_id, command_id)
        if record["status"] in statuses and (
            record["result"] is not None or record["status"] not in {"succeeded", "failed"}
        ):
            return record
        return None

    found: dict[str, Any] = await eventually(
        reached, timeout_s=timeout_s, poll_s=0.05, what=f"command {command_id} {statuses}"
    )
    return found


async def test_the_agent_channel_runs_what_the_server_queues(
    app: RunningApp, tmp_path: Path
) -> None:
    (node, _), tokens = await two_nodes(app)
    async with app.agent_http() as http:
        client = AgentClient(base_url="http://test", node_token=tokens[node["id"]], http=http)
        channel = CommandChannel(
            client,
            CommandJournal(tmp_path),
            boot_id="agent-1",
            wait_s=2.0,
            kill_grace_s=0.3,
            concurrency=2,
        )
        running = asyncio.create_task(channel.run())
        try:
            echo = await run(app, node["id"], argv=["echo", "hello"])
            fail = await run(app, node["id"], argv=script_argv("echo no >&2; exit 3"))
            slow = await run(app, node["id"], argv=["sleep", "30"], timeout_s=0.5)
            done = await wait_for_status(app, node["id"], echo["id"], {"succeeded"})
            assert done["result"]["stdout"] == "hello\n" and done["agent_boot_id"] == "agent-1"
            failed = await wait_for_status(app, node["id"], fail["id"], {"failed"})
            assert failed["result"]["exit_code"] == 3 and failed["result"]["stderr"] == "no\n"
            timed = await wait_for_status(app, node["id"], slow["id"], {"timed_out"})
            assert timed["result"]["signal"] == 15
            # A cancel reaches the running command through the poll; it is killed.
            sleeper = await run(app, node["id"], argv=["sleep", "30"])
            await wait_for_status(app, node["id"], sleeper["id"], {"sent"})
            await eventually(lambda: sleeper["id"] in channel.started, what="the sleeper started")
            await app.client.post(f"/api/v1/nodes/{node['id']}/commands/{sleeper['id']}/cancel")

            async def killed() -> dict[str, Any] | None:
                record = await record_of(app, node["id"], sleeper["id"])
                return record if record["result"] is not None else None

            record = await eventually(
                killed, timeout_s=20, poll_s=0.05, what="the sleeper's late result"
            )
            assert record["status"] == "cancelled" and record["late_result"] is True
            assert record["result"]["cancelled"] is True
            assert channel.journal.ids() == []
            assert sorted(channel.started) == sorted(
                [echo["id"], fail["id"], slow["id"], sleeper["id"]]
            )
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running


async def test_a_command_an_agent_crash_interrupted_is_reported_failed(
    app: RunningApp, tmp_path: Path
) -> None:
    (node, _), tokens = await two_nodes(app)
    queued = await run(app, node["id"], argv=["sleep", "300"])
    [command] = (await poll(app, tokens[node["id"]])).json()["commands"]
    # The agent journalled it and died before it could start it.
    CommandJournal(tmp_path).begin(NodeCommand.model_validate(command), boot_id=BOOT)
    async with app.agent_http() as http:
        client = AgentClient(base_url="http://test", node_token=tokens[node["id"]], http=http)
        channel = CommandChannel(client, CommandJournal(tmp_path), boot_id="agent-2", wait_s=1)
        running = asyncio.create_task(channel.run())
        try:
            record = await wait_for_status(app, node["id"], queued["id"], {"failed"})
        finally:
            running.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await running
    assert record["result"]["error"] == AGENT_RESTARTED
    assert record["result"]["agent_boot_id"] == "agent-2" and record["deliveries"] == 1
    assert channel.started == []  # reported, never run again


async def test_a_command_queued_on_another_replica_wakes_the_poll(app: RunningApp) -> None:
    (node, _), tokens = await two_nodes(app)
    signals = signals_for(app.ctx.db, clock=app.ctx.clock)
    waiting = asyncio.create_task(poll(app, tokens[node["id"]], wait_s=15))
    await eventually(lambda: signals.watched, what="the poll waiting")
    # Another replica: its own engine on the same database; nothing in this process
    # hears of its commit, so only the once-a-second read of the store can wake the poll.
    other = Database(app.ctx.settings.resolved_database_url())
    try:
        async with other.transaction() as session:
            row = await enqueue_command(
                session,
                node_id=node["id"],
                argv=["true"],
                timeout_s=5,
                purpose="from replica 2",
                requested_by="system:test",
            )
    finally:
        await other.dispose()
    refreshes = signals.refreshes
    got = await asyncio.wait_for(waiting, timeout=20)
    assert [c["id"] for c in got.json()["commands"]] == [row.id]
    assert signals.refreshes > refreshes  # woken by a read of the store
