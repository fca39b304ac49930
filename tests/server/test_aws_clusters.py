"""An aws cluster end to end against moto's server mode: created through the API with its
provider configuration and a stored aws_key, provisioned by the server's own loop (the
instances appear in moto, tagged and in the Auto Scaling group), its nodes in service,
then failed over and reprovisioned by approved repairs (the old instance terminated in
moto, the new one in the group, the node back in service) — and the reach check of its
instances. On SQLite and PostgreSQL.

moto launches no machine, so a stand-in plays the AMI's bootstrap, and is named as one
(``UserDataBootstrap``): for every running instance of the cluster it reads the user data
from moto (``DescribeInstanceAttribute userData``, base64 JSON) and boots a simulated
machine in the sim world with exactly that user data, so a sim agent reports for that node
with the node token the instance carries; when moto shows the instance terminated, the
simulated machine goes too. Nothing else of the server is replaced but the AWS provider's
polling bounds (``AwsProviders(settings=...)``), shortened for moto's instant answers.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import pytest
from inventoryhelpers import KEY_A, put_credential

from gpufleet.server.services.aws_providers import AwsProviders
from gpufleet.sim.models import BootPlan, SimInstanceSpec
from gpufleet.testing.fleet import SimFleet, sim_app
from providers.aws.moto_lab import GROUP, REGION, TEMPLATE, Aws, admin_clients, moto_server, seed

ACCESS_KEY = "AKIAIOSFODNN7EXAMPLE"
SECRET_KEY = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYmoto9"  # made up; must never show
FAST_AWS: dict[str, Any] = {
    "connect_timeout_s": 2.0,
    "read_timeout_s": 5.0,
    "max_attempts": 2,
    "call_timeout_s": 20.0,
    "poll_interval_s": 0.05,
    "power_timeout_s": 10.0,
    "replace_timeout_s": 5.0,
}


@pytest.fixture(scope="module")
def moto() -> Iterator[tuple[str, Any, Any]]:
    with moto_server() as endpoint:
        ec2, asg = admin_clients(endpoint)
        yield endpoint, ec2, asg


class UserDataBootstrap:
    """Test stand-in for the AMI's bootstrap (moto runs no machine): each running
    instance of the cluster in moto becomes a simulated machine booted with the instance's
    own user data, read back from moto; a terminated instance's machine is turned off."""

    def __init__(
        self,
        fleet: SimFleet,
        aws: Aws,
        cluster: dict[str, Any],
        recording: MotoRecording | None = None,
    ) -> None:
        self.fleet, self.aws, self.cluster = fleet, aws, cluster
        self.machines: dict[str, str] = {}  # aws instance id → sim instance id
        self.recording = recording  # moto's own request log: what EC2 was asked
        self.reboots_followed = 0

    def instances(self) -> list[dict[str, Any]]:
        answer = self.aws.ec2.describe_instances(
            Filters=[{"Name": "tag:gpufleet:cluster", "Values": [self.cluster["id"]]}]
        )
        return [i for r in answer["Reservations"] for i in r["Instances"]]

    async def sync(self) -> None:
        world = self.fleet.world
        # A machine's agent is refused until the server has put its node on it (its token
        # is the node's from then on): boot it from then, as the node's machine.
        nodes = {
            n["provider_instance_id"]: n
            for n in (await self.fleet.nodes_of(self.cluster["id"])).values()
        }
        for raw in self.instances():
            instance_id, state = raw["InstanceId"], raw["State"]["Name"]
            if state == "running" and instance_id in nodes and instance_id not in self.machines:
                attr = self.aws.ec2.describe_instance_attribute(
                    InstanceId=instance_id, Attribute="userData"
                )
                user_data = json.loads(base64.b64decode(attr["UserData"]["Value"]))
                tags = {t["Key"]: t["Value"] for t in raw.get("Tags", [])}
                # The machine answers the scheduler under the name the server addresses
                # the node by (docs/providers-aws.md, "Scheduler names"); before the
                # server read the instance, that is its hostname (private DNS name).
                node = nodes[instance_id]
                assert node["name"] == tags["gpufleet:node"]
                name = node["scheduler_name"] or raw["PrivateDnsName"]
                machine = world.provision(
                    SimInstanceSpec(
                        client_token=f"aws/{instance_id}",
                        cluster_id=self.cluster["id"],
                        node_name=name,
                        gpu_model=self.cluster["gpu_model"],
                        gpu_count=self.cluster["gpus_per_node"],
                        user_data=user_data,
                    ),
                    plan=BootPlan(delay_range_s=(0.0, 0.0)),
                )
                self.machines[instance_id] = machine.instance_id
            elif state in ("shutting-down", "terminated") and instance_id in self.machines:
                world.terminate(self.machines[instance_id])
        if self.recording is not None:
            # moto answers RebootInstances and changes nothing it shows; its request log
            # is where the reboot shows: the instance's machine restarts (new boot id).
            asked = self.recording.calls("RebootInstances")
            for params in asked[self.reboots_followed :]:
                for key, value in params.items():
                    if key.startswith("InstanceId.") and value in self.machines:
                        world.reboot(self.machines[value], plan=BootPlan((20.0, 20.0)))
            self.reboots_followed = len(asked)


class MotoRecording:
    """moto's request recorder (``/moto-api/recorder``): every request the moto server
    took, from the moment ``start`` is called, as written to ``path``."""

    def __init__(self, endpoint: str, path: Path) -> None:
        from moto.moto_api import recorder

        # moto reads MOTO_RECORDER_FILEPATH once, at import; point its one recorder
        # (this process's, the threaded server's) at the test's own file instead.
        recorder._location = str(path)
        self.endpoint, self.path = endpoint, path

    def start(self) -> None:
        import requests

        requests.post(f"{self.endpoint}/moto-api/recorder/reset-recording", timeout=10)
        requests.post(f"{self.endpoint}/moto-api/recorder/start-recording", timeout=10)

    def stop(self) -> None:
        import requests

        requests.post(f"{self.endpoint}/moto-api/recorder/stop-recording", timeout=10)

    def calls(self, action: str) -> list[dict[str, str]]:
        """The query parameters of every recorded EC2 call of ``action``, in order."""
        found: list[dict[str, str]] = []
        lines = self.path.read_text().splitlines() if self.path.exists() else []
        for line in lines:
            entry = json.loads(line)
            body = entry.get("body") or ""
            text = base64.b64decode(body).decode() if entry.get("body_encoded") else body
            params = {k: v[0] for k, v in parse_qs(text).items()}
            if params.get("Action") == action:
                found.append(params)
        return found


async def _cloud_cluster(
    fleet: SimFleet, endpoint: str, *, size: int, tags: dict[str, str] | None = None
) -> None:
    """The aws cluster ``cloud`` of ``size`` nodes in project ml, on moto at ``endpoint``,
    with its key stored sealed; the server's AWS driver polls quickly (moto answers at
    once). Sets ``fleet.cluster``."""
    app = fleet.app
    app.ctx.drivers.per_cluster["aws"] = AwsProviders(
        db=app.ctx.db, keyring=app.ctx.keyring, settings=FAST_AWS
    )
    stored = await put_credential(
        app.client, "aws-lab", secret=f"{ACCESS_KEY}:{SECRET_KEY}", kind="aws_key",
        username=None,
    )  # fmt: skip
    assert stored.status_code == 200, stored.text
    config = {
        "region": REGION, "endpoint_url": endpoint, "credential": "aws-lab",
        "auto_scaling_group": GROUP, "launch_template_name": TEMPLATE,
        "launch_template_version": "$Latest", "tags": tags or {},
    }  # fmt: skip
    created = await app.client.post(
        "/api/v1/clusters",
        json={"project": "ml", "name": "cloud", "size": size, "acceptance_tests": False,
              "provider": "aws", "provider_config": config},
    )  # fmt: skip
    assert created.status_code == 201, created.text
    fleet.cluster = created.json()


async def _in_service(fleet: SimFleet, bootstrap: UserDataBootstrap, *, size: int = 2) -> bool:
    await bootstrap.sync()
    nodes = await fleet.nodes_of(fleet.cluster_id)
    return len(nodes) == size and all(n["state"] == "in_service" for n in nodes.values())


async def test_an_aws_cluster_is_provisioned_in_moto_failed_over_and_reprovisioned(
    database_url: str,
    tmp_path: Path,
    moto: tuple[str, Any, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="gpufleet")
    endpoint, ec2, asg = moto
    aws = seed(endpoint, ec2, asg, desired=0)
    texts: list[str] = []
    async with sim_app(database_url, tmp_path, secret_key=KEY_A) as fleet:
        app = fleet.app
        await _cloud_cluster(fleet, endpoint, size=2, tags={"team": "ml"})
        bootstrap = UserDataBootstrap(fleet, aws, fleet.cluster)
        await fleet.until(lambda: _in_service(fleet, bootstrap), ticks=30, what="in service")
        assert (await fleet.status_is(fleet.cluster_id, "ready")) is not None

        # The machines are in moto: tagged, members of the group, nothing else launched.
        nodes = await fleet.nodes_of(fleet.cluster_id)
        by_node = {name: n["provider_instance_id"] for name, n in nodes.items()}
        assert set(by_node) == {"cloud-000", "cloud-001"}
        for name, instance_id in by_node.items():
            tags = aws.tags(instance_id)
            assert tags["gpufleet:cluster"] == fleet.cluster_id
            assert (tags["gpufleet:node"], tags["Name"], tags["team"]) == (name, name, "ml")
            assert aws.state(instance_id) == "running"
        assert aws.members() == dict.fromkeys(by_node.values(), "InService")
        assert aws.group()["DesiredCapacity"] == 2
        assert len(bootstrap.instances()) == 2

        # The reach check goes through the cluster's own AWS driver, to each instance.
        checked = await app.client.post(
            f"/api/v1/clusters/{fleet.cluster_id}/providers/check", json={}
        )
        assert checked.status_code == 200, checked.text
        rows = checked.json()["hosts"]
        assert [(r["hostname"], r["host_id"], r["reachable"], r["power"]) for r in rows] == [
            (name, by_node[name], True, "on") for name in ("cloud-000", "cloud-001")
        ]
        texts.append(checked.text)

        # Failover, asked by an admin (an approved repair): the old machine goes.
        old = by_node["cloud-000"]
        node_id = nodes["cloud-000"]["id"]
        asked = await app.client.post(
            f"/api/v1/nodes/{node_id}/actions",
            json={"action": "replace", "reason": "GPU fell off the bus twice"},
        )
        assert asked.status_code == 200, asked.text
        repair_id = asked.json()["repair"]["id"]

        async def ended() -> dict[str, Any] | None:
            await bootstrap.sync()
            repair = await fleet.repair(repair_id)
            return repair if repair["status"] in ("succeeded", "failed") else None

        done = await fleet.until(ended, ticks=60, what="the failover")
        assert done["status"] == "succeeded", done
        await fleet.until(lambda: _in_service(fleet, bootstrap), ticks=10, what="back")
        node = await fleet.node(node_id)
        new = node["provider_instance_id"]
        assert new not in (None, old) and node["state"] == "in_service", node
        assert aws.state(old) in ("shutting-down", "terminated")
        assert aws.members() == {new: "InService", by_node["cloud-001"]: "InService"}
        assert aws.group()["DesiredCapacity"] == 2  # size kept: one in, one out
        assert aws.tags(new)["gpufleet:node"] == "cloud-000"
        assert aws.tags(new)["gpufleet:client-token"] == f"{repair_id}/failover"

        # Reprovision, asked the same way: EC2 cannot reinstall in place (moto has no
        # root-volume replacement), so the driver relaunches; the node moves onto the new
        # instance, whose user data carries the node's new token.
        other = nodes["cloud-001"]
        asked = await app.client.post(
            f"/api/v1/nodes/{other['id']}/actions",
            json={"action": "reprovision", "reason": "driver state looks corrupt"},
        )
        assert asked.status_code == 200, asked.text
        repair_id = asked.json()["repair"]["id"]
        done = await fleet.until(ended, ticks=60, what="the reprovision")
        assert done["status"] == "succeeded", done
        await fleet.until(lambda: _in_service(fleet, bootstrap), ticks=10, what="back again")
        moved = (await fleet.node(other["id"]))["provider_instance_id"]
        assert moved not in (None, other["provider_instance_id"])
        assert aws.state(other["provider_instance_id"]) in ("shutting-down", "terminated")
        assert aws.members() == {new: "InService", moved: "InService"}
        assert aws.group()["DesiredCapacity"] == 2

        events = await fleet.get("/api/v1/events", cluster=fleet.cluster_id, limit=500)
        audit = await fleet.get("/api/v1/audit", project="ml", limit=500)
        texts += [json.dumps(events), json.dumps(audit), json.dumps(done)]
    for text in texts:
        assert SECRET_KEY not in text and ACCESS_KEY not in text
    assert SECRET_KEY not in caplog.text


async def test_xid_79_reboots_an_aws_instance_and_a_sticky_fault_relaunches_it(
    database_url: str, tmp_path: Path, moto: tuple[str, Any, Any]
) -> None:
    endpoint, ec2, asg = moto
    aws = seed(endpoint, ec2, asg, desired=0)
    recording = MotoRecording(endpoint, tmp_path / "moto-recording.jsonl")
    async with sim_app(database_url, tmp_path, secret_key=KEY_A) as fleet:
        app = fleet.app
        await _cloud_cluster(fleet, endpoint, size=1)
        bootstrap = UserDataBootstrap(fleet, aws, fleet.cluster, recording)
        await fleet.until(lambda: _in_service(fleet, bootstrap, size=1), ticks=30, what="up")
        (node,) = (await fleet.nodes_of(fleet.cluster_id)).values()
        first = node["provider_instance_id"]
        recording.start()

        async def proposal() -> dict[str, Any] | None:
            await bootstrap.sync()
            return await fleet.proposed_for(node["id"])

        async def approve_and_end(repair: dict[str, Any]) -> dict[str, Any]:
            approved = await app.client.post(f"/api/v1/repairs/{repair['id']}/approve", json={})
            assert approved.status_code == 200, approved.text

            async def ended() -> dict[str, Any] | None:
                await bootstrap.sync()
                found = await fleet.repair(repair["id"])
                return found if found["status"] in ("succeeded", "failed") else None

            done: dict[str, Any] = await fleet.until(ended, ticks=60, seconds=5, what="the end")
            return done

        try:
            # Xid 79: a reboot through EC2; moto's log shows RebootInstances for it.
            fleet.world.inject_fault(bootstrap.machines[first], signature_id="xid-79")
            repair = await fleet.until(proposal, what="the reboot proposal")
            assert repair["action"] == "reboot", repair["rule"]
            before = (await fleet.node(node["id"]))["boot_id"]
            done = await approve_and_end(repair)
            assert done["status"] == "succeeded", done
            asked = recording.calls("RebootInstances")
            assert [p["InstanceId.1"] for p in asked] == [first], asked
            after = await fleet.node(node["id"])
            assert after["state"] == "in_service" and after["boot_id"] != before, after

            # Broken hardware: it comes back after the reboot; the ladder relaunches the
            # node on a new instance (EC2 has no reinstall in place), where it is gone.
            machine = bootstrap.machines[first]
            fleet.world.inject_fault(machine, signature_id="sxid-fatal", sticky=True)
            climbed = await fleet.until(
                proposal, ticks=40, seconds=60, what="the next rung (after the cooldown)"
            )
            assert climbed["action"] == "reprovision", climbed["rule"]
            done = await approve_and_end(climbed)
            assert done["status"] == "succeeded", done
            moved = await fleet.node(node["id"])
            assert moved["provider_instance_id"] not in (None, first), moved
            assert moved["state"] == "in_service", moved
            assert aws.state(first) in ("shutting-down", "terminated")
            assert aws.members() == {moved["provider_instance_id"]: "InService"}
            assert recording.calls("RunInstances"), "the relaunch went through EC2"
        finally:
            recording.stop()
