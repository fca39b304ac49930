"""Server settings: one typed object, read from ``GPUFLEET_*`` environment variables.

It is passed into ``create_app(settings)``; nothing reads it as a module global.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """The per-user data directory: ``$XDG_DATA_HOME/gpufleet`` or ``~/.local/share/gpufleet``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "gpufleet"


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUFLEET_", extra="ignore")

    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Where the SQLite database and the simulator's state live.",
    )
    database_url: str | None = Field(
        default=None,
        description=(
            "SQLAlchemy URL. Unset: SQLite in data_dir. For production use PostgreSQL, e.g. "
            "postgresql+asyncpg://user@host/db (postgresql:// is accepted and mapped to asyncpg)."
        ),
    )
    host: str = Field(default="127.0.0.1", description="Bind address; loopback by default.")
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    public_url: str | None = Field(
        default=None, description="URL agents and the CLI use to reach this server."
    )
    replica_id: str = Field(
        default_factory=default_replica_id,
        description="Names this replica in leases; must differ between replicas.",
    )
    report_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between agent reports (10 s: fresh enough for a console, cheap).",
    )
    staleness_s: float = Field(
        default=45.0,
        gt=0,
        description=(
            "Seconds without a report before a node is unknown: four missed 10 s reports, so "
            "one slow request never flips a node, but a dead agent shows within a minute."
        ),
    )
    reconcile_interval_s: float = Field(
        default=1.0, gt=0, description="Seconds between passes of each reconcile loop."
    )
    lease_ttl_s: float = Field(
        default=15.0,
        gt=0,
        description="Seconds a loop lease lasts unrenewed; a dead replica's loops move after this.",
    )
    max_body_bytes: int = Field(
        default=1_048_576,
        gt=0,
        description="Largest request body accepted (1 MiB: a 500-report batch fits easily).",
    )
    run_workers: bool = Field(default=True, description="Run the background loops in-process.")
    slurm_conf: Path | None = Field(
        default=None,
        description=(
            "slurm.conf of the Slurm cluster the `slurm` scheduler driver talks to (sets "
            "SLURM_CONF for its sinfo/squeue/sacct/scontrol). Unset: the host's own Slurm "
            "config, if Slurm's commands are installed; else no `slurm` driver."
        ),
    )
    sim_agents: bool = Field(
        default=False,
        description="Run simulated node agents for sim-provider nodes inside this process.",
    )
    sim_provision_delay_s: tuple[float, float] = Field(
        default=(30.0, 90.0),
        description="Range of simulated boot times, seconds (cloud VMs with GPUs: ~0.5-1.5 min).",
    )
    sim_max_instances: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Machines the simulated cloud has in all (a stockout past it: the provider "
            "refuses with out_of_capacity); unset: no limit."
        ),
    )
    sim_reboot_delay_s: tuple[float, float] = Field(
        default=(10.0, 30.0),
        description="Range of simulated reboot times, seconds (an OS reboot, no reinstall).",
    )
    sim_reset_gpu_delay_s: tuple[float, float] = Field(
        default=(5.0, 15.0),
        description="Range of simulated GPU reset times, seconds (the GPU is off meanwhile).",
    )
    sim_reboot_failure_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of simulated reboots that never come back."
    )
    sim_sticky_share: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description=(
            "Share of simulated background faults that are broken hardware: they come back "
            "after every reboot and reinstall, so repairs climb the ladder (0: every repair "
            "fixes the fault)."
        ),
    )
    sim_program_time_scale: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description=(
            "Simulated nodes' programs (dcgmi, all_reduce_perf, ib_write_bw, gpu_burn) take "
            "this share of what the real tools take, in simulated time (1: DCGM level 3 "
            "takes 15 min, as on a real node; the demo uses 0.01 so acceptance takes seconds)."
        ),
    )
    sim_busy_share: tuple[float, float] = Field(
        default=(0.6, 0.8),
        description="Share of a sim cluster's nodes its simulated users keep busy with jobs.",
    )
    sim_job_minutes: tuple[float, float] = Field(
        default=(5.0, 60.0),
        description="Range of simulated job durations, minutes (drains wait for them).",
    )
    repair_interval_s: float = Field(
        default=2.0,
        gt=0,
        description=(
            "Seconds between passes of the repair planner and executor (2 s: a finding "
            "becomes a recommendation, and an approval starts, within a few seconds)."
        ),
    )
    slurmd_watch_interval_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds between reads of the slurmd pods of each kubernetes cluster (Slurm on "
            "Kubernetes): a pod restarted or replaced by its controller becomes an event."
        ),
    )
    autoscale_interval_s: float = Field(
        default=15.0,
        gt=0,
        description=(
            "Seconds between passes of the autoscaler: each cluster with autoscaling on has "
            "its queue and nodes read, and its changes of size carried forward."
        ),
    )
    externalgrpc_address: str | None = Field(
        default=None,
        description=(
            "host:port to serve Kubernetes Cluster Autoscaler's externalgrpc CloudProvider "
            "service on (its cloud-config 'address'); unset: not served. Node groups are "
            "the clusters whose autoscaling mode is cluster-autoscaler."
        ),
    )
    externalgrpc_tls_key: Path | None = Field(
        default=None, description="PEM key of the externalgrpc service (mutual TLS)."
    )
    externalgrpc_tls_cert: Path | None = Field(
        default=None,
        description="PEM certificate of the externalgrpc service; names the host CA dials.",
    )
    externalgrpc_tls_cacert: Path | None = Field(
        default=None,
        description="PEM CA that signed Cluster Autoscaler's client certificate.",
    )
    accounting_interval_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds between copies of finished jobs from each scheduler's accounting "
            "(sacct); 30 s keeps usage fresh without loading slurmdbd."
        ),
    )
    # -- active check runs (docs/checks.md) ---------------------------------------------
    check_interval_s: float = Field(
        default=2.0,
        gt=0,
        description=(
            "Seconds between passes of the check runner (2 s: a check starts, and its "
            "result lands, within seconds of being asked for or of finishing)."
        ),
    )
    checks_output_dir: Path | None = Field(
        default=None,
        description=(
            "Where Slurm check jobs write their outputs and this server reads them: a "
            "directory the compute nodes write and the server reads (shared storage in "
            "production). Unset: data_dir/check-output (fine when both share a host)."
        ),
    )
    checks_slurm_user: str | None = Field(
        default=None,
        description=(
            "The Unix user check jobs run as (the reservation is for them). Unset: the "
            "user this server runs as."
        ),
    )
    checks_fabric: str | None = Field(
        default=None,
        description=(
            "The fabric ib_write_bw and multi-node NCCL figures are judged against (NDR, "
            "HDR, EDR) when neither the run nor its cluster (label `fabric`) names one. "
            "Unset: those figures are not judged (sim clusters model NDR)."
        ),
    )
    checks_stand_in: dict[str, list[str]] = Field(
        default_factory=dict,
        description=(
            "TESTS AND LABS ONLY: run this program instead of a check's tool, e.g. "
            '{"nccl": ["cat", "/srv/recorded/all_reduce.txt"]} (key: the check kind, or '
            '"<cluster id>/<kind>" for one cluster), so a machine without GPUs exercises '
            "the job, output path and parser. Results say stand_in: true. Never set in "
            "production; empty by default."
        ),
    )
    telemetry_history_s: float = Field(
        default=6 * 3600.0,
        gt=0,
        description=(
            "How long each node's per-minute GPU telemetry is kept for the console's "
            "charts, seconds (6 h: a training run's recent past; one ~250-byte row per node "
            "per minute, ~190 MB for 2,048 nodes)."
        ),
    )
    cluster_telemetry_history_s: float = Field(
        default=14 * 86400.0,
        gt=0,
        description=(
            "How long each cluster's per-minute GPU telemetry (sums over its nodes) is "
            "kept, seconds (14 days: two weeks of trends at ~20,000 small rows a cluster)."
        ),
    )
    failpoints: str = Field(
        default="",
        description="Tests only: comma-separated failpoint names where the server exits.",
    )
    sim_failure_rate: float = Field(
        default=0.0, ge=0, le=1, description="Share of simulated provisioning attempts that fail."
    )
    sim_fault_rate_per_gpu_day: float = Field(
        default=0.0005,
        ge=0,
        le=1000,
        description=(
            "Background faults in the simulated fleet, per GPU per day. 0.0005 (0.5 per "
            "1,000 GPU-days) is the published fleet rate (Llama 3: 0.47; Meta RSC clusters "
            "0.29-0.81; performance-anchors.md §1.4), so a realistic demo sees almost none; "
            "raise it to watch faults arrive: 2 gives the 128-GPU demo one every ~5 minutes."
        ),
    )
    announce_bootstrap_token: bool = Field(
        default=True,
        description="Print the bootstrap token on first start (the demo prints its own).",
    )
    bootstrap_token_file: Path | None = Field(
        default=None,
        description="If set, the first start writes the bootstrap admin token here (mode 0600).",
    )
    # -- Prometheus /metrics (docs/metrics.md) ----------------------------------------
    metrics_token_file: Path | None = Field(
        default=None,
        description=(
            "File holding a bearer token (32+ characters) that reads /metrics and nothing "
            "else: the one Prometheus scrapes with (`authorization.credentials_file`). A "
            "file, so it never sits in the environment; read at each scrape, so it rotates "
            "without a restart. Unset: only the platform owner's tokens read /metrics."
        ),
    )
    metrics_mttr_window_s: float = Field(
        default=7 * 86400.0,
        gt=0,
        description=(
            "Seconds of succeeded repairs the MTTR gauge averages over: a week smooths one "
            "day's mix of reboots and reinstalls and still shows a change within days."
        ),
    )
    # -- Prometheus per project and Grafana (docs/grafana.md) ---------------------------
    agent_metrics_port: int = Field(
        default=9404,
        ge=1,
        le=65535,
        description=(
            "Port of the agents' /metrics (the agent's `metrics_listen`, default 9404): "
            "the HTTP service discovery at /api/v1/prometheus/targets lists each node's "
            "hostname with it. One port for the fleet: the node row keeps no port."
        ),
    )
    prometheus_url: str | None = Field(
        default=None,
        description=(
            "Base URL of the Prometheus that scrapes the agents (e.g. "
            "http://prometheus:9090). The per-project query proxy "
            "(/api/v1/projects/{project}/prometheus/api/v1/...) forwards there with every "
            "selector forced to the project. Unset: the proxy answers 503."
        ),
    )
    prometheus_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds the query proxy waits for Prometheus: Prometheus's own default "
            "query timeout is 2 min, but a dashboard panel waiting longer is worse than "
            "an error."
        ),
    )
    grafana_url: str | None = Field(
        default=None,
        description=(
            "Base URL of the Grafana that `gpufleet grafana sync` provisions (one "
            "organisation per project), for the console's links to a project's dashboards "
            "(not wired yet: docs/grafana.md). Unset: no links."
        ),
    )
    # -- credentials at rest (docs/providers-inventory.md) ----------------------------
    secret_key: SecretStr | None = Field(
        default=None,
        description=(
            "Key that seals stored credentials (BMC passwords, SSH keys, cloud keys) with "
            "AES-256-GCM: 32 random bytes, base64. Unset (and no key file): the server runs, "
            "but refuses to store credentials."
        ),
    )
    secret_key_file: Path | None = Field(
        default=None,
        description=(
            "File holding the key instead (a file keeps it out of the environment): first "
            "line the current key, further lines previous keys (still opened, for rotation)."
        ),
    )
    previous_secret_keys: list[SecretStr] = Field(
        default_factory=list,
        description=(
            "JSON list of previous keys: credentials sealed under them still open until "
            "`gpufleet rotate-secret-key` re-seals them under the current key."
        ),
    )
    # -- login through the organisation's OIDC provider (docs/auth.md) --------------
    oidc_issuer: str | None = Field(
        default=None,
        description=(
            "Issuer URL of the OpenID Provider (Keycloak realm, Okta, Entra tenant v2.0); "
            "discovery is read from <issuer>/.well-known/openid-configuration. Unset: no "
            "browser login, API tokens only."
        ),
    )
    oidc_client_id: str | None = Field(
        default=None, description="Client id registered at the IdP for the console login."
    )
    oidc_client_secret_file: Path | None = Field(
        default=None,
        description=(
            "File holding the client secret (a file, so it never sits in the environment "
            "or a process listing). Unset: a public client; PKCE protects the code either way."
        ),
    )
    oidc_cli_client_id: str | None = Field(
        default=None,
        description=(
            "Public client id the CLI uses for the device authorization grant (it cannot "
            "keep a secret). Unset: oidc_client_id."
        ),
    )
    oidc_redirect_url: str | None = Field(
        default=None,
        description=(
            "Callback URL registered at the IdP. Unset: <public_url>/api/v1/auth/callback."
        ),
    )
    oidc_scopes: str = Field(
        default="openid email profile",
        description="Space-separated scopes asked for; add the IdP's groups scope if it has one.",
    )
    oidc_groups_claim: str = Field(
        default="groups",
        description=(
            "ID token claim listing the user's groups (Keycloak, Okta and Entra all use "
            "`groups` once the IdP is told to emit it)."
        ),
    )
    oidc_group_roles: dict[str, str] = Field(
        default_factory=dict,
        description=(
            'IdP group → "project:role" granted at each login, as JSON, e.g. '
            '{"fleet-admins": "ml:admin"}. Memberships granted this way follow the group '
            "(changed or removed at the next login); memberships made by hand are never touched."
        ),
    )
    oidc_allowed_algs: list[str] = Field(
        default_factory=lambda: ["RS256", "ES256"],
        description=(
            "ID token signature algorithms accepted, as JSON. Asymmetric only: `none` and "
            "HS* (signed with the client secret) are refused here."
        ),
    )
    oidc_leeway_s: float = Field(
        default=60.0,
        ge=0,
        le=300,
        description="Clock skew tolerated on exp/iat/nbf, seconds (60 s: NTP-synced hosts).",
    )
    oidc_metadata_ttl_s: float = Field(
        default=3600.0,
        gt=0,
        description=(
            "How long discovery and the JWKS are cached, seconds (an hour: IdPs publish new "
            "keys ahead of use; an unknown kid refetches the JWKS sooner)."
        ),
    )
    oidc_jwks_refetch_min_s: float = Field(
        default=10.0,
        ge=0,
        description=(
            "Least time between two JWKS fetches caused by an unknown kid, seconds, so "
            "tokens with made-up kids cannot make us hammer the IdP."
        ),
    )
    session_lifetime_s: float = Field(
        default=8 * 3600.0,
        gt=0,
        description="Lifetime of a console session, seconds (8 h: one working day, then log in).",
    )
    session_cookie_secure: bool | None = Field(
        default=None,
        description=(
            "Mark session cookies Secure (sent back over HTTPS only). Unset: Secure on every "
            "response to an HTTPS request and whenever the public URL is not http:// on "
            "loopback, so only the local demo gets plain cookies (a browser would never "
            "return Secure ones over http://127.0.0.1). true forces Secure everywhere; false "
            "is allowed only when the public URL is http:// on loopback."
        ),
    )
    cli_token_days: int = Field(
        default=30,
        ge=1,
        le=3650,
        description="Lifetime of the API token `gpufleet login --oidc` gets, days.",
    )
    auth_rate_limit_per_min: int = Field(
        default=30,
        ge=1,
        description=(
            "Login, callback and device-token requests allowed per client IP per minute "
            "(per replica); a person never needs more, a password-spraying script does."
        ),
    )

    @field_validator("oidc_allowed_algs")
    @classmethod
    def _asymmetric_algs_only(cls, value: list[str]) -> list[str]:
        for alg in value:
            if alg.lower() == "none" or alg.upper().startswith("HS"):
                raise ValueError(f"{alg!r} is not accepted: use RS256, ES256, PS256, EdDSA…")
        if not value:
            raise ValueError("name at least one algorithm, e.g. RS256")
        return value

    @field_validator("oidc_group_roles")
    @classmethod
    def _project_role_pairs(cls, value: dict[str, str]) -> dict[str, str]:
        for group, target in value.items():
            project, sep, role = target.partition(":")
            if not sep or not project or role not in ("admin", "member"):
                raise ValueError(
                    f"group {group!r} maps to {target!r}; expected 'project:admin' or "
                    "'project:member'"
                )
        return value

    @model_validator(mode="after")
    def _insecure_cookies_only_on_loopback(self) -> ServerSettings:
        if self.session_cookie_secure is False and not self._public_url_is_loopback_http():
            raise ValueError(
                "session_cookie_secure=false is only for http:// on loopback; "
                f"public URL is {self.resolved_public_url()}"
            )
        return self

    def _public_url_is_loopback_http(self) -> bool:
        url = urlsplit(self.resolved_public_url())
        return url.scheme == "http" and url.hostname in ("127.0.0.1", "localhost", "::1")

    def cookies_secure(self, *, scheme: str) -> bool:
        """Whether cookies set on a response to a request that came over ``scheme``
        (http or https) are marked Secure."""
        if self.session_cookie_secure is not None:
            return self.session_cookie_secure
        return scheme == "https" or not self._public_url_is_loopback_http()

    def resolved_public_url(self) -> str:
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if value.startswith("postgresql://") or value.startswith("postgres://"):
            return "postgresql+asyncpg://" + value.split("://", 1)[1]
        return value

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite+aiosqlite:///{self.data_dir / 'gpufleet.db'}"

    # -- slurmrestd, for the `slurm` driver's reads (docs/slurm.md) -----------------
    slurm_rest_url: str | None = Field(
        default=None,
        description=(
            "slurmrestd the `slurm` driver reads nodes and jobs from: http(s)://host:6820 "
            "(JWT auth) or unix:///path/slurmrestd.sock (local auth). Unset: reads use the "
            "Slurm commands. Writes (drain, resume) and accounting always use the commands."
        ),
    )
    slurm_rest_token_file: Path | None = Field(
        default=None,
        description=(
            "File holding the JWT for slurmrestd (what `scontrol token` prints), read again "
            "whenever it changes, so a cron job can renew it without a restart; a file, so "
            "the token never sits in the environment. Unset: no token (local auth needs none)."
        ),
    )
    slurm_rest_user: str = Field(
        default="root",
        description=(
            "X-SLURM-USER-NAME sent with the token: the user it was made for. root, as the "
            "Slurm commands run here: a user limited by PrivateData would see fewer jobs."
        ),
    )

    # -- bare-metal providers: ipmi, redfish, ssh (docs/providers.md) ---------------
    # Everything else of these drivers is their config's default (providers/*/config.py).
    ipmi_cipher_suite: int | None = Field(
        default=None,
        ge=0,
        le=17,
        description=(
            "RMCP+ cipher suite for every BMC the `ipmi` driver talks to (ipmitool -C): 17 "
            "(HMAC-SHA256, AES-128) on current BMCs, 3 on older ones. Unset: ipmitool asks "
            "each BMC, one more round trip per call (seconds on BMCs that lack the command), "
            "and a downgrade is not refused. Set it once the fleet's BMCs are known."
        ),
    )
    redfish_verify_tls: bool | str = Field(
        default=True,
        description=(
            "TLS certificate check of the `redfish` driver: true (the system CAs), a CA "
            "bundle path (BMCs with the site's own CA), or false (self-signed BMC "
            "certificates; only on a management network you trust)."
        ),
    )
