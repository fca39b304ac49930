"""Two projects with one of everything, and a caller of every kind, for the RBAC tests.

Project ``pa`` is the one requests are about; ``pb`` is the other one. Callers:
anonymous, a node token of pa's node, an admin of pb (full power elsewhere), a member of
pa, an admin of pa, and the platform owner; and two admins of pa holding limited tokens:
``capped`` (capped at member, expiring in a day: what an admin hands a CI job) and
``expiring`` (uncapped, expiring in a day). Users and their tokens are made through the
API (owner-only ``POST /users`` and ``POST /tokens`` with ``user``).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import httpx
from apihelpers import add_finding, node_tokens, nodes_of, ready_cluster, report_batch, send_report

from gpufleet.core.clock import utcnow
from gpufleet.core.ids import new_id
from gpufleet.server.db.tables import CredentialRow, HostRow, RepairRow
from gpufleet.testing.app import RunningApp

IDENTITIES = ("anonymous", "node", "other", "member", "admin", "owner", "capped", "expiring")
_serial = itertools.count(1)


def unique(prefix: str) -> str:
    return f"{prefix}{next(_serial)}"


async def ok(response: httpx.Response, *codes: int) -> dict[str, Any]:
    assert response.status_code in (codes or (200, 201, 202)), (
        response.request.method,
        response.request.url,
        response.text,
    )
    body: dict[str, Any] = response.json()
    return body


@dataclass
class Side:
    """One project and one of each of its objects."""

    name: str
    project: dict[str, Any] = field(default_factory=dict)
    cluster: dict[str, Any] = field(default_factory=dict)
    node: dict[str, Any] = field(default_factory=dict)
    node_token: str = ""
    finding_id: str = ""
    repair_id: str = ""
    volume: dict[str, Any] = field(default_factory=dict)
    member: str = ""  # a plain member's user name (not one of the callers)
    token_id: str = ""  # a token of that member
    check_id: str = ""
    command_id: str = ""
    acceptance_id: str = ""
    credential: str = ""  # a credential's name (its row written directly: no key is set)
    host: str = ""  # an inventory host's hostname
    rollout_id: str = ""  # a stack rollout of its cluster, scheduled

    def ids(self) -> dict[str, str]:
        """Every object id of this side, for isolation checks."""
        return {
            "project": self.project["id"],
            "cluster": self.cluster["id"],
            "node": self.node["id"],
            "finding": self.finding_id,
            "repair": self.repair_id,
            "volume": self.volume["id"],
            "token": self.token_id,
            "check": self.check_id,
            "command": self.command_id,
            "acceptance": self.acceptance_id,
            "credential": self.credential,
            "host": self.host,
            "rollout": self.rollout_id,
        }


@dataclass
class World:
    app: RunningApp
    a: Side
    b: Side
    tokens: dict[str, str]  # identity → bearer token (none for anonymous)
    users: dict[str, str]  # identity → user name
    token_ids: dict[str, str] = field(default_factory=dict)  # identity → its token's id

    def client(self, identity: str) -> httpx.AsyncClient:
        if identity == "anonymous":
            return self.app.anonymous()
        return self.app.with_token(self.tokens[identity])

    async def new_user(self, *, project: str | None = None, role: str = "member") -> str:
        name = unique("user")
        await ok(await self.app.client.post("/api/v1/users", json={"name": name}), 201)
        if project is not None:
            await ok(
                await self.app.client.post(
                    f"/api/v1/projects/{project}/members", json={"user": name, "role": role}
                ),
                201,
            )
        return name

    async def token_for(
        self, user: str, *, project: str, role: str | None, days: int | None = None
    ) -> dict[str, Any]:
        body = {"user": user, "project": project, "role": role, "name": unique("t")}
        if days is not None:
            body["expires_in_days"] = days
        return await ok(await self.app.client.post("/api/v1/tokens", json=body), 201)

    async def new_volume(self, side: Side, *, attach: bool = False) -> dict[str, Any]:
        body = {"name": unique("vol"), "size_gb": 100, "mount_path": f"/data/{unique('m')}"}
        url = f"/api/v1/projects/{side.project['name']}/volumes"
        volume = await ok(await self.app.client.post(url, json=body), 201)
        if attach:
            volume = await ok(
                await self.app.client.post(
                    f"{url}/{volume['id']}/attachments", json={"cluster": side.cluster["id"]}
                ),
                201,
            )
        return volume

    async def new_repair(self, side: Side) -> str:
        now = utcnow()
        row = RepairRow(
            id=new_id(),
            cluster_id=side.cluster["id"],
            node_id=side.node["id"],
            action="reboot",
            status="proposed",
            signature_id="xid-79",
            finding_ids=[side.finding_id],
            reason="Xid 79 on GPU 0",
            rule="xid-79 → reboot",
            evidence={},
            created_at=now,
            updated_at=now,
        )
        async with self.app.ctx.db.transaction() as session:
            session.add(row)
        return row.id

    async def new_command(self, side: Side) -> str:
        body = {"argv": ["true"], "timeout_s": 30}
        url = f"/api/v1/nodes/{side.node['id']}/commands"
        return str((await ok(await self.app.client.post(url, json=body), 201))["id"])

    async def new_credential(self, side: Side) -> str:
        """A credential row of the side's project (the app under test has no key: the
        ciphertext is a stand-in, never opened here)."""
        now = utcnow()
        row = CredentialRow(
            id=new_id(), project_id=side.project["id"], name=unique("cred"), kind="bmc_password",
            username="root", ciphertext=b"\0" * 28, key_id="k-none", created_by="test",
            created_at=now, rotated_at=None,
        )  # fmt: skip
        async with self.app.ctx.db.transaction() as session:
            session.add(row)
        return row.name

    async def new_host(self, side: Side) -> str:
        now = utcnow()
        row = HostRow(
            id=new_id(), project_id=side.project["id"], hostname=unique(f"{side.name}-host"),
            bmc_type="redfish", bmc_address="https://10.0.0.9", cluster_id=side.cluster["id"],
            role="spare", state="spare", created_at=now, updated_at=now,
        )  # fmt: skip
        async with self.app.ctx.db.transaction() as session:
            session.add(row)
        return row.hostname

    async def new_cluster(self, side: Side) -> str:
        body = {"project": side.project["name"], "name": unique("c"), "size": 1}
        return str((await ok(await self.app.client.post("/api/v1/clusters", json=body)))["id"])


async def _side(app: RunningApp, name: str) -> Side:
    side = Side(name=name)
    side.project = await ok(await app.client.post("/api/v1/projects", json={"name": name}), 201)
    side.cluster = await ready_cluster(app, project=name, name="train", size=1)
    side.node = (await nodes_of(app, side.cluster["id"]))[0]
    side.node_token = (await node_tokens(app, side.cluster["id"]))[side.node["name"]]
    reported = await send_report(app, side.node_token, report_batch(1, hostname=side.node["name"]))
    assert reported.status_code == 200, reported.text
    side.finding_id = await add_finding(
        app, cluster_id=side.cluster["id"], node_id=side.node["id"], severity="fatal"
    )
    return side


async def build_world(app: RunningApp) -> World:
    a, b = await _side(app, "pa"), await _side(app, "pb")
    world = World(app=app, a=a, b=b, tokens={}, users={})
    stack = {"name": "matrix-stack", "driver": "580.95.05"}
    await ok(await app.client.post("/api/v1/stacks", json=stack), 201)
    for side in (a, b):
        side.repair_id = await world.new_repair(side)
        side.volume = await world.new_volume(side, attach=True)
        side.member = await world.new_user(project=side.name)
        side.token_id = (await world.token_for(side.member, project=side.name, role="member"))[
            "info"
        ]["id"]
        side.command_id = await world.new_command(side)
        check = await app.client.post(
            "/api/v1/checks", json={"cluster": side.cluster["id"], "check": "dcgm-diag"}
        )
        side.check_id = (await ok(check, 201))["id"]
        acceptance = await app.client.post(
            f"/api/v1/clusters/{side.cluster['id']}/acceptance", json={"reason": "matrix"}
        )
        side.acceptance_id = (await ok(acceptance, 202))["id"]
        side.credential = await world.new_credential(side)
        side.host = await world.new_host(side)
        rollout = await app.client.post(
            f"/api/v1/clusters/{side.cluster['id']}/rollouts",
            json={"to_stack": "matrix-stack", "window": "sat 02:00/4h"},
        )
        side.rollout_id = (await ok(rollout, 201))["id"]
    for identity, project, role, cap, days in (
        ("member", "pa", "member", "member", None),
        ("admin", "pa", "admin", "admin", None),
        ("other", "pb", "admin", "admin", None),
        ("capped", "pa", "admin", "member", 1),
        ("expiring", "pa", "admin", None, 1),
    ):
        user = await world.new_user(project=project, role=role)
        world.users[identity] = user
        token = await world.token_for(user, project=project, role=cap, days=days)
        world.tokens[identity] = token["token"]
        world.token_ids[identity] = token["info"]["id"]
        if days is not None:  # the same user's full token, stronger than the limited one
            full = await world.token_for(user, project=project, role=None)
            world.token_ids[f"{identity}-full"] = full["info"]["id"]
    world.tokens["owner"] = app.owner_token
    world.users["owner"] = "admin"
    world.tokens["node"] = a.node_token
    return world
