"""``AwsProvider``: the ``Provider`` driver over EC2 and EC2 Auto Scaling.

Every instance gpufleet launches or claims carries three tags: ``gpufleet:cluster``,
``gpufleet:node`` and ``gpufleet:client-token``. Lookups go by them, so the provider
keeps no state of its own and a control plane that crashed finds its machines again.

Provisioning is ``RunInstances`` from the cluster's launch template, never "raise the
group's desired capacity by one": a capacity bump launches an untagged instance that
cannot be told apart from one the group launched for any other reason (its own health
replacement, a scale-out), and a crash between the bump and the tagging leaves a machine
nobody owns, or bumps twice. ``RunInstances`` takes EC2's own idempotency key
(``ClientToken``) and the tags in the same call, so the instance is ours from its first
moment; once running it is attached to the group (``AttachInstances``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpufleet.core.errors import DriverError
from gpufleet.providers.aws.client import AwsClient, AwsError
from gpufleet.providers.aws.config import (
    TAG_CLIENT_TOKEN,
    TAG_CLUSTER,
    TAG_NODE,
    AwsConfig,
    AwsPlacement,
)
from gpufleet.providers.aws.parsing import (
    ec2_client_token,
    encode_user_data,
    group_members,
    group_template,
    instances_of,
    power_of,
    state_name,
    tag_list,
    tags_of,
    to_instance,
)
from gpufleet.providers.base import (
    Credential,
    Instance,
    InstanceState,
    PowerState,
    ProvisionRequest,
    ReachCheck,
)

_ALIVE = ["pending", "running", "stopping", "stopped"]
_GONE = frozenset({"shutting-down", "terminated"})
_NOT_FOUND = frozenset({"InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed"})


class AwsProvider:
    """EC2 machines, optionally in Auto Scaling groups. Implements Provider,
    SupportsPower, SupportsReboot, SupportsReprovision, SupportsReplace and
    SupportsReachCheck."""

    kind = "aws"

    def __init__(self, config: AwsConfig, credential: Credential | None = None) -> None:
        self._config = config
        self._aws = AwsClient(config, credential)
        # Running machines already checked for their group (``get_instance``).
        self._attached: set[str] = set()

    # -- lookups ------------------------------------------------------------------------

    def _placement(self, cluster_id: str) -> AwsPlacement:
        placement = self._config.clusters.get(cluster_id)
        if placement is None:
            raise DriverError(
                f"aws: cluster {cluster_id} has no placement in the AWS provider's settings "
                f"(known: {', '.join(sorted(self._config.clusters)) or 'none'})"
            )
        return placement

    async def _ec2(self, operation: str, *, about: str, **params: Any) -> dict[str, Any]:
        return await self._aws.call("ec2", operation, about=about, **params)

    async def _asg(self, operation: str, *, about: str, **params: Any) -> dict[str, Any]:
        return await self._aws.call("autoscaling", operation, about=about, **params)

    async def _describe(self, instance_id: str) -> dict[str, Any] | None:
        """The instance as EC2 describes it (terminated ones for about an hour), or None."""
        try:
            answer = await self._ec2(
                "describe_instances", about=f"instance {instance_id}", InstanceIds=[instance_id]
            )
        except AwsError as exc:
            if exc.aws_code in _NOT_FOUND:
                return None
            raise
        found = instances_of(answer)
        return found[0] if found else None

    async def _describe_alive(self, instance_id: str, *, action: str) -> dict[str, Any]:
        raw = await self._describe(instance_id)
        if raw is None:
            raise DriverError(f"aws: instance {instance_id}: {action}: no such instance")
        if state_name(raw) in _GONE:
            raise DriverError(
                f"aws: instance {instance_id}{_node(raw)}: {action}: it is {state_name(raw)}"
            )
        return raw

    async def _find(self, filters: Mapping[str, str], *, about: str) -> list[dict[str, Any]]:
        """Instances not terminated whose tags match ``filters``, oldest first."""
        params: dict[str, Any] = {
            "Filters": [
                *({"Name": f"tag:{k}", "Values": [v]} for k, v in filters.items()),
                {"Name": "instance-state-name", "Values": _ALIVE},
            ]
        }
        found: list[dict[str, Any]] = []
        while True:
            answer = await self._ec2("describe_instances", about=about, **params)
            found += instances_of(answer)
            if not answer.get("NextToken"):
                break
            params["NextToken"] = answer["NextToken"]
        return sorted(found, key=lambda raw: (str(raw.get("LaunchTime")), raw["InstanceId"]))

    async def _find_by_token(self, request: ProvisionRequest) -> dict[str, Any] | None:
        found = await self._find(
            {TAG_CLUSTER: request.cluster_id, TAG_CLIENT_TOKEN: request.client_token},
            about=_about(request),
        )
        return found[0] if found else None

    async def _group_of(self, instance_id: str) -> tuple[str, str] | None:
        """(group name, lifecycle state) of an Auto Scaling member; None if in no group."""
        answer = await self._asg(
            "describe_auto_scaling_instances",
            about=f"instance {instance_id}",
            InstanceIds=[instance_id],
        )
        for member in answer.get("AutoScalingInstances") or ():
            return str(member["AutoScalingGroupName"]), str(member["LifecycleState"])
        return None

    async def _members(self, group: str, *, about: str) -> dict[str, str]:
        answer = await self._asg(
            "describe_auto_scaling_groups", about=about, AutoScalingGroupNames=[group]
        )
        if not answer.get("AutoScalingGroups"):
            raise DriverError(f"aws: {about}: Auto Scaling group {group} does not exist")
        return group_members(answer)

    async def _template(self, placement: AwsPlacement, *, about: str) -> dict[str, str]:
        if placement.launch_template_id is not None:
            spec = {"LaunchTemplateId": placement.launch_template_id}
        elif placement.launch_template_name is not None:
            spec = {"LaunchTemplateName": placement.launch_template_name}
        else:
            assert placement.auto_scaling_group is not None  # AwsPlacement checks this
            answer = await self._asg(
                "describe_auto_scaling_groups",
                about=about,
                AutoScalingGroupNames=[placement.auto_scaling_group],
            )
            found = group_template(answer)
            if found is None:
                raise DriverError(
                    f"aws: {about}: Auto Scaling group {placement.auto_scaling_group} has no "
                    "launch template (a launch configuration?); name one in the placement"
                )
            return found
        return {**spec, "Version": placement.launch_template_version}

    async def _wait_for(
        self, instance_id: str, wanted: frozenset[str], *, action: str, bound_s: float
    ) -> dict[str, Any]:
        """Poll until the instance is in one of ``wanted`` states, for at most ``bound_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound_s
        while True:
            raw = await self._describe(instance_id)
            if raw is None:
                raise DriverError(f"aws: instance {instance_id}: {action}: it disappeared")
            state = state_name(raw)
            if state in wanted:
                return raw
            if state in _GONE:
                raise DriverError(f"aws: instance {instance_id}{_node(raw)}: {action}: {state}")
            if loop.time() >= deadline:
                raise DriverError(
                    f"aws: instance {instance_id}{_node(raw)}: {action}: still {state} after "
                    f"{bound_s:g} s (wanted {'/'.join(sorted(wanted))})"
                )
            await asyncio.sleep(self._config.poll_interval_s)

    # -- Provider -----------------------------------------------------------------------

    async def provision(self, request: ProvisionRequest) -> Instance:
        """Launch one machine from the cluster's launch template; idempotent by
        ``request.client_token``.

        Returns the instance, PENDING until it runs and (with a group) is attached to the
        cluster's Auto Scaling group, which grows by one. User data is set at launch: a
        call again with the same token returns the same machine with its first user data
        (EC2 changes user data only on a stopped machine). Touches no running job.

        Raises:
            DriverError: the cluster has no placement, or AWS refused (no capacity,
                quota, group at its maximum size, credentials), naming the node.
        """
        placement = self._placement(request.cluster_id)
        about = _about(request)
        raw = await self._find_by_token(request)
        if raw is None:
            try:
                raw = await self._launch(request, placement, about=about)
            except AwsError as exc:
                # DescribeInstances is eventually consistent: an instance launched seconds
                # ago by an earlier call (a crash, a retry) may not show up in the lookup
                # above yet. The same ClientToken then makes EC2 return that instance
                # rather than launch a second one, or, when this call's parameters differ
                # (new user data), refuse with IdempotentParameterMismatch: look again.
                if exc.aws_code != "IdempotentParameterMismatch":
                    raise
                raw = await self._find_by_token(request)
                if raw is None:
                    raise DriverError(
                        f"{exc.message}; its instance is not visible yet, try again"
                    ) from None
        instance = to_instance(raw)
        group = placement.auto_scaling_group
        if group is not None and instance.state is InstanceState.RUNNING:
            # AWS attaches only running instances; until then the machine is PENDING.
            await self._attach(instance.instance_id, group, about=about)
        return instance

    async def _launch(
        self, request: ProvisionRequest, placement: AwsPlacement, *, about: str
    ) -> dict[str, Any]:
        tags = {
            **placement.tags,
            TAG_CLUSTER: request.cluster_id,
            TAG_NODE: request.node_name,
            TAG_CLIENT_TOKEN: request.client_token,
            "Name": request.node_name,
        }
        params: dict[str, Any] = {
            "LaunchTemplate": await self._template(placement, about=about),
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": ec2_client_token(request.cluster_id, request.client_token),
            "TagSpecifications": [
                {"ResourceType": "instance", "Tags": tag_list(tags)},
                {"ResourceType": "volume", "Tags": tag_list(tags)},
            ],
        }
        if request.user_data:
            params["UserData"] = encode_user_data(request.user_data)
        if placement.instance_type is not None:
            params["InstanceType"] = placement.instance_type
        if placement.subnet_id is not None:
            params["SubnetId"] = placement.subnet_id
        answer = await self._ec2("run_instances", about=about, **params)
        return instances_of(answer)[0]

    async def _attach(self, instance_id: str, group: str, *, about: str) -> None:
        # Checked first: AttachInstances of a member is not a no-op everywhere (moto
        # counts it twice), and a member of another group must not be moved.
        member = await self._group_of(instance_id)
        if member is not None:
            if member[0] != group:
                raise DriverError(
                    f"aws: {about}: instance {instance_id} is in Auto Scaling group "
                    f"{member[0]}, not {group}"
                )
            return
        await self._asg(
            "attach_instances",
            about=f"{about}, instance {instance_id}",
            AutoScalingGroupName=group,
            InstanceIds=[instance_id],
        )

    async def get_instance(self, instance_id: str) -> Instance | None:
        """The instance (EC2 shows terminated ones for about an hour), or None.

        A machine gpufleet launched for a cluster with a group is attached to the group
        here once it runs, when no second ``provision`` did it: the server follows a
        launch with ``get_instance`` (provisioning loop, failover), not ``provision``.
        """
        raw = await self._describe(instance_id)
        if raw is None:
            return None
        instance = to_instance(raw)
        if instance.state is InstanceState.RUNNING and instance_id not in self._attached:
            await self._finish_launch(raw, instance_id)
        return instance

    async def _finish_launch(self, raw: Mapping[str, Any], instance_id: str) -> None:
        tags = tags_of(raw)
        placement = self._config.clusters.get(tags.get(TAG_CLUSTER, ""))
        if placement is None or TAG_CLIENT_TOKEN not in tags:
            return  # not launched by gpufleet for a cluster this provider places
        if placement.auto_scaling_group is not None:
            about = f"node {tags.get(TAG_NODE, '?')} (cluster {tags[TAG_CLUSTER]})"
            await self._attach(instance_id, placement.auto_scaling_group, about=about)
        # Asked once per machine: one an operator detaches on purpose is not re-attached.
        self._attached.add(instance_id)

    async def list_instances(self, cluster_id: str) -> list[Instance]:
        """Instances tagged with the cluster that are not terminated, oldest first."""
        found = await self._find({TAG_CLUSTER: cluster_id}, about=f"cluster {cluster_id}")
        return [to_instance(raw) for raw in found]

    async def terminate(self, instance_id: str) -> None:
        """Give the machine back; idempotent (missing or terminated: succeeds).

        A member of an Auto Scaling group leaves through
        ``TerminateInstanceInAutoScalingGroup`` with the group's desired capacity
        decremented, so the group shrinks and launches no replacement ("remove"). Kills
        every job on it and erases its instance-store disks; drain first.

        Raises:
            DriverError: AWS refused, e.g. the group is at its minimum size.
        """
        raw = await self._describe(instance_id)
        if raw is None or state_name(raw) in _GONE:
            return
        about = f"instance {instance_id}{_node(raw)}"
        member = await self._group_of(instance_id)
        if member is not None and not member[1].startswith("Terminating"):
            await self._asg(
                "terminate_instance_in_auto_scaling_group",
                about=about,
                InstanceId=instance_id,
                ShouldDecrementDesiredCapacity=True,
            )
            return
        await self._ec2("terminate_instances", about=about, InstanceIds=[instance_id])

    # -- SupportsReboot -----------------------------------------------------------------

    async def reboot(self, instance_id: str) -> None:
        """Ask EC2 to reboot the machine (``RebootInstances``).

        EC2 only queues the request and answers at once: this proves nothing about the
        reboot. EC2 asks the OS to shut down and forces a hard reboot if it has not
        within a few minutes; the machine stays on its host and keeps its disks,
        instance-store NVMe included. ``LaunchTime`` (``booted_at``) does not move; the
        control plane proves completion by the agent's boot id changing. Kills running
        jobs; drain first.

        Raises:
            DriverError: no such instance, it is terminated, or AWS refused.
        """
        raw = await self._describe_alive(instance_id, action="reboot")
        await self._ec2(
            "reboot_instances",
            about=f"instance {instance_id}{_node(raw)}",
            InstanceIds=[instance_id],
        )

    # -- SupportsPower ------------------------------------------------------------------

    async def power_state(self, instance_id: str) -> PowerState:
        """running → ON, stopped → OFF, anything between (pending, stopping, terminated)
        → UNKNOWN. Raises ``DriverError`` for a missing instance."""
        raw = await self._describe(instance_id)
        if raw is None:
            raise DriverError(f"aws: instance {instance_id}: power state: no such instance")
        return power_of(state_name(raw))

    async def power_cycle(self, instance_id: str) -> None:
        """Stop the machine, wait until stopped, start it, wait until running (each wait
        bounded by ``power_timeout_s``).

        A member of an Auto Scaling group is put in Standby first (desired capacity
        decremented) and taken out after: the group treats a stopped instance as
        unhealthy and would terminate and replace it. Kills every job, and a stop erases
        instance-store NVMe (EBS volumes are kept); the machine may come back on another
        host. Instance-store-backed and spot instances cannot be stopped (AWS refuses).

        Raises:
            DriverError: no such instance, AWS refused, or a wait ran out (the machine is
                left as it was then; calling again carries on).
        """
        raw = await self._describe_alive(instance_id, action="power cycle")
        about = f"instance {instance_id}{_node(raw)}"
        member = await self._group_of(instance_id)
        if member is not None and member[1] == "InService":
            await self._asg(
                "enter_standby",
                about=about,
                AutoScalingGroupName=member[0],
                InstanceIds=[instance_id],
                ShouldDecrementDesiredCapacity=True,
            )
        bound = self._config.power_timeout_s
        if state_name(raw) != "stopped":
            if state_name(raw) != "stopping":
                await self._ec2("stop_instances", about=about, InstanceIds=[instance_id])
            await self._wait_for(
                instance_id, frozenset({"stopped"}), action="power cycle (stop)", bound_s=bound
            )
        await self._ec2("start_instances", about=about, InstanceIds=[instance_id])
        await self._wait_for(
            instance_id, frozenset({"running"}), action="power cycle (start)", bound_s=bound
        )
        if member is not None and member[1] in ("InService", "Standby"):
            await self._asg(
                "exit_standby",
                about=about,
                AutoScalingGroupName=member[0],
                InstanceIds=[instance_id],
            )

    # -- SupportsReachCheck -------------------------------------------------------------

    async def check_reach(self, instance_id: str) -> ReachCheck:
        """Ask EC2 about the instance (``DescribeInstanceStatus``); changes nothing.

        reachable: EC2's API answered with credentials that work and knows the instance.
        Never raises for refused credentials, an unreachable or silent endpoint.
        """
        try:
            answer = await self._ec2(
                "describe_instance_status",
                about=f"instance {instance_id}",
                InstanceIds=[instance_id],
                IncludeAllInstances=True,
            )
        except DriverError as exc:
            return _unreachable(instance_id, exc.message)
        statuses = answer.get("InstanceStatuses") or ()
        if not statuses:
            return _unreachable(instance_id, "EC2 answered: no such instance")
        status = statuses[0]
        state = str((status.get("InstanceState") or {}).get("Name", "unknown"))
        system = (status.get("SystemStatus") or {}).get("Status", "unknown")
        own = (status.get("InstanceStatus") or {}).get("Status", "unknown")
        return ReachCheck(
            instance_id,
            reachable=True,
            power=power_of(state),
            detail=f"EC2: {state}, system status {system}, instance status {own}",
        )

    # -- SupportsReplace ----------------------------------------------------------------

    async def replace(self, instance_id: str, *, request: ProvisionRequest) -> Instance:
        """Failover: give back ``instance_id`` and bring up a machine in its place;
        idempotent by ``request.client_token``.

        In an Auto Scaling group: ``TerminateInstanceInAutoScalingGroup`` without
        decrementing, so the group launches the replacement itself (its launch template,
        its user data: ``request.user_data`` is NOT delivered), then the new member is
        claimed by tagging it with the request's node and token; waits at most
        ``replace_timeout_s`` for it. Without a group: ``provision``, then ``terminate``.
        Kills every job on the old machine.

        Raises:
            DriverError: AWS refused, the old machine is in another group, or the group
                launched no replacement in time (calling again carries on).
        """
        placement = self._placement(request.cluster_id)
        claimed = await self._find_by_token(request)
        group = placement.auto_scaling_group
        if group is None:
            instance = await self.provision(request)
            await self.terminate(instance_id)
            return instance
        about = f"node {request.node_name}: replace {instance_id} in group {group}"
        if claimed is not None:
            return to_instance(claimed)  # a retry: the replacement is already ours
        members = await self._members(group, about=about)
        lifecycle = members.get(instance_id)
        before: frozenset[str] | None = None
        if lifecycle is not None and not lifecycle.startswith("Terminating"):
            before = frozenset(members)
            await self._asg(
                "terminate_instance_in_auto_scaling_group",
                about=about,
                InstanceId=instance_id,
                ShouldDecrementDesiredCapacity=False,
            )
        elif lifecycle is None:
            raw = await self._describe(instance_id)
            if raw is not None and state_name(raw) not in _GONE:
                raise DriverError(f"aws: {about}: the instance is not a member of the group")
            # Gone already: an earlier call terminated it and crashed before the claim.
        return to_instance(await self._claim_replacement(group, before, request, about=about))

    async def _claim_replacement(
        self,
        group: str,
        before: frozenset[str] | None,
        request: ProvisionRequest,
        *,
        about: str,
    ) -> dict[str, Any]:
        """Tag the group's replacement as the request's node and return it.

        The candidate is a member not terminating and carrying no gpufleet token: new
        since ``before`` when known (this call terminated the old machine), else any
        (a retry after a crash). Auto Scaling does not say which launch answers which
        termination, and EC2 has no conditional tag write, so two replacements in one
        group at the same moment race for one instance: each claims by tagging, then reads
        the tag back and moves on if the other's token is there. Both can still win when
        their writes and reads interleave exactly; the control plane's failover goes
        through ``provision`` (EC2's ClientToken) and does not take this path.
        """
        placement = self._placement(request.cluster_id)
        tags = {
            **placement.tags,
            TAG_CLUSTER: request.cluster_id,
            TAG_NODE: request.node_name,
            TAG_CLIENT_TOKEN: request.client_token,
            "Name": request.node_name,
        }
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.replace_timeout_s
        while True:
            members = await self._members(group, about=about)
            fresh = [
                i
                for i, lifecycle in members.items()
                if not lifecycle.startswith(("Terminating", "Detach", "Standby"))
                and (before is None or i not in before)
            ]
            if fresh:
                answer = await self._ec2("describe_instances", about=about, InstanceIds=fresh)
                unclaimed = [
                    raw
                    for raw in instances_of(answer)
                    if TAG_CLIENT_TOKEN not in tags_of(raw) and state_name(raw) not in _GONE
                ]
                for raw in sorted(unclaimed, key=lambda r: str(r.get("LaunchTime")), reverse=True):
                    new_id = raw["InstanceId"]
                    await self._ec2(
                        "create_tags", about=about, Resources=[new_id], Tags=tag_list(tags)
                    )
                    again = await self._describe(new_id)
                    if again is not None and (
                        tags_of(again).get(TAG_CLIENT_TOKEN) == request.client_token
                    ):
                        return again
            if loop.time() >= deadline:
                raise DriverError(
                    f"aws: {about}: the group launched no replacement within "
                    f"{self._config.replace_timeout_s:g} s; calling again carries on"
                )
            await asyncio.sleep(self._config.poll_interval_s)

    # -- SupportsReprovision ------------------------------------------------------------

    async def reprovision(self, instance_id: str, *, user_data: dict[str, str]) -> Instance | None:
        """Relaunch the node on a fresh machine from the launch template, booted with
        ``user_data``; the node name, cluster and group membership carry over, the
        instance id does NOT (a new machine, new root and instance-store disks).

        EC2's in-place reinstall (``CreateReplaceRootVolumeTask``, same instance id) is
        not used: moto, the only AWS this project can test against, lacks it. Waits (at
        most ``replace_timeout_s``) for the new machine to run and join the group, then
        terminates the old one and returns the new one (the node moves onto it).
        Idempotent: the new machine's client token is derived from the old instance id.
        Kills running jobs and erases the disks; drain first.

        Raises:
            DriverError: no such instance, it is not a gpufleet instance, AWS refused, or
                the new machine did not run in time (calling again carries on).
        """
        raw = await self._describe(instance_id)
        if raw is None:
            raise DriverError(f"aws: instance {instance_id}: reprovision: no such instance")
        tags = tags_of(raw)
        if TAG_CLUSTER not in tags or TAG_NODE not in tags:
            raise DriverError(
                f"aws: instance {instance_id}: reprovision: it has no {TAG_CLUSTER} and "
                f"{TAG_NODE} tags (not launched by gpufleet)"
            )
        request = ProvisionRequest(
            client_token=f"reprovision/{instance_id}",
            cluster_id=tags[TAG_CLUSTER],
            node_name=tags[TAG_NODE],
            gpu_model="",
            gpu_count=0,
            user_data=dict(user_data),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._config.replace_timeout_s
        while True:
            new = await self.provision(request)  # attaches it to the group once running
            if new.state is InstanceState.RUNNING:
                break
            if new.state is not InstanceState.PENDING:
                raise DriverError(
                    f"aws: instance {instance_id} (node {request.node_name}): reprovision: "
                    f"new machine {new.instance_id} is {new.state.value}: {new.error or ''}"
                )
            if loop.time() >= deadline:
                raise DriverError(
                    f"aws: instance {instance_id} (node {request.node_name}): reprovision: "
                    f"new machine {new.instance_id} not running after "
                    f"{self._config.replace_timeout_s:g} s; calling again carries on"
                )
            await asyncio.sleep(self._config.poll_interval_s)
        await self.terminate(instance_id)
        return new


def _unreachable(instance_id: str, detail: str) -> ReachCheck:
    return ReachCheck(instance_id, reachable=False, power=PowerState.UNKNOWN, detail=detail)


def _about(request: ProvisionRequest) -> str:
    return (
        f"node {request.node_name} (cluster {request.cluster_id}, "
        f"client token {request.client_token})"
    )


def _node(raw: Mapping[str, Any]) -> str:
    """`` (node gpu-3)`` for a tagged instance, else nothing."""
    node = tags_of(raw).get(TAG_NODE)
    return f" (node {node})" if node else ""
