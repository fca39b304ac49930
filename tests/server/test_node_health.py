"""The node health service, the one writer of node and GPU health: every change of a
node's health writes one ``node.health`` event with the caller's actor."""

from __future__ import annotations

from typing import Any

from apihelpers import create_project, nodes_of, ready_cluster
from sqlalchemy import select

from gpufleet.core.clock import utcnow
from gpufleet.core.enums import EventKind, Health
from gpufleet.server.db.tables import EventRow, NodeRow
from gpufleet.server.services.node_health import set_node_health, stage_node_health
from gpufleet.testing.app import RunningApp


async def _node_id(app: RunningApp) -> str:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=1)
    node_id: str = (await nodes_of(app, cluster["id"]))[0]["id"]
    return node_id


async def _health_events(app: RunningApp, node_id: str) -> list[EventRow]:
    async with app.ctx.db.session() as session:
        return list(
            await session.scalars(
                select(EventRow)
                .where(EventRow.node_id == node_id, EventRow.kind == EventKind.NODE_HEALTH.value)
                .order_by(EventRow.id)
            )
        )


async def test_a_change_writes_one_event_and_the_same_health_again_none(
    app: RunningApp,
) -> None:
    node_id = await _node_id(app)
    before = await _health_events(app, node_id)
    now = utcnow()
    async with app.ctx.db.transaction() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        old = node.health
        target = Health.DEGRADED if old != Health.DEGRADED.value else Health.UNHEALTHY
        changes = [
            set_node_health(
                session,
                node=node,
                project_id="p",
                target=target,
                actor="system:test",
                now=now,
                reason="why",
            )
            for _ in range(2)
        ]
    assert changes == [True, False]
    [event] = (await _health_events(app, node_id))[len(before) :]
    assert (event.actor, event.data) == (
        "system:test",
        {"from": old, "to": target.value, "reason": "why"},
    )
    assert event.message.endswith(f"{old} → {target.value} (why)")
    async with app.ctx.db.session() as session:
        stored = await session.get(NodeRow, node_id)
        assert stored is not None and stored.health == target.value


async def test_staged_health_is_always_in_the_updates_and_an_event_only_on_change(
    app: RunningApp,
) -> None:
    node_id = await _node_id(app)
    now = utcnow()
    async with app.ctx.db.session() as session:
        node = await session.get(NodeRow, node_id)
        assert node is not None
        same = Health(node.health)
        other = Health.UNHEALTHY if same is not Health.UNHEALTHY else Health.HEALTHY
        updates: dict[str, Any] = {}

        def stage(target: Health) -> dict[str, Any] | None:
            assert node is not None
            return stage_node_health(
                node,
                updates=updates,
                project_id="p",
                target=target,
                actor="node:n",
                now=now,
                reason="1 of 8 GPUs reporting",
            )

        assert stage(same) is None
        assert updates == {"health": same.value}
        event = stage(other)
        assert updates == {"health": other.value} and node.health == other.value
        assert event is not None
        assert (event["kind"], event["actor"], event["node_id"]) == (
            "node.health",
            "node:n",
            node_id,
        )
        assert event["data"] == {
            "from": same.value,
            "to": other.value,
            "reason": "1 of 8 GPUs reporting",
        }
        await session.rollback()
