"""Settings of the IPMI provider."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Interface = Literal["lanplus", "lan"]
Privilege = Literal["OPERATOR", "ADMINISTRATOR"]


@dataclass(frozen=True, slots=True)
class IpmiConfig:
    """How gpufleet talks to its hosts' BMCs over IPMI-over-LAN (UDP 623).

    Every call runs ``ipmitool`` as a child process (never through a shell) with the
    BMC password in its environment (``-E``), never on its command line.
    """

    # ``lanplus`` is IPMI 2.0 / RMCP+ (encrypted, integrity-checked): use it. ``lan`` is
    # IPMI 1.5, whose session setup is MD5 at best and whose traffic is in the clear;
    # only for BMCs too old for RMCP+.
    interface: Interface = "lanplus"
    # RMCP+ cipher suite (``-C``). None lets ipmitool ask the BMC (Get Channel Cipher
    # Suites) and take the strongest one it offers, at the price of one more round trip;
    # BMCs without that command (ipmi_sim among them) cost ~3.5 s per call until it falls
    # back to 3. 17 (HMAC-SHA256, AES-128) is what current BMCs offer; 3 (HMAC-SHA1,
    # AES-128) is the older common ground. Set it to forbid a downgrade.
    cipher_suite: int | None = None
    # Session privilege (``-L``). Chassis control and boot options need OPERATOR, so the
    # BMC user needs no more than that.
    privilege: Privilege = "OPERATOR"
    # UDP port when the host's inventory entry gives none.
    default_port: int = 623
    # Seconds one ipmitool run may take before it is killed: its own retransmissions
    # (below) included. A healthy BMC answers a session setup plus one command in well
    # under 2 s; 20 s means it is down, hung or flooded.
    timeout_s: float = 20.0
    # Runs after the first for a transient failure (no answer, timeout, no free
    # session); bad credentials and refused commands are never retried.
    retries: int = 2
    # Seconds before the first retry, doubled for each next one (1 s, 2 s...): BMCs drop
    # packets while busy and hold few sessions, so hammering them makes it worse.
    retry_backoff_s: float = 1.0
    # ipmitool's own retransmission of an unanswered UDP packet: seconds to wait for an
    # answer (``-N``) and how many times to resend (``-R``). Its defaults (1 s x 4 for
    # lanplus) are kept close; ``timeout_s`` must leave room for them. At least 1:
    # ipmitool 1.8.19 reads ``-R 0`` as "its built-in default" and then spends ~20 s on
    # a BMC that does not answer.
    udp_timeout_s: int = 1
    udp_retries: int = 3
    # Reprovision asks for a one-time PXE boot; with this, in UEFI mode
    # (``options=efiboot``). Most GPU servers boot UEFI: a legacy PXE request on them
    # boots the wrong way or not at all.
    efi_boot: bool = True
    # The ipmitool binary: a name found on PATH, or a path.
    ipmitool: str = "ipmitool"

    def __post_init__(self) -> None:
        if self.interface not in ("lanplus", "lan"):
            raise ValueError(f"interface must be lanplus or lan, got {self.interface!r}")
        if self.privilege not in ("OPERATOR", "ADMINISTRATOR"):
            raise ValueError(f"privilege must be OPERATOR or ADMINISTRATOR, got {self.privilege!r}")
        if self.cipher_suite is not None and not 0 <= self.cipher_suite <= 17:
            raise ValueError(f"cipher_suite must be within 0..17, got {self.cipher_suite}")
        if not 0 < self.default_port < 65536:
            raise ValueError(f"default_port must be a UDP port, got {self.default_port}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if self.retry_backoff_s < 0:
            raise ValueError(f"retry_backoff_s must be >= 0 seconds, got {self.retry_backoff_s}")
        if self.udp_timeout_s < 1 or self.udp_retries < 1:
            raise ValueError(
                "udp_timeout_s must be >= 1 second and udp_retries >= 1, got "
                f"{self.udp_timeout_s} and {self.udp_retries}"
            )

    @property
    def call_bound_s(self) -> float:
        """The longest one driver call to one BMC command can take: every run killed at
        ``timeout_s``, plus the backoffs between them."""
        backoffs = sum(self.retry_backoff_s * 2.0**i for i in range(self.retries))
        return self.timeout_s * (self.retries + 1) + backoffs
