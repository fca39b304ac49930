"""The AWS provider against moto in server mode: what each call does to the instances and
the Auto Scaling group, as moto shows them through its own API.

One moto server (EC2 and Auto Scaling) on 127.0.0.1 per module, its state reset before
every test; a launch template and an Auto Scaling group per test (``moto_lab.py``).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest
from moto_lab import GROUP, REGION, TEMPLATE, Aws, admin_clients, moto_server, seed

from gpufleet.core.errors import DriverError
from gpufleet.providers.aws.config import AwsConfig, AwsPlacement
from gpufleet.providers.aws.driver import AwsProvider
from gpufleet.providers.base import (
    Credential,
    Instance,
    InstanceState,
    PowerState,
    Provider,
    ProvisionRequest,
    SupportsPower,
    SupportsReachCheck,
    SupportsReboot,
    SupportsReplace,
    SupportsReprovision,
)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def admin(moto_endpoint: str) -> tuple[Any, Any]:
    return admin_clients(moto_endpoint)


@pytest.fixture
def aws(moto_endpoint: str, admin: tuple[Any, Any]) -> Aws:
    ec2, asg = admin
    return seed(moto_endpoint, ec2, asg)


SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"  # made up; must never be printed
CREDENTIAL = Credential(username="AKIAIOSFODNN7EXAMPLE", secret=SECRET)


def make_config(endpoint: str, **overrides: object) -> AwsConfig:
    settings: dict[str, object] = {
        "region": REGION,
        "endpoint_url": endpoint,
        "clusters": {
            "c1": AwsPlacement(
                auto_scaling_group=GROUP,
                launch_template_name=TEMPLATE,
                launch_template_version="$Latest",
                tags={"team": "ml"},
            ),
            "plain": AwsPlacement(launch_template_name=TEMPLATE, instance_type="g5.xlarge"),
        },
        "connect_timeout_s": 2.0,
        "read_timeout_s": 5.0,
        "max_attempts": 2,
        "call_timeout_s": 20.0,
        "poll_interval_s": 0.05,
        "power_timeout_s": 10.0,
        "replace_timeout_s": 5.0,
    }
    settings.update(overrides)
    return AwsConfig(**settings)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shared_provider(moto_endpoint: str) -> AwsProvider:
    # One per module: the provider keeps no state but its boto3 clients, and building
    # those (botocore's service models) costs more than most tests here.
    return AwsProvider(make_config(moto_endpoint), CREDENTIAL)


@pytest.fixture
def provider(aws: Aws, shared_provider: AwsProvider) -> AwsProvider:
    return shared_provider  # after ``aws``: moto reset, template and group made


def request(
    node: str = "gpu-1",
    token: str = "prov-1",  # noqa: S107 (an idempotency key)
    cluster: str = "c1",
) -> ProvisionRequest:
    return ProvisionRequest(
        client_token=token,
        cluster_id=cluster,
        node_name=node,
        gpu_model="H100",
        gpu_count=8,
        user_data={"gpufleet_url": "https://gpufleet.example", "gpufleet_node_token": "t1"},
    )


async def running(provider: AwsProvider, req: ProvisionRequest) -> Instance:
    """Provision until the machine runs (moto: the second call) and joins the group."""
    for _ in range(5):
        instance = await provider.provision(req)
        if instance.state is InstanceState.RUNNING:
            return instance
    raise AssertionError(f"{req.node_name} never ran")


def user_data_of(aws: Aws, instance_id: str) -> dict[str, str]:
    attr = aws.ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    decoded: dict[str, str] = json.loads(base64.b64decode(attr["UserData"]["Value"]))
    return decoded


def test_implements_the_protocols(provider: AwsProvider) -> None:
    assert isinstance(provider, Provider)
    for capability in (
        SupportsPower,
        SupportsReboot,
        SupportsReprovision,
        SupportsReplace,
        SupportsReachCheck,
    ):
        assert isinstance(provider, capability)
    assert provider.kind == "aws"


async def test_provision_is_idempotent_by_client_token(aws: Aws, provider: AwsProvider) -> None:
    first = await provider.provision(request())
    again = await provider.provision(request())
    assert again.instance_id == first.instance_id
    assert again.state is InstanceState.RUNNING  # moto runs it at once; attached now
    # New user data with the same token: still the same machine (its first user data).
    changed = dataclasses.replace(request(), user_data={"gpufleet_node_token": "t2"})
    assert (await provider.provision(changed)).instance_id == first.instance_id
    tags = aws.tags(first.instance_id)
    assert tags["gpufleet:cluster"] == "c1"
    assert tags["gpufleet:node"] == "gpu-1"
    assert tags["gpufleet:client-token"] == "prov-1"
    assert tags["team"] == "ml"
    assert user_data_of(aws, first.instance_id)["gpufleet_node_token"] == "t1"
    members = aws.members()
    assert members[first.instance_id] == "InService"
    assert len(members) == 2 and aws.group()["DesiredCapacity"] == 2  # grew by one, once
    assert again.node_name == "gpu-1" and again.client_token == "prov-1"


async def test_a_launch_followed_by_get_instance_joins_the_group_once(
    aws: Aws, moto_endpoint: str
) -> None:
    # The server follows a launch with get_instance, never a second provision: the
    # machine joins the group there once it runs. A fresh provider: no machine seen yet.
    provider = AwsProvider(make_config(moto_endpoint), CREDENTIAL)
    first = await provider.provision(request(token="follow"))
    assert first.state is InstanceState.PENDING and first.instance_id not in aws.members()
    seen = await provider.get_instance(first.instance_id)
    assert seen is not None and seen.state is InstanceState.RUNNING
    assert aws.members()[first.instance_id] == "InService"
    await provider.get_instance(first.instance_id)  # a member: not attached twice
    assert aws.group()["DesiredCapacity"] == 2 and len(aws.members()) == 2
    # The group's own machine (no gpufleet tags) is read, never attached or claimed.
    [own] = set(aws.members()) - {first.instance_id}
    assert await provider.get_instance(own) is not None
    assert aws.group()["DesiredCapacity"] == 2


async def test_provision_without_a_group_launches_from_the_template(
    aws: Aws, provider: AwsProvider
) -> None:
    instance = await running(provider, request(cluster="plain", token="p-plain"))
    assert aws.instance(instance.instance_id)["InstanceType"] == "g5.xlarge"
    assert instance.instance_id not in aws.members()
    with pytest.raises(DriverError, match="cluster nope has no placement"):
        await provider.provision(request(cluster="nope"))


async def test_list_and_get_go_by_the_cluster_tag(aws: Aws, provider: AwsProvider) -> None:
    a = await running(provider, request("gpu-1", "t-a"))
    b = await running(provider, request("gpu-2", "t-b"))
    listed = await provider.list_instances("c1")
    # The group's own machine (untagged) is not the cluster's.
    assert {i.instance_id for i in listed} == {a.instance_id, b.instance_id}
    assert await provider.get_instance("i-0123456789abcdef0") is None
    await provider.terminate(a.instance_id)
    assert {i.instance_id for i in await provider.list_instances("c1")} == {b.instance_id}
    gone = await provider.get_instance(a.instance_id)
    assert gone is not None and gone.state is InstanceState.TERMINATED


async def test_reboot_is_accepted(aws: Aws, provider: AwsProvider) -> None:
    instance = await running(provider, request())
    await provider.reboot(instance.instance_id)
    # moto accepts RebootInstances and changes nothing it shows: the machine runs, in
    # service. (On AWS the request is only queued; the agent's boot id proves it.)
    assert aws.state(instance.instance_id) == "running"
    assert aws.members()[instance.instance_id] == "InService"
    await provider.terminate(instance.instance_id)
    with pytest.raises(DriverError, match=r"reboot: it is (terminated|shutting-down)"):
        await provider.reboot(instance.instance_id)
    with pytest.raises(DriverError, match="no such instance"):
        await provider.reboot("i-0123456789abcdef0")


async def test_failover_replaces_through_the_group(aws: Aws, provider: AwsProvider) -> None:
    old = await running(provider, request())
    size = aws.group()["DesiredCapacity"]
    replacement = request(token="repair-7/failover")
    new = await provider.replace(old.instance_id, request=replacement)
    assert new.instance_id != old.instance_id
    assert aws.state(old.instance_id) == "terminated"
    members = aws.members()
    assert old.instance_id not in members
    assert members[new.instance_id] == "InService"
    assert aws.group()["DesiredCapacity"] == size and len(members) == size
    assert aws.tags(new.instance_id)["gpufleet:node"] == "gpu-1"
    assert aws.tags(new.instance_id)["gpufleet:client-token"] == "repair-7/failover"
    # A retry (the control plane crashed before recording it): the same replacement.
    again = await provider.replace(old.instance_id, request=replacement)
    assert again.instance_id == new.instance_id
    assert aws.group()["DesiredCapacity"] == size and len(aws.members()) == size


async def test_failover_after_a_crash_claims_the_groups_replacement(
    aws: Aws, provider: AwsProvider
) -> None:
    # The group's own machine (untagged) would be a candidate too: take it away first.
    [own] = aws.members()
    aws.asg.terminate_instance_in_auto_scaling_group(
        InstanceId=own, ShouldDecrementDesiredCapacity=True
    )
    old = await running(provider, request())
    size = aws.group()["DesiredCapacity"]
    # An earlier replace terminated the old machine, then the control plane crashed
    # before the replacement was claimed.
    aws.asg.terminate_instance_in_auto_scaling_group(
        InstanceId=old.instance_id, ShouldDecrementDesiredCapacity=False
    )
    [launched] = set(aws.members()) - {old.instance_id}
    new = await provider.replace(old.instance_id, request=request(token="repair-8/failover"))
    assert new.instance_id == launched
    assert aws.tags(launched)["gpufleet:client-token"] == "repair-8/failover"
    assert aws.group()["DesiredCapacity"] == size and len(aws.members()) == size


async def test_remove_terminates_and_shrinks_the_group(aws: Aws, provider: AwsProvider) -> None:
    instance = await running(provider, request())
    size = aws.group()["DesiredCapacity"]
    await provider.terminate(instance.instance_id)
    assert aws.state(instance.instance_id) == "terminated"
    assert instance.instance_id not in aws.members()
    assert aws.group()["DesiredCapacity"] == size - 1
    assert len(aws.members()) == size - 1  # no replacement launched
    await provider.terminate(instance.instance_id)  # idempotent
    await provider.terminate("i-0123456789abcdef0")  # missing: succeeds
    assert aws.group()["DesiredCapacity"] == size - 1


async def test_reprovision_relaunches_the_node_from_the_template(
    aws: Aws, provider: AwsProvider
) -> None:
    old = await running(provider, request())
    size = aws.group()["DesiredCapacity"]
    moved = await provider.reprovision(old.instance_id, user_data={"gpufleet_node_token": "fresh"})
    assert aws.state(old.instance_id) == "terminated"
    [new] = await provider.list_instances("c1")
    assert new.instance_id != old.instance_id  # a new machine: the id changes
    assert moved is not None and moved.instance_id == new.instance_id  # the node follows it
    assert new.node_name == "gpu-1" and new.state is InstanceState.RUNNING
    assert user_data_of(aws, new.instance_id) == {"gpufleet_node_token": "fresh"}
    assert aws.members()[new.instance_id] == "InService"
    assert aws.group()["DesiredCapacity"] == size
    # moto 5.2.5 lacks CreateReplaceRootVolumeTask (the in-place reinstall): why the
    # driver relaunches instead.
    with pytest.raises(Exception, match=r"Unable to parse response|not been implemented"):
        aws.ec2.create_replace_root_volume_task(InstanceId=new.instance_id)


async def test_power_cycle_stops_then_starts(aws: Aws, provider: AwsProvider) -> None:
    instance = await running(provider, request())
    size = aws.group()["DesiredCapacity"]
    assert await provider.power_state(instance.instance_id) is PowerState.ON
    await provider.power_cycle(instance.instance_id)
    assert aws.state(instance.instance_id) == "running"
    assert aws.members()[instance.instance_id] == "InService"  # back from Standby
    assert aws.group()["DesiredCapacity"] == size
    aws.ec2.stop_instances(InstanceIds=[instance.instance_id])
    assert await provider.power_state(instance.instance_id) is PowerState.OFF
    with pytest.raises(DriverError, match="no such instance"):
        await provider.power_state("i-0123456789abcdef0")


async def test_check_reach_sees_the_instance_and_changes_nothing(
    aws: Aws, provider: AwsProvider
) -> None:
    instance = await running(provider, request())
    seen = await provider.check_reach(instance.instance_id)
    assert seen.reachable and seen.power is PowerState.ON
    assert "running" in seen.detail
    assert aws.state(instance.instance_id) == "running"
    missing = await provider.check_reach("i-0123456789abcdef0")
    assert not missing.reachable and missing.power is PowerState.UNKNOWN


@pytest.fixture
def moto_checks_keys(aws: Aws) -> Iterator[None]:
    """moto accepts any keys until its IAM checks are on (0 free calls); then keys it
    never issued are refused, as AWS refuses a wrong or revoked key."""
    import requests

    requests.post(f"{aws.endpoint}/moto-api/reset-auth", data=b"0", timeout=10)
    yield
    requests.post(f"{aws.endpoint}/moto-api/reset-auth", data=b"inf", timeout=10)


@pytest.mark.usefixtures("moto_checks_keys")
async def test_refused_credentials_are_a_driver_error_without_the_secret(
    aws: Aws, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    provider = AwsProvider(make_config(aws.endpoint), CREDENTIAL)
    with pytest.raises(DriverError) as raised:
        await provider.provision(request())
    seen = await provider.check_reach("i-0123456789abcdef0")
    with pytest.raises(DriverError) as rebooting:
        await provider.reboot("i-0123456789abcdef0")
    message = raised.value.message
    assert message.startswith("aws: node gpu-1 (cluster c1, client token prov-1): ec2 ")
    assert "AuthFailure" in message and "credentials refused" in message
    assert "instance i-0123456789abcdef0" in rebooting.value.message
    assert not seen.reachable and seen.power is PowerState.UNKNOWN
    assert "AuthFailure" in seen.detail
    texts = [caplog.text, seen.detail, repr(seen)]
    for exc in (raised.value, rebooting.value):
        chained: BaseException | None = exc
        while chained is not None:
            texts += [str(chained), repr(chained)]
            chained = chained.__cause__ or chained.__context__
    assert not any(SECRET in text for text in texts)
