"""Settings of the AWS provider."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Tags gpufleet sets on every instance it launches or claims. Lookups go by these, never
# by names, so an operator's own tags are never read as ours. Keys are built from the
# namespace: a literal "gpufleet:..." string in src/ reads as a drain reason to the scan
# in tests/server/test_lifecycle_owners.py, and these are tag keys, not reasons.
TAG_NAMESPACE = "gpufleet"
TAG_CLUSTER = f"{TAG_NAMESPACE}:cluster"
TAG_NODE = f"{TAG_NAMESPACE}:node"
TAG_CLIENT_TOKEN = f"{TAG_NAMESPACE}:client-token"
RESERVED_TAG_PREFIXES = (f"{TAG_NAMESPACE}:", "aws:")


@dataclass(frozen=True, slots=True)
class AwsPlacement:
    """Where one cluster's machines come from.

    With ``auto_scaling_group`` the cluster's machines are members of that group: a
    provisioned machine is attached to it, ``terminate`` shrinks it, ``replace`` lets the
    group launch the replacement. The launch template is the group's unless one is named
    here; without a group a launch template is required.
    """

    auto_scaling_group: str | None = None
    launch_template_id: str | None = None
    launch_template_name: str | None = None
    # "$Default", "$Latest" or a number. $Default by default: the version an operator
    # promotes on purpose, where $Latest would launch an untested edit.
    launch_template_version: str = "$Default"
    instance_type: str | None = None  # overrides the template's, e.g. "p5.48xlarge"
    subnet_id: str | None = None  # overrides the template's network placement
    tags: Mapping[str, str] = field(default_factory=dict)  # extra tags on every instance

    def __post_init__(self) -> None:
        if self.launch_template_id is not None and self.launch_template_name is not None:
            raise ValueError("set launch_template_id or launch_template_name, not both")
        if self.auto_scaling_group is None and not self.has_template:
            raise ValueError(
                "a cluster needs an auto_scaling_group, a launch template, or both "
                "(launch_template_id or launch_template_name)"
            )
        for key in self.tags:
            if key.startswith(RESERVED_TAG_PREFIXES):
                raise ValueError(f"tag {key!r}: gpufleet: and aws: tags are set by gpufleet/AWS")

    @property
    def has_template(self) -> bool:
        return self.launch_template_id is not None or self.launch_template_name is not None


@dataclass(frozen=True, slots=True)
class AwsConfig:
    """How gpufleet reaches EC2 and Auto Scaling for one account and region.

    Credentials come with the provider (an access key id and secret access key); without
    them boto3's default chain is used (environment, instance profile, SSO...).

    Worst case for one API call: ``max_attempts`` × (``connect_timeout_s`` +
    ``read_timeout_s``) plus botocore's backoff, times ``throttle_retries`` + 1 when AWS
    keeps throttling, and never more than ``call_timeout_s``: the call then fails with a
    ``DriverError`` (the worker thread finishes its own attempt in the background).
    """

    region: str
    clusters: Mapping[str, AwsPlacement] = field(default_factory=dict)  # by cluster id
    # A VPC interface endpoint, or moto in tests; None: the public regional endpoint.
    endpoint_url: str | None = None
    # Seconds to open a TCP/TLS connection: AWS answers in well under a second; 5 s means
    # the network path is broken.
    connect_timeout_s: float = 5.0
    # Seconds to wait for an answer once connected. EC2 answers in about a second even for
    # large describes; 30 s means a hung endpoint.
    read_timeout_s: float = 30.0
    # botocore "standard" retry mode: total attempts per call (first one included). It
    # retries throttling, 5xx and connection errors with jittered backoff.
    max_attempts: int = 3
    # Our own backoff on top, for throttling only (RequestLimitExceeded...), which hits a
    # fleet-wide reconciler hardest: extra rounds of ``max_attempts``, waiting
    # base × 2^n seconds (capped, with full jitter) between rounds.
    throttle_retries: int = 3
    throttle_base_s: float = 1.0
    throttle_cap_s: float = 20.0
    # Hard deadline of one call, retries and throttling waits included.
    call_timeout_s: float = 120.0
    # Polling while power cycling (stop, then start) and while waiting for an Auto
    # Scaling replacement: every ``poll_interval_s``, for at most the bound. A GPU
    # instance stops in 1-3 min (it may flush instance-store NVMe) and starts in 1-2 min.
    poll_interval_s: float = 5.0
    power_timeout_s: float = 600.0
    replace_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.region:
            raise ValueError("region is required, e.g. us-east-1")
        for name in (
            "connect_timeout_s",
            "read_timeout_s",
            "call_timeout_s",
            "poll_interval_s",
            "power_timeout_s",
            "replace_timeout_s",
            "throttle_base_s",
            "throttle_cap_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.throttle_retries < 0:
            raise ValueError(f"throttle_retries must be >= 0, got {self.throttle_retries}")
