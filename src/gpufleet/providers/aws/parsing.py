"""Pure readers of EC2 answers (the dicts boto3 returns). No I/O."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from gpufleet.providers.aws.config import TAG_CLIENT_TOKEN, TAG_CLUSTER, TAG_NODE
from gpufleet.providers.base import Instance, InstanceState, PowerState

# EC2 instance states (``State.Name``) → the provider protocol's. A stopped machine is
# not booted, and will be again once started: PENDING, like a machine being launched.
_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.PENDING,
    "stopped": InstanceState.PENDING,
    "shutting-down": InstanceState.TERMINATED,
    "terminated": InstanceState.TERMINATED,
}
_POWER = {"running": PowerState.ON, "stopped": PowerState.OFF}
EC2_CLIENT_TOKEN_MAX = 64  # EC2's limit on RunInstances' ClientToken


def tags_of(raw: Mapping[str, Any]) -> dict[str, str]:
    """``[{"Key": k, "Value": v}, ...]`` → ``{k: v}``."""
    return {str(t["Key"]): str(t.get("Value", "")) for t in raw.get("Tags") or ()}


def state_name(raw: Mapping[str, Any]) -> str:
    return str((raw.get("State") or {}).get("Name", "unknown"))


def power_of(state: str) -> PowerState:
    """running → ON, stopped → OFF, anything in between (or gone) → UNKNOWN."""
    return _POWER.get(state, PowerState.UNKNOWN)


def to_instance(raw: Mapping[str, Any]) -> Instance:
    """One ``Reservations[].Instances[]`` entry → ``Instance``.

    An instance EC2 terminated on its own (``StateReason`` ``Server.*``: no capacity, an
    internal error, a spot reclaim) is FAILED with that reason. ``booted_at`` is
    ``LaunchTime``, which EC2 moves on every start; a reboot does not move it.
    """
    tags = tags_of(raw)
    name = state_name(raw)
    state = _STATES.get(name, InstanceState.PENDING)
    error = None
    reason = raw.get("StateReason") or {}
    if state is InstanceState.TERMINATED and str(reason.get("Code", "")).startswith("Server."):
        state = InstanceState.FAILED
        error = f"{reason.get('Code')}: {reason.get('Message', '')}"
    launched = raw.get("LaunchTime")
    if not isinstance(launched, dt.datetime):
        launched = dt.datetime.now(dt.UTC)
    launched = launched.astimezone(dt.UTC)
    return Instance(
        instance_id=str(raw["InstanceId"]),
        client_token=tags.get(TAG_CLIENT_TOKEN, ""),
        cluster_id=tags.get(TAG_CLUSTER, ""),
        node_name=tags.get(TAG_NODE, ""),
        state=state,
        created_at=launched,
        hostname=raw.get("PrivateDnsName") or None,
        error=error,
        booted_at=launched,
    )


def instances_of(answer: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every instance of a DescribeInstances/RunInstances answer."""
    if "Instances" in answer:
        return list(answer["Instances"])
    return [i for r in answer.get("Reservations") or () for i in r.get("Instances") or ()]


def ec2_client_token(cluster_id: str, client_token: str) -> str:
    """EC2's ClientToken for a gpufleet token: at most 64 ASCII characters, and scoped to
    the cluster (EC2's is per account and region)."""
    digest = hashlib.sha256(f"gpufleet\0{cluster_id}\0{client_token}".encode()).hexdigest()
    return digest[:EC2_CLIENT_TOKEN_MAX]


def encode_user_data(user_data: Mapping[str, str]) -> str:
    """The machine's user data: one JSON object (boto3 base64-encodes it). The agent's
    bootstrap reads it from the instance metadata service."""
    return json.dumps(dict(user_data), sort_keys=True)


def tag_list(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": v} for k, v in tags.items()]


def group_members(answer: Mapping[str, Any]) -> dict[str, str]:
    """DescribeAutoScalingGroups (one group) → {instance id: lifecycle state}."""
    groups: Sequence[Mapping[str, Any]] = answer.get("AutoScalingGroups") or ()
    if not groups:
        return {}
    members = groups[0].get("Instances") or ()
    return {str(i["InstanceId"]): str(i["LifecycleState"]) for i in members}


def group_template(answer: Mapping[str, Any]) -> dict[str, str] | None:
    """The launch template an Auto Scaling group launches from (plain or mixed
    instances policy), as RunInstances takes it; None if it uses a launch configuration."""
    groups: Sequence[Mapping[str, Any]] = answer.get("AutoScalingGroups") or ()
    if not groups:
        return None
    group = groups[0]
    spec = group.get("LaunchTemplate") or (
        ((group.get("MixedInstancesPolicy") or {}).get("LaunchTemplate") or {}).get(
            "LaunchTemplateSpecification"
        )
    )
    if not spec:
        return None
    out = {k: str(spec[k]) for k in ("LaunchTemplateId", "LaunchTemplateName") if spec.get(k)}
    if "LaunchTemplateId" in out:
        out.pop("LaunchTemplateName", None)
    out["Version"] = str(spec.get("Version") or "$Default")
    return out
