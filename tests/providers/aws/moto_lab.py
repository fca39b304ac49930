"""moto in server mode for the AWS tests: the driver suite here, and the server tests that
drive an aws cluster through the API (tests/server/test_aws_clusters.py).

One ``ThreadedMotoServer`` on 127.0.0.1 (EC2 and Auto Scaling); ``seed`` resets its state
and makes a launch template and an Auto Scaling group. boto3 never looks for real
credentials here: dummy keys, no profile, and the instance metadata service off (it would
probe 169.254.169.254). Instance addresses moto hands out are fake; nothing connects to
them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    # moto's catalogue of public AMIs takes seconds to load after every reset; the
    # launch template names a made-up AMI, which moto accepts without it.
    "MOTO_EC2_LOAD_DEFAULT_AMIS": "false",
}
REGION = "us-east-1"
GROUP = "gpu-group"
TEMPLATE = "gpu-template"


@dataclass
class Aws:
    endpoint: str
    ec2: Any  # the test's own boto3 clients: moto's view, not the driver's
    asg: Any
    subnet: str

    def group(self) -> dict[str, Any]:
        answer = self.asg.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])
        group: dict[str, Any] = answer["AutoScalingGroups"][0]
        return group

    def members(self) -> dict[str, str]:
        return {i["InstanceId"]: i["LifecycleState"] for i in self.group()["Instances"]}

    def instance(self, instance_id: str) -> dict[str, Any]:
        answer = self.ec2.describe_instances(InstanceIds=[instance_id])
        found: dict[str, Any] = answer["Reservations"][0]["Instances"][0]
        return found

    def state(self, instance_id: str) -> str:
        return str(self.instance(instance_id)["State"]["Name"])

    def tags(self, instance_id: str) -> dict[str, str]:
        return {t["Key"]: t["Value"] for t in self.instance(instance_id).get("Tags", [])}


@contextmanager
def moto_server() -> Iterator[str]:
    """A moto server on a free loopback port, with the test environment above; yields its
    endpoint URL."""
    with pytest.MonkeyPatch.context() as mp:
        for key, value in ENV.items():
            mp.setenv(key, value)
        mp.delenv("AWS_PROFILE", raising=False)
        mp.delenv("AWS_SESSION_TOKEN", raising=False)
        from moto.server import ThreadedMotoServer

        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        try:
            yield f"http://{host}:{port}"
        finally:
            server.stop()


def admin_clients(endpoint: str) -> tuple[Any, Any]:
    """The test's own EC2 and Auto Scaling clients (build once per module: loading
    botocore's service models is most of a client's cost)."""
    import boto3

    keys = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
    ec2 = boto3.client("ec2", endpoint_url=endpoint, region_name=REGION, **keys)
    asg = boto3.client("autoscaling", endpoint_url=endpoint, region_name=REGION, **keys)
    return ec2, asg


def seed(endpoint: str, ec2: Any, asg: Any, *, desired: int = 1) -> Aws:
    """Reset moto; make the launch template and the group (``desired`` machines the group
    launches itself, not gpufleet's)."""
    import requests

    requests.post(f"{endpoint}/moto-api/reset", timeout=10).raise_for_status()
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    ec2.create_launch_template(
        LaunchTemplateName=TEMPLATE,
        LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "p4d.24xlarge"},
    )
    asg.create_auto_scaling_group(
        AutoScalingGroupName=GROUP,
        LaunchTemplate={"LaunchTemplateName": TEMPLATE, "Version": "$Latest"},
        MinSize=0,
        MaxSize=10,
        DesiredCapacity=desired,
        VPCZoneIdentifier=subnet,
    )
    return Aws(endpoint=endpoint, ec2=ec2, asg=asg, subnet=subnet)
