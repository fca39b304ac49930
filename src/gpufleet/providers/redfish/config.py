"""Settings of the Redfish provider."""

from __future__ import annotations

from dataclasses import dataclass

# The reset types ``reboot`` may use, in the order it tries them. ``ForceOffOn`` is not a
# Redfish value: it is ForceOff, a wait for Off, then On (every BMC that can power a host
# off and on can do it). ``GracefulRestart`` first: the OS flushes its disks and stops its
# services; ``ForceRestart`` is the reset button; ``PowerCycle`` also resets the GPUs' and
# NICs' power rails, which some faults need.
DEFAULT_RESET_ORDER: tuple[str, ...] = (
    "GracefulRestart",
    "ForceRestart",
    "PowerCycle",
    "ForceOffOn",
)
RESET_STEPS = frozenset({"GracefulRestart", "ForceRestart", "PowerCycle", "ForceOffOn"})


@dataclass(frozen=True, slots=True)
class RedfishConfig:
    """How gpufleet talks to the BMCs of one host inventory.

    A host's ``HostAccess.address`` is its BMC: ``host``, ``host:port`` or a URL
    (``https://bmc1.example:8443``); without a scheme, ``scheme`` is used. The driver adds
    ``/redfish/v1`` unless the URL already ends with it. Authentication is HTTP Basic with
    the host's credential (no Redfish session: a BMC holds few session slots, and a session
    left behind by a crashed call would keep one).
    """

    scheme: str = "https"
    # TLS certificate check: True (the system CAs), False (BMCs ship self-signed
    # certificates; only on a management network you trust), or a CA bundle path.
    verify_tls: bool | str = True
    # Seconds one HTTP request may take, connecting and reading. A healthy BMC answers in
    # well under a second; a busy one (firmware update, sensor scan) takes a few seconds.
    request_timeout_s: float = 15.0
    # Tries of one request after a transient failure (refused or dropped connection,
    # timeout, HTTP 5xx other than 501), waiting ``backoff_s`` and then twice as long each
    # time, up to ``backoff_max_s``. Errors that will not change (401/403 bad credentials,
    # 404 no such system, 400, 501) fail at once. A reset or PATCH is sent again only when
    # the BMC cannot have acted on it (refused connection, 503): after a timeout it may
    # have, and a second reset would restart a host that is already booting.
    retries: int = 2
    backoff_s: float = 1.0
    backoff_max_s: float = 10.0
    # How ``reboot`` resets the machine: the steps it tries in order, skipping any the BMC
    # does not advertise, and moving on when the BMC answers 501 (or 400 "not supported").
    # Values: GracefulRestart, ForceRestart, PowerCycle, ForceOffOn.
    reset_order: tuple[str, ...] = DEFAULT_RESET_ORDER
    # Seconds to wait for a power change the driver must see before its next step
    # (ForceOff before On, and power_cycle), polling every ``power_poll_s``. Servers take
    # 5-60 s to power off when forced; their BMC reports it late.
    power_wait_s: float = 120.0
    power_poll_s: float = 2.0
    # Seconds to follow a BMC's task (HTTP 202 + Location) until it ends, polling every
    # ``task_poll_s``.
    task_wait_s: float = 120.0
    task_poll_s: float = 2.0
    # The one-time boot target of ``reprovision``: Pxe (the installer on the network
    # takes over and wipes the disks) or UefiHttp.
    reprovision_boot_target: str = "Pxe"

    def __post_init__(self) -> None:
        if self.scheme not in ("http", "https"):
            raise ValueError(f"scheme must be http or https, got {self.scheme!r}")
        for name in ("request_timeout_s", "power_wait_s", "power_poll_s", "task_wait_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        if self.task_poll_s <= 0:
            raise ValueError(f"task_poll_s must be > 0 seconds, got {self.task_poll_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if not 0 <= self.backoff_s <= self.backoff_max_s:
            raise ValueError("backoff_s must be within 0..backoff_max_s")
        if not self.reset_order:
            raise ValueError("reset_order needs at least one step")
        unknown = [step for step in self.reset_order if step not in RESET_STEPS]
        if unknown:
            raise ValueError(
                f"reset_order: unknown steps {unknown}; accepted: {sorted(RESET_STEPS)}"
            )
        if self.reprovision_boot_target not in ("Pxe", "UefiHttp"):
            raise ValueError(
                "reprovision_boot_target must be Pxe or UefiHttp, "
                f"got {self.reprovision_boot_target!r}"
            )
