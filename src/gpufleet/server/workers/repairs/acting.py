"""The acting step (acting → verifying): reboot, reprovision, reset a GPU, fail over to a
new host, remove.

Every provider call is guarded by what ``progress`` recorded before it was made:
``requested_at`` (and the node's kernel boot id then, ``boot_id_before``) is written
before the provider is asked, and after a crash a changed boot id (or, for a node whose
agent reports none, the machine's ``booted_at``) says whether the reboot already
happened; until the node either boots again or reports its old boot id well after the
request (``REBOOT_TAKES_HOLD_S``), the step waits, so a machine is never asked twice. A
failover's replacement has the repair id as its idempotency key.

A reboot or reprovision is done when the machine proves it: its agent reports a new
kernel boot id. A BMC or cloud API answering is only the request being taken.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select

from gpufleet.core.enums import NodeState, RepairAction, RepairStatus
from gpufleet.core.errors import DriverError, InvalidInput
from gpufleet.core.ids import is_id
from gpufleet.providers.base import (
    Instance,
    InstanceState,
    Provider,
    ProvisionRequest,
    SupportsGpuReset,
    SupportsReboot,
    SupportsReprovision,
)
from gpufleet.server.db.tables import GpuRow, HostRow, NodeRow
from gpufleet.server.services.auth import NODE_TOKEN_PREFIX, generate_token, hash_token
from gpufleet.server.services.enrollment import open_enrollment, takes_no_user_data
from gpufleet.server.services.hosts import take_out_of_service
from gpufleet.server.services.stacks import stack_of_node, stack_user_data
from gpufleet.server.workers.repairs.context import (
    ACTOR,
    LoadedRepair,
    RepairContext,
    close_findings,
    parse_ts,
)

# A machine told to reboot (or reinstall) stops its agent within this: a report of the
# old boot id received later says the ask never reached it.
REBOOT_TAKES_HOLD_S = 15.0


async def act(ctx: RepairContext, loaded: LoadedRepair) -> None:
    action = RepairAction(loaded.repair.action)
    if action is RepairAction.FAILOVER:
        await _failover(ctx, loaded)
    elif action is RepairAction.REMOVE:
        await _remove(ctx, loaded)
    else:
        await _restart(ctx, loaded, action)


def _booted_since(instance: Instance | None, since: dt.datetime) -> bool:
    return instance is not None and instance.booted_at is not None and instance.booted_at >= since


async def _mark_requested(ctx: RepairContext, loaded: LoadedRepair) -> dt.datetime | None:
    """Record, before the provider is asked, that it is about to be: the node goes to
    repairing. Returns the time recorded (None if the repair moved on)."""
    async with ctx.locked(loaded) as tx:
        if tx is None:
            return None
        requested = parse_ts((tx.repair.progress or {}).get("requested_at"))
        if requested is not None:
            return requested
        boot_id = tx.node.boot_id
        tx.progress(requested_at=tx.now.isoformat(), boot_id_before=boot_id)
        tx.repair.detail = f"asking {loaded.cluster.provider} to {tx.repair.action}"
        tx.node_to(NodeState.REPAIRING, f"repair {tx.repair.id}: {tx.repair.action}")
        now = tx.now
    loaded.repair.progress = {
        **loaded.progress,
        "requested_at": now.isoformat(),
        "boot_id_before": boot_id,
    }
    return now


def _booted_again(loaded: LoadedRepair) -> str | None:
    """The new kernel boot id the node's agent reported since the request, or None. Only
    for a node whose agent reported a boot id before the request."""
    before = loaded.progress.get("boot_id_before")
    now = loaded.node.boot_id
    if isinstance(before, str) and now is not None and now != before:
        return now
    return None


def _reported_after(loaded: LoadedRepair, requested: dt.datetime) -> bool:
    """The node reported (its old boot id) well after ``requested``: a reboot asked for
    then would have stopped its agent by that report."""
    last = loaded.node.last_report_at
    return last is not None and last >= requested + dt.timedelta(seconds=REBOOT_TAKES_HOLD_S)


def _proves_by_boot_id(loaded: LoadedRepair) -> bool:
    return isinstance(loaded.progress.get("boot_id_before"), str)


async def _requested(ctx: RepairContext, loaded: LoadedRepair) -> bool:
    """The request is on record (recorded now if it was not); False: moved on."""
    if parse_ts(loaded.progress.get("requested_at")) is not None:
        return True
    return await _mark_requested(ctx, loaded) is not None


# -- reboot, reprovision, reset_gpu -----------------------------------------------------


async def _restart(ctx: RepairContext, loaded: LoadedRepair, action: RepairAction) -> None:
    """reboot, reprovision, reset_gpu: ask once, then wait for the machine."""
    provider = ctx.provider(loaded)
    instance_id = loaded.node.provider_instance_id
    if instance_id is None:
        await ctx.fail(loaded, "the node has no machine to act on")
        return
    requested = parse_ts(loaded.progress.get("requested_at"))
    if loaded.progress.get("called_at") is None:
        if requested is None:
            if await _mark_requested(ctx, loaded) is None:
                return
            ctx.failpoints.hit("repair.acting.before_call")
        elif action is not RepairAction.RESET_GPU:
            if _booted_again(loaded) is not None or (
                not _proves_by_boot_id(loaded)
                and _booted_since(await provider.get_instance(instance_id), requested)
            ):
                # Crashed between asking and recording it: the new boot says it happened.
                await ctx.note(loaded, f"{action.value} already under way", called_at=ctx.now_iso())
                return
            if _proves_by_boot_id(loaded) and not _reported_after(loaded, requested):
                # Crashed between recording the request and recording the ask, and the
                # agent has not reported its old boot id since the ask would have taken
                # hold: the machine may be rebooting now. Asking again would reboot it
                # twice; its next boot id says which (new: done; old: never asked).
                if (ctx.clock.now() - requested).total_seconds() > loaded.policy.verify_timeout_s:
                    await ctx.fail(
                        loaded, f"machine neither rebooted nor reported after {action.value}"
                    )
                return
        try:
            await _call(ctx, loaded, provider, action, instance_id)
        except (DriverError, InvalidInput) as exc:
            await ctx.fail(loaded, f"{action.value} failed: {exc.message}")
            return
        ctx.failpoints.hit("repair.acting.after_call")
        if action is RepairAction.RESET_GPU:
            where = "all GPUs" if loaded.repair.gpu_index is None else (
                f"GPU {loaded.repair.gpu_index}"
            )  # fmt: skip
            await _acted(ctx, loaded, f"GPU reset done ({where})")
            return
        await ctx.note(
            loaded, f"{action.value} asked; waiting for the machine", called_at=ctx.now_iso()
        )
        return
    assert requested is not None
    booted = _booted_again(loaded)
    if booted is not None:
        await _acted(
            ctx,
            loaded,
            f"{action.value} done: node {loaded.node.name} booted again (boot id {booted})",
        )
        return
    instance = await provider.get_instance(instance_id)
    waited_s = (ctx.clock.now() - requested).total_seconds()
    if instance is None or instance.state is InstanceState.TERMINATED:
        await ctx.fail(loaded, f"machine {instance_id} is gone")
    elif instance.state is InstanceState.FAILED:
        await ctx.fail(loaded, f"machine did not come back after {action.value}: {instance.error}")
    elif (
        not _proves_by_boot_id(loaded)
        and instance.state is InstanceState.RUNNING
        and _booted_since(instance, requested)
    ):
        # An agent that reports no boot id: the provider's boot time is all there is.
        await _acted(ctx, loaded, f"{action.value} done: machine {instance_id} is running")
    elif waited_s > loaded.policy.verify_timeout_s:
        still = (
            f"; its agent still reports boot id {loaded.node.boot_id}"
            if _proves_by_boot_id(loaded)
            else ""
        )
        await ctx.fail(
            loaded,
            f"machine not back {loaded.policy.verify_timeout_s:.0f} s after {action.value} "
            f"({provider.kind}, host {loaded.node.hostname or instance_id}){still}",
        )


async def _call(
    ctx: RepairContext,
    loaded: LoadedRepair,
    provider: Provider,
    action: RepairAction,
    instance_id: str,
) -> None:
    if action is RepairAction.REBOOT:
        if not isinstance(provider, SupportsReboot):
            raise InvalidInput(f"provider {provider.kind} cannot reboot machines")
        await provider.reboot(instance_id)
    elif action is RepairAction.REPROVISION:
        if not isinstance(provider, SupportsReprovision):
            raise InvalidInput(f"provider {provider.kind} cannot reprovision machines")
        token = generate_token(NODE_TOKEN_PREFIX)
        enrolls = takes_no_user_data(loaded.cluster.provider)
        async with ctx.db.transaction() as session:
            node = await session.get(NodeRow, loaded.node.id, with_for_update=True)
            if node is None:
                return
            if enrolls:  # the new install's agent enrolls for the node's new token
                open_enrollment(node, now=ctx.clock.now())
            else:
                node.token_hash = hash_token(token)  # a fresh install gets a fresh token
            # A reinstall installs the node's stack (a rollout's new one, else the cluster's).
            stack = await stack_user_data(session, stack_of_node(node, loaded.cluster))
        user_data = _user_data(ctx, loaded, None if enrolls else token)
        if stack is not None:
            user_data["gpufleet_stack"] = stack
        moved = await provider.reprovision(instance_id, user_data=user_data)
        if moved is not None and moved.instance_id != instance_id:
            await _relaunched(ctx, loaded, moved)
    elif action is RepairAction.RESET_GPU:
        if not isinstance(provider, SupportsGpuReset):
            raise InvalidInput(
                f"provider {provider.kind} cannot reset GPUs; choose a reboot for this node "
                "(only a provider that implements SupportsGpuReset resets one GPU)"
            )
        await provider.reset_gpu(instance_id, gpu_index=loaded.repair.gpu_index)
    else:
        raise InvalidInput(f"no provider call for action {action.value}")


async def _relaunched(ctx: RepairContext, loaded: LoadedRepair, moved: Instance) -> None:
    """A provider that reprovisions by relaunching (no in-place reinstall) put the node on
    a new machine: the node follows it, so the wait and later repairs ask about it."""
    async with ctx.locked(loaded) as tx:
        if tx is None:
            return
        old = tx.node.provider_instance_id
        tx.node.provider_instance_id = moved.instance_id
        tx.node.hostname = moved.hostname or tx.node.hostname
        tx.node.serial = moved.serial or tx.node.serial
        tx.step_event(
            f"reprovisioned onto a new machine: {old} → {moved.instance_id}",
            {"old_instance_id": old, "new_instance_id": moved.instance_id},
        )
    loaded.node.provider_instance_id = moved.instance_id


def _user_data(ctx: RepairContext, loaded: LoadedRepair, token: str | None) -> dict[str, str]:
    """What a new or reinstalled machine is handed at boot; no token where its provider
    cannot carry one (bare metal: the agent enrolls instead)."""
    data = {"gpufleet_url": ctx.server_url(), "gpufleet_scheduler": loaded.cluster.scheduler}
    if token is not None:
        data["gpufleet_node_token"] = token
    return data


async def _acted(ctx: RepairContext, loaded: LoadedRepair, reason: str) -> None:
    await ctx.transition(
        loaded,
        RepairStatus.VERIFYING,
        reason,
        progress={"acted_at": ctx.now_iso()},
        detail="waiting for the node to report clean",
    )


# -- failover ---------------------------------------------------------------------------


async def _failover(ctx: RepairContext, loaded: LoadedRepair) -> None:
    """Provision a replacement, wait for it, move the node onto it, retire the old."""
    provider = ctx.provider(loaded)
    if loaded.progress.get("swapped_at"):
        old = loaded.progress.get("old_instance_id")
        left = ""
        if isinstance(old, str):
            try:
                await provider.terminate(old)
            except DriverError as exc:
                # The node already runs on its new machine: a broken host whose BMC is
                # dead must not hold it back. The old one is flagged, never handed out.
                await _flag_for_service(ctx, loaded, old, why=exc.message)
                left = (
                    f"; the old machine {old} was not given back ({exc.message}): power it "
                    "off and retire it by hand"
                )
        await _acted(
            ctx, loaded, f"failed over to machine {loaded.node.provider_instance_id}{left}"
        )
        return
    if not await _requested(ctx, loaded):
        return
    waiting_for = loaded.progress.get("replacement_instance_id")
    token_hash = loaded.progress.get("replacement_token_hash")
    if isinstance(waiting_for, str) and isinstance(token_hash, str):
        # Asked for already: follow that machine. Its node token went out in the first
        # pass's user data, which a cloud cannot change on a launched instance.
        found = await provider.get_instance(waiting_for)
        if found is None or found.state is InstanceState.TERMINATED:
            await ctx.fail(loaded, f"replacement machine {waiting_for} is gone")
            return
        instance = found
    else:
        token = generate_token(NODE_TOKEN_PREFIX)
        token_hash = hash_token(token)
        enrolls = takes_no_user_data(loaded.cluster.provider)
        user_data = _user_data(ctx, loaded, None if enrolls else token)
        async with ctx.db.session() as session:  # the replacement runs the node's stack
            stack = await stack_user_data(session, stack_of_node(loaded.node, loaded.cluster))
        if stack is not None:
            user_data["gpufleet_stack"] = stack
        request = ProvisionRequest(
            client_token=f"{loaded.repair.id}/failover",
            cluster_id=loaded.cluster.id,
            node_name=loaded.node.name,
            gpu_model=loaded.cluster.gpu_model,
            gpu_count=loaded.cluster.gpus_per_node,
            user_data=user_data,
        )
        try:
            # Idempotent by client token: after a crash before the replacement was
            # recorded, the same machine again (the sim refreshes its user data; a cloud
            # keeps the first token, and the replacement then never reports: the verify
            # timeout fails the repair and the ladder moves on).
            instance = await provider.provision(request)
        except DriverError as exc:
            if _waited_s(ctx, loaded) > loaded.policy.verify_timeout_s:
                # An empty spare pool or a cloud out of capacity: the ladder moves on.
                await ctx.fail(
                    loaded,
                    f"no replacement machine {loaded.policy.verify_timeout_s:.0f} s after the "
                    f"failover was asked: {exc.message}",
                )
                return
            await ctx.note(loaded, f"no replacement machine yet: {exc.message}")
            return
    if instance.state is InstanceState.FAILED:
        await provider.terminate(instance.instance_id)
        await ctx.fail(loaded, f"replacement machine failed to boot: {instance.error}")
    elif instance.state is not InstanceState.RUNNING:
        if _waited_s(ctx, loaded) > loaded.policy.verify_timeout_s:
            # Given back, so nothing half-started is left running (and billed).
            await provider.terminate(instance.instance_id)
            await ctx.fail(
                loaded,
                f"replacement machine {instance.instance_id} not running "
                f"{loaded.policy.verify_timeout_s:.0f} s after the failover was asked",
            )
            return
        await ctx.note(
            loaded,
            f"waiting for replacement machine {instance.instance_id}",
            replacement_instance_id=instance.instance_id,
            replacement_token_hash=token_hash,
        )
    else:
        ctx.failpoints.hit("repair.acting.after_call")
        await _swap(ctx, loaded, instance, token_hash=token_hash)


def _waited_s(ctx: RepairContext, loaded: LoadedRepair) -> float:
    requested = parse_ts(loaded.progress.get("requested_at"))
    return 0.0 if requested is None else (ctx.clock.now() - requested).total_seconds()


async def _flag_for_service(
    ctx: RepairContext, loaded: LoadedRepair, host_id: str, *, why: str
) -> None:
    """The old machine of a failover could not be given back: where it is a host of the
    inventory, take it out of service so no provisioning or failover claims it again."""
    async with ctx.locked(loaded) as tx:
        if tx is None:
            return
        host = await tx.session.get(HostRow, host_id) if is_id(host_id) else None
        if host is not None:
            take_out_of_service(
                tx.session, host=host, actor=ACTOR, now=tx.now,
                reason=f"repair {tx.repair.id}: replaced, but not powered off: {why}",
            )  # fmt: skip
        tx.step_event(f"old machine {host_id} not given back: {why}", {"old_instance_id": host_id})


async def _swap(
    ctx: RepairContext, loaded: LoadedRepair, instance: Instance, *, token_hash: str
) -> None:
    async with ctx.locked(loaded) as tx:
        if tx is None:
            return
        node = tx.node
        old = node.provider_instance_id
        node.provider_instance_id = instance.instance_id
        if takes_no_user_data(loaded.cluster.provider):
            open_enrollment(node, now=tx.now)  # the spare's agent enrolls as this node
        else:
            node.token_hash = token_hash
        node.serial = instance.serial
        if instance.hostname and node.scheduler_name == node.hostname:
            # The scheduler knows machines by hostname (Slurm's NodeName): the node's
            # scheduler name follows it to the new host, as provisioning named it.
            node.scheduler_name = instance.hostname
        node.hostname = instance.hostname or node.hostname
        node.bmc_address = instance.bmc_address
        node.rack, node.leaf_switch = instance.rack, instance.leaf_switch
        node.pdu = instance.pdu
        node.last_report_at = None
        for gpu in await tx.session.scalars(
            select(GpuRow).where(GpuRow.node_id == node.id, GpuRow.removed_at.is_(None))
        ):
            gpu.removed_at = tx.now  # the old host's GPUs leave with it
        await close_findings(tx, why="the node moved to a new host")
        tx.progress(old_instance_id=old, swapped_at=tx.now.isoformat())
        tx.step_event(
            f"node moved from machine {old} to {instance.instance_id} (serial {instance.serial})",
            {"old_instance_id": old, "new_instance_id": instance.instance_id},
        )


# -- remove -----------------------------------------------------------------------------


async def _remove(ctx: RepairContext, loaded: LoadedRepair) -> None:
    """Give the machine back and take the node out of the cluster, flagged for
    hardware service."""
    if not await _requested(ctx, loaded):
        return
    instance_id = loaded.node.provider_instance_id
    if instance_id is not None:
        await ctx.provider(loaded).terminate(instance_id)
    ctx.failpoints.hit("repair.acting.after_call")
    async with ctx.locked(loaded) as tx:
        if tx is None:
            return
        why = (
            f"repair {tx.repair.id}: removed for hardware service "
            f"(host {tx.repair.host or tx.node.serial}, {tx.repair.signature_id})"
        )
        tx.node_to(NodeState.REMOVING, why)
        tx.node_to(NodeState.REMOVED, why)
        tx.node.token_hash = None
        await close_findings(tx, why=why)
        tx.progress(hardware_service=True)
        given_back = f"machine {instance_id} given back; flagged for hardware service"
        tx.repair_to(RepairStatus.VERIFYING, given_back)
        tx.repair_to(RepairStatus.SUCCEEDED, given_back)
