"""The pure readers of EC2 answers, on answers shaped as EC2 returns them."""

from __future__ import annotations

import datetime as dt

from gpufleet.providers.aws.parsing import (
    ec2_client_token,
    group_template,
    instances_of,
    power_of,
    to_instance,
)
from gpufleet.providers.base import InstanceState, PowerState

LAUNCHED = dt.datetime(2026, 12, 1, 8, 30, tzinfo=dt.UTC)


def raw(state: str, **extra: object) -> dict[str, object]:
    return {
        "InstanceId": "i-0abc",
        "State": {"Code": 16, "Name": state},
        "LaunchTime": LAUNCHED,
        "PrivateDnsName": "ip-10-0-0-5.ec2.internal",
        "Tags": [
            {"Key": "gpufleet:cluster", "Value": "c1"},
            {"Key": "gpufleet:node", "Value": "gpu-1"},
            {"Key": "gpufleet:client-token", "Value": "tok"},
        ],
        **extra,
    }


def test_states_map_onto_the_protocol() -> None:
    assert to_instance(raw("pending")).state is InstanceState.PENDING
    assert to_instance(raw("running")).state is InstanceState.RUNNING
    assert to_instance(raw("stopped")).state is InstanceState.PENDING  # not booted
    assert to_instance(raw("shutting-down")).state is InstanceState.TERMINATED
    instance = to_instance(raw("running"))
    assert (instance.cluster_id, instance.node_name, instance.client_token) == (
        "c1",
        "gpu-1",
        "tok",
    )
    assert instance.booted_at == LAUNCHED and instance.hostname == "ip-10-0-0-5.ec2.internal"


def test_an_instance_ec2_ended_itself_is_failed() -> None:
    reason = {"Code": "Server.InsufficientInstanceCapacity", "Message": "no capacity"}
    failed = to_instance(raw("terminated", StateReason=reason))
    assert failed.state is InstanceState.FAILED and "no capacity" in (failed.error or "")
    asked = {"Code": "Client.UserInitiatedShutdown", "Message": "User initiated shutdown"}
    assert to_instance(raw("terminated", StateReason=asked)).state is InstanceState.TERMINATED


def test_power_states() -> None:
    assert power_of("running") is PowerState.ON
    assert power_of("stopped") is PowerState.OFF
    assert power_of("stopping") is PowerState.UNKNOWN


def test_client_tokens_fit_ec2_and_differ_per_cluster() -> None:
    long = "r" * 300
    assert len(ec2_client_token("c1", long)) <= 64
    assert ec2_client_token("c1", "t") != ec2_client_token("c2", "t")
    assert ec2_client_token("c1", "t") == ec2_client_token("c1", "t")


def test_instances_of_both_answer_shapes() -> None:
    assert instances_of({"Instances": [{"InstanceId": "i-1"}]}) == [{"InstanceId": "i-1"}]
    described = {"Reservations": [{"Instances": [{"InstanceId": "i-1"}, {"InstanceId": "i-2"}]}]}
    assert [i["InstanceId"] for i in instances_of(described)] == ["i-1", "i-2"]


def test_group_template_plain_and_mixed() -> None:
    spec = {"LaunchTemplateId": "lt-1", "LaunchTemplateName": "t", "Version": "3"}
    plain = {"AutoScalingGroups": [{"LaunchTemplate": spec}]}
    assert group_template(plain) == {"LaunchTemplateId": "lt-1", "Version": "3"}
    by_name = {"LaunchTemplateName": "t", "Version": "$Latest"}
    policy = {"LaunchTemplate": {"LaunchTemplateSpecification": by_name}}
    mixed = {"AutoScalingGroups": [{"MixedInstancesPolicy": policy}]}
    assert group_template(mixed) == {"LaunchTemplateName": "t", "Version": "$Latest"}
    assert group_template({"AutoScalingGroups": [{"LaunchConfigurationName": "old"}]}) is None
