"""``run_agent(settings)``: build the collectors, the spool and the sender, then run.

SIGTERM and SIGINT stop it cleanly: loops are cancelled, NVML is shut down, and the
spool already holds everything unsent (it is written before anything is sent).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping
from pathlib import Path

from gpufleet.agent.access import AccessApplier, AccessSync
from gpufleet.agent.collectors.base import Collector, EventSource
from gpufleet.agent.collectors.infiniband import InfinibandCollector
from gpufleet.agent.collectors.kmsg import KernelLogFollower, make_source
from gpufleet.agent.collectors.nvml import NvmlCollector
from gpufleet.agent.collectors.sim import SimCollector
from gpufleet.agent.collectors.slurm import SlurmCollector
from gpufleet.agent.commands import CommandChannel, CommandJournal, kernel_boot_id, new_boot_id
from gpufleet.agent.daemons import DaemonSpec, DaemonSupervisor, SupervisorPolicy
from gpufleet.agent.detectors import Detector
from gpufleet.agent.enroll import obtain_node_token
from gpufleet.agent.exporter import serve
from gpufleet.agent.gres_check import GresCheck
from gpufleet.agent.hostio.reader import HostIoReader
from gpufleet.agent.job_labels import JobLabels
from gpufleet.agent.kube_pods import NodePods, in_cluster_api_url
from gpufleet.agent.outbox import Outbox
from gpufleet.agent.runtime import Agent, FindingContext, SampleCheck
from gpufleet.agent.sender import Sender, SendStatus
from gpufleet.agent.settings import AgentSettings
from gpufleet.agent.software import read_software
from gpufleet.agent.spool import Spool
from gpufleet.client.agent import AgentClient
from gpufleet.core.agent_protocol import NodeIdentity
from gpufleet.core.clock import Clock, SystemClock

log = logging.getLogger(__name__)

AGENT_VERSION = "0.1.0"
KNOWN_COLLECTORS = frozenset({"nvml", "kmsg", "infiniband", "slurm", "daemons", "sim"})


def build_collectors(settings: AgentSettings) -> tuple[list[Collector], list[EventSource]]:
    """The collectors and event sources the settings ask for (``build_checks`` adds the
    checks that look at their results together)."""
    unknown = set(settings.collectors) - KNOWN_COLLECTORS
    if unknown:
        raise ValueError(f"unknown collectors {sorted(unknown)}; known: {sorted(KNOWN_COLLECTORS)}")
    collectors: list[Collector] = []
    sources: list[EventSource] = []
    wanted = set(settings.collectors)
    if "nvml" in wanted:
        nvml = NvmlCollector(expected_gpus=settings.expected_gpus)
        collectors.append(nvml)
        sources.append(nvml)
    if "sim" in wanted:
        collectors.append(SimCollector(gpus=settings.sim_gpus))
    if "infiniband" in wanted:
        collectors.append(
            InfinibandCollector(root=settings.infiniband_dir(), exclude=settings.infiniband_exclude)
        )
    slurm: SlurmCollector | None = None
    if "slurm" in wanted:
        slurm = SlurmCollector(hostname=settings.hostname)
        collectors.append(slurm)
    if "daemons" in wanted:
        collectors.append(build_supervisor(settings, slurm))
    if "kmsg" in wanted:
        reader = make_source(settings.kernel_log, state_dir=settings.state_dir)
        if reader is not None:
            sources.append(KernelLogFollower(reader))
    return collectors, sources


def build_supervisor(settings: AgentSettings, slurm: SlurmCollector | None) -> DaemonSupervisor:
    specs = []
    if settings.slurmd_pidfile is not None:
        specs.append(
            DaemonSpec(
                "slurmd",
                settings.slurmd_pidfile,
                settings.slurmd_start,
                slurm_node=settings.hostname,
            )
        )
    if settings.munge_pidfile is not None:
        specs.append(DaemonSpec("munge", settings.munge_pidfile, settings.munge_start))

    def not_responding(node: str) -> bool | None:
        del node  # the Slurm collector reads this node only
        return None if slurm is None or slurm.last is None else slurm.last.not_responding

    policy = SupervisorPolicy(
        check_s=settings.daemon_check_s,
        hang_s=settings.daemon_hang_s,
        backoff_initial_s=settings.daemon_backoff_initial_s,
        backoff_max_s=settings.daemon_backoff_max_s,
        stable_s=settings.daemon_stable_s,
        flap_restarts=settings.daemon_flap_restarts,
        flap_window_s=settings.daemon_flap_window_s,
    )
    return DaemonSupervisor(
        specs, state_dir=settings.state_dir, policy=policy, not_responding=not_responding
    )


def build_checks(settings: AgentSettings, collectors: list[Collector]) -> list[SampleCheck]:
    checks: list[SampleCheck] = []
    slurm = next((c for c in collectors if isinstance(c, SlurmCollector)), None)
    if slurm is not None and settings.gres_check:
        fix = settings.gres_fix_command
        checks.append(
            GresCheck(
                slurm,
                state_dir=settings.state_dir,
                fix_command=settings.slurmd_start if fix is None else fix,
                fix_timeout_s=settings.gres_fix_timeout_s,
                verify_s=settings.gres_verify_s,
            )
        )
    return checks


def build_access_sync(settings: AgentSettings, client: AgentClient) -> AccessSync | None:
    """The loop that applies the project's admins to sudoers and Slurm, if turned on."""
    if not settings.access_sync:
        return None
    applier = AccessApplier(
        state_dir=settings.state_dir,
        sudoers_path=settings.sudoers_path,
        visudo=settings.visudo_command,
        sacctmgr=settings.sacctmgr_command if settings.slurm_admin_levels else None,
        slurm_account=settings.slurm_account,
    )
    return AccessSync(client, applier, interval_s=settings.access_interval_s)


def build_node_pods(
    settings: AgentSettings, *, environ: Mapping[str, str], clock: Clock
) -> NodePods | None:
    """Kubernetes mode: the reader of this node's pods, for findings' pod context."""
    if not settings.kubernetes_node:
        return None
    api_url = settings.kubernetes_api_url or in_cluster_api_url(environ)
    if api_url is None:
        log.warning(
            "Kubernetes mode, but no API server: not in a pod (no KUBERNETES_SERVICE_HOST) "
            "and GPUFLEET_AGENT_KUBERNETES_API_URL unset; findings carry no pod context"
        )
        return None
    return NodePods(
        node=settings.kubernetes_node,
        api_url=api_url,
        token_file=settings.kubernetes_token_file,
        ca_file=settings.kubernetes_ca_file,
        interval_s=settings.kubernetes_pods_interval_s,
        clock=clock,
    )


def build_host_reader(settings: AgentSettings) -> HostIoReader | None:
    """What /metrics reads of the host's I/O at each scrape (None: host_metrics off)."""
    if not settings.host_metrics:
        return None
    return HostIoReader(
        sys_root=settings.sys_root,
        proc_root=settings.proc_root,
        infiniband_root=settings.infiniband_dir(),
        infiniband_exclude=settings.infiniband_exclude,
        net_exclude=settings.net_device_exclude or None,
        disk_exclude=settings.disk_device_exclude or None,
    )


def build_job_labels(settings: AgentSettings, pods: NodePods | None) -> JobLabels | None:
    """The job labels of GPU series, if turned on (metrics_job_labels)."""
    if not settings.metrics_job_labels:
        return None
    return JobLabels(
        mapping_dir=settings.metrics_job_mapping_dir,
        pods=(lambda: pods.listing) if pods is not None else None,
        max_values=settings.metrics_job_label_max,
    )


def node_serial() -> str | None:
    try:
        text = Path("/sys/class/dmi/id/product_serial").read_text(encoding="utf-8").strip()
    except OSError:
        return None  # root-only on most systems; the server matches on hostname then
    return text[:120] or None


def build_agent(
    settings: AgentSettings,
    *,
    client: AgentClient,
    collectors: list[Collector],
    sources: list[EventSource],
    clock: Clock | None = None,
    context: FindingContext | None = None,
) -> Agent:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    spool = Spool(settings.state_dir, metrics_limit_bytes=int(settings.spool_metrics_mb * 2**20))
    status = SendStatus(report_interval_s=settings.report_interval_s)
    identity = NodeIdentity(
        hostname=settings.hostname,
        serial=node_serial(),
        agent_version=AGENT_VERSION,
        boot_id=kernel_boot_id(settings.boot_id_file),
        software=read_software(agent=AGENT_VERSION),
    )
    # The node's state in gpufleet is the server's word of this run, never one left from
    # before a reboot (a boot gate would start slurmd on a stale in_service).
    node_state_file = settings.state_dir / "node-state"
    node_state_file.unlink(missing_ok=True)
    sender = Sender(
        client,
        spool,
        identity=identity,
        retry_initial_s=settings.retry_initial_s,
        retry_max_s=settings.retry_max_s,
        status=status,
        outbox=Outbox(settings.state_dir),
        node_state_file=node_state_file,
    )
    return Agent(
        collectors=collectors,
        sources=sources,
        detector=Detector(),
        spool=spool,
        sender=sender,
        status=status,
        clock=clock or SystemClock(),
        state_dir=settings.state_dir,
        sample_interval_s=settings.sample_interval_s,
        checks=build_checks(settings, collectors),
        context=context,
    )


def build_command_channel(settings: AgentSettings, client: AgentClient) -> CommandChannel:
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return CommandChannel(
        client,
        CommandJournal(settings.state_dir, boot_id_file=settings.boot_id_file),
        boot_id=new_boot_id(),
        concurrency=settings.command_concurrency,
        wait_s=settings.command_wait_s,
        poll_s=settings.command_poll_s,
        kill_grace_s=settings.command_kill_grace_s,
        retry_initial_s=settings.retry_initial_s,
        retry_max_s=settings.retry_max_s,
    )


async def run_agent_async(settings: AgentSettings, *, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    token = await obtain_node_token(settings, stop=stop)
    if token is None:
        return  # stopped while waiting to enroll
    collectors, sources = build_collectors(settings)
    client = AgentClient(
        base_url=settings.server_url, node_token=token, timeout_s=settings.request_timeout_s
    )
    pods = build_node_pods(settings, environ=os.environ, clock=SystemClock())
    agent = build_agent(
        settings,
        client=client,
        collectors=collectors,
        sources=sources,
        context=pods.context if pods is not None else None,
    )
    pods_task = asyncio.create_task(pods.run(stop), name="kube-pods") if pods else None
    commands = (
        asyncio.create_task(build_command_channel(settings, client).run(), name="commands")
        if settings.commands
        else None
    )
    server = None
    if settings.metrics_listen:
        server = await serve(
            agent,
            listen=settings.metrics_listen,
            hostname=settings.hostname,
            host=build_host_reader(settings),
            jobs=build_job_labels(settings, pods),
        )
    log.info(
        "gpufleet agent %s for %s → %s (collectors: %s)",
        AGENT_VERSION,
        settings.hostname,
        settings.server_url,
        ", ".join(c.name for c in collectors) or "none",
    )
    access = build_access_sync(settings, client)
    access_task = asyncio.create_task(access.run(stop)) if access is not None else None
    try:
        await agent.run(stop)
    finally:
        if access_task is not None:
            stop.set()
            await access_task
        if pods is not None and pods_task is not None:
            stop.set()
            await pods_task
            await pods.aclose()
        if commands is not None:
            commands.cancel()  # running commands are killed and recorded failed
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await commands
        if server is not None:
            server.close()
            await server.wait_closed()
        await client.aclose()
        agent.spool.close()
        log.info("gpufleet agent stopped")


def run_agent(settings: AgentSettings) -> None:
    """Run until SIGTERM/SIGINT."""
    asyncio.run(run_agent_async(settings))
