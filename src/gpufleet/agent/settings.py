"""Agent settings: one typed object, read from ``GPUFLEET_AGENT_*`` environment variables.

Passed into ``run_agent(settings)``; nothing reads it as a module global. The /metrics
settings are declared in ``metrics_settings.py`` and inherited.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from gpufleet.agent.metrics_settings import MetricsSettings
from gpufleet.client.http import parse_server_urls
from gpufleet.schedulers.kubernetes.config import SERVICE_ACCOUNT_DIR

# The kernel's boot id, new on every boot (what proves a reboot happened).
KERNEL_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")

_LOG_SOURCE = re.compile(r"^(auto|kmsg|journal|none|file:.+)$")


class AgentSettings(MetricsSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_AGENT_", extra="ignore")

    server_url: str = Field(
        default="http://127.0.0.1:8080",
        description=(
            "Base URL of the gpufleet server (the server's public_url); with several "
            "replicas, all their URLs comma-separated: the agent sends to the one that "
            "answered last and moves to the next when it is down (docs/high-availability.md)."
        ),
    )
    node_token: SecretStr | None = Field(
        default=None,
        description="This node's token. Prefer node_token_file: env vars leak into ps/proc.",
    )
    node_token_file: Path | None = Field(
        default=None,
        description="File holding the node token (a Kubernetes Secret mount, a 0600 file).",
    )
    enroll_token: SecretStr | None = Field(
        default=None,
        description=(
            "The cluster's enroll token (bare metal: the install hands it over, not user "
            "data). With no node token yet, the agent trades it and its hostname for its "
            "node's token and keeps that in node_token_file (default state_dir/node-token)."
        ),
    )
    enroll_token_file: Path | None = Field(
        default=None, description="File holding the enroll token (preferred over the env var)."
    )
    hostname: str = Field(
        default_factory=socket.gethostname,
        description="Name this node reports; the hostname, so it matches Slurm and k8s.",
    )
    kubernetes_node: str | None = Field(
        default=None,
        max_length=253,
        description=(
            "Kubernetes mode: the node this agent's DaemonSet pod runs on (the downward "
            "API's spec.nodeName). The node reports under this name (the Kubernetes node "
            "name, which the server's Kubernetes driver uses), whatever the pod's hostname."
        ),
    )
    kubernetes_api_url: str | None = Field(
        default=None,
        max_length=2000,
        description=(
            "Kubernetes mode: the API server's base URL (http or https). Unset: "
            "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the in-cluster "
            "address every pod is given. Set it for tests or an agent outside the cluster."
        ),
    )
    kubernetes_token_file: Path = Field(
        default=Path(SERVICE_ACCOUNT_DIR) / "token",
        description=(
            "The service-account token sent to the API server. Read again before each "
            "listing: the kubelet rotates a projected token (hourly by default)."
        ),
    )
    kubernetes_ca_file: Path = Field(
        default=Path(SERVICE_ACCOUNT_DIR) / "ca.crt",
        description="The cluster CA that an https API server's certificate must chain to.",
    )
    kubernetes_pods_interval_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds between listings of this node's pods (a finding's pod context). 30 s: "
            "training pods live hours, and 2,000 nodes cost the API server ~67 lists a "
            "second, each served from its watch cache (resourceVersion=0)."
        ),
    )
    state_dir: Path = Field(
        default=Path("/var/lib/gpufleet-agent"),
        description=(
            "Spool and kernel-log offsets. Must survive agent restarts (and ideally reboots) "
            "so no finding is lost and no log line is reported twice."
        ),
    )
    sample_interval_s: float = Field(
        default=1.0,
        gt=0,
        description=(
            "Seconds between collector samples. 1 s: an NVML read of 8 GPUs costs ~1 ms, so "
            "1 Hz keeps detection latency near a second at well under 0.5 % of one core."
        ),
    )
    report_interval_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "Seconds between metrics batches: the server's default, so 2,000 nodes stay "
            "within one server process. Findings do not wait for it: they go at once."
        ),
    )
    expected_gpus: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="GPUs this node should have; fewer visible to NVML is a finding.",
    )
    collectors: tuple[str, ...] = Field(
        default=("nvml", "kmsg", "infiniband", "slurm", "daemons"),
        description=(
            "Collectors to run (nvml, kmsg, infiniband, slurm, daemons, sim). `daemons` "
            "keeps slurmd and munged running (see the slurmd_* / munge_* settings)."
        ),
    )
    slurmd_pidfile: Path | None = Field(
        default=Path("/run/slurmd.pid"),
        description=(
            "slurmd's pid file; supervised once it has existed (a crash leaves it, a clean "
            "stop removes it, so a stopped slurmd stays stopped). Unset: not supervised."
        ),
    )
    slurmd_start: tuple[str, ...] = Field(
        default=("systemctl", "restart", "slurmd"),
        description="Command (argv, no shell) that starts slurmd again.",
    )
    munge_pidfile: Path | None = Field(
        default=Path("/run/munge/munged.pid"),
        description="munged's pid file; supervised like slurmd. Unset: not supervised.",
    )
    munge_start: tuple[str, ...] = Field(
        default=("systemctl", "restart", "munge"),
        description="Command (argv, no shell) that starts munged again.",
    )
    daemon_check_s: float = Field(default=5.0, gt=0, description="Seconds between checks.")
    daemon_hang_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "A daemon stopped (state T), or a slurmd Slurm reports not responding, this long "
            "is hung: SIGKILLed and started again. Above SlurmdTimeout's usual 300 s is too "
            "late; under a few seconds would kill a slurmd that is busy for a moment."
        ),
    )
    daemon_backoff_initial_s: float = Field(default=5.0, gt=0)
    daemon_backoff_max_s: float = Field(
        default=300.0, gt=0, description="Restarts back off, doubling up to this."
    )
    daemon_stable_s: float = Field(
        default=600.0,
        gt=0,
        description="Up this long: the backoff resets and a keeps-dying finding clears.",
    )
    daemon_flap_restarts: int = Field(
        default=3, ge=2, description="This many restarts within daemon_flap_window_s..."
    )
    daemon_flap_window_s: float = Field(
        default=600.0, gt=0, description="...mean it keeps dying: a finding."
    )
    gres_check: bool = Field(
        default=True,
        description="Compare Slurm's GPUs (GRES, features) with the hardware (needs slurm).",
    )
    gres_fix_command: tuple[str, ...] | None = Field(
        default=None,
        description=(
            "Run when Slurm offers fewer GPUs than the node has, so slurmd registers them "
            "again. Unset: slurmd_start. An empty list: never fix, only report."
        ),
    )
    gres_fix_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds gres_fix_command may run before it is killed (it runs beside the "
            "sampling, never in its way). A slurmd restart takes a few seconds."
        ),
    )
    gres_verify_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "After the fix, Slurm must count every GPU within this many seconds, else the "
            "mismatch is raised. slurmd registers within a second or two of starting."
        ),
    )
    kernel_log: str = Field(
        default="auto",
        description=(
            "Kernel log source: auto (/dev/kmsg if readable, else journald), kmsg, journal, "
            "file:PATH (a syslog file; follows rotation) or none."
        ),
    )
    infiniband_root: Path | None = Field(
        default=None,
        description="sysfs root of the IB devices. Unset: <sys_root>/class/infiniband.",
    )
    infiniband_exclude: tuple[str, ...] = Field(
        default=(),
        description="IB devices to skip (restricted PFs on DGX/GB200 spam ACCESS_REG errors).",
    )
    boot_id_file: Path = Field(
        default=KERNEL_BOOT_ID,
        description=(
            "Where the kernel's boot id is read: a new one after a reboot is what proves a "
            "repair's reboot happened. Another path only where the host's /proc is mounted "
            "elsewhere, or for a stand-in machine."
        ),
    )
    sim_gpus: int = Field(
        default=8, ge=0, le=64, description="GPUs the sim collector pretends to have."
    )
    spool_metrics_mb: float = Field(
        default=32.0,
        gt=0,
        description=(
            "Disk budget for unsent metrics, MB; oldest dropped first. 32 MB holds about "
            "a day of 10 s reports from 8 GPUs: an outage longer than that loses old metrics."
        ),
    )
    spool_findings_warn_mb: float = Field(
        default=64.0,
        gt=0,
        description=(
            "Unsent findings are never dropped; past this size the agent logs a warning "
            "each cycle so an operator notices a server that has been gone for days."
        ),
    )
    commands: bool = Field(
        default=True,
        description=(
            "Take commands from the server (active checks, startup scripts) and run them "
            "as this agent's user, usually root. Off: the node never runs one."
        ),
    )
    command_concurrency: int = Field(
        default=1,
        ge=1,
        le=16,
        description=(
            "Commands run at once. 1: checks such as dcgmi diag or gpu_burn need every GPU "
            "to themselves, and two at once would fail each other."
        ),
    )
    command_wait_s: float = Field(
        default=20.0,
        ge=0,
        le=20,
        description=(
            "How long the server holds a command poll open (a long poll): a queued command "
            "starts within a second at one request per node per 20 s. 0: plain polling "
            "every command_poll_s."
        ),
    )
    command_poll_s: float = Field(
        default=5.0,
        gt=0,
        description="Seconds between polls when command_wait_s is 0 (or polls come back at once).",
    )
    command_kill_grace_s: float = Field(
        default=10.0,
        gt=0,
        description=(
            "After a command's timeout (or a cancel) its process group gets SIGTERM, then "
            "SIGKILL this many seconds later: time for mpirun to stop its ranks."
        ),
    )
    retry_initial_s: float = Field(
        default=1.0, gt=0, description="First retry delay while the server is unreachable."
    )
    retry_max_s: float = Field(
        default=30.0,
        gt=0,
        description="Backoff cap: a returning server sees the node again within 30 s.",
    )
    request_timeout_s: float = Field(
        default=10.0, gt=0, description="HTTP timeout per request to the server."
    )
    access_sync: bool = Field(
        default=False,
        description=(
            "Apply the cluster's access configuration: sudo for its project's admins "
            "(sudoers_path) and, with slurm_admin_levels, their Slurm AdminLevel. Off by "
            "default: it writes to /etc/sudoers.d, which an operator turns on knowingly."
        ),
    )
    access_interval_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Seconds between fetches of the access configuration: a membership change "
            "reaches every node within a minute, at one small GET per node per minute."
        ),
    )
    sudoers_path: Path | None = Field(
        default=Path("/etc/sudoers.d/gpufleet"),
        description="The sudoers fragment written (checked by visudo first). Unset: none.",
    )
    visudo_command: tuple[str, ...] = Field(
        default=("visudo",), description="visudo (argv); it runs with -cf <temp file>."
    )
    slurm_admin_levels: bool = Field(
        default=False,
        description=(
            "This node runs slurmctld (or may run sacctmgr): set each project member's "
            "Slurm AdminLevel (admins: Administrator, others: None). One node per cluster."
        ),
    )
    sacctmgr_command: tuple[str, ...] = Field(
        default=("sacctmgr",), description="sacctmgr (argv), for slurm_admin_levels."
    )
    slurm_account: str = Field(
        default="root",
        description="Account a project admin missing from slurmdbd is added to.",
    )

    @field_validator("kernel_log")
    @classmethod
    def _log_source(cls, value: str) -> str:
        if not _LOG_SOURCE.match(value):
            raise ValueError("kernel_log must be auto, kmsg, journal, none or file:PATH")
        return value

    @field_validator("server_url")
    @classmethod
    def _server_urls(cls, value: str) -> str:
        # Checked here, so a typo stops the agent at start, not at its first report.
        return ",".join(parse_server_urls(value))

    @field_validator("kubernetes_api_url")
    @classmethod
    def _api_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError("kubernetes_api_url must be an http:// or https:// URL")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _backoff(self) -> AgentSettings:
        if self.retry_max_s < self.retry_initial_s:
            raise ValueError("retry_max_s must be >= retry_initial_s")
        return self

    @model_validator(mode="after")
    def _kubernetes_node(self) -> AgentSettings:
        # In a pod without hostNetwork the hostname is the pod's; the node is what counts.
        if self.kubernetes_node:
            self.hostname = self.kubernetes_node
        return self

    def read_enroll_token(self) -> str | None:
        """The enroll token from the setting or its file; None if neither is set."""
        if self.enroll_token is not None:
            return self.enroll_token.get_secret_value()
        if self.enroll_token_file is not None:
            return self.enroll_token_file.read_text(encoding="utf-8").strip() or None
        return None

    def infiniband_dir(self) -> Path:
        """Where the IB devices are: infiniband_root, else <sys_root>/class/infiniband."""
        return self.infiniband_root or self.sys_root / "class" / "infiniband"

    def token_path(self) -> Path:
        """Where an enrolled agent keeps its node token."""
        return self.node_token_file or self.state_dir / "node-token"

    def read_token(self) -> str:
        """The node token from the setting or its file. Raises ``ValueError`` if neither."""
        if self.node_token is not None:
            return self.node_token.get_secret_value()
        if self.node_token_file is not None:
            return self.node_token_file.read_text(encoding="utf-8").strip()
        raise ValueError("set GPUFLEET_AGENT_NODE_TOKEN_FILE (or GPUFLEET_AGENT_NODE_TOKEN)")
