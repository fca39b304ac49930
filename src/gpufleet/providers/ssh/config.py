"""Settings of the ssh provider."""

from __future__ import annotations

from dataclasses import dataclass

# What the docs promise (docs/providers-ssh.md); tests check the defaults against these.
DEFAULT_REBOOT_COMMAND = "sudo -n systemctl reboot"
DEFAULT_POWEROFF_COMMAND = "sudo -n systemctl poweroff"


@dataclass(frozen=True, slots=True)
class SshConfig:
    """How gpufleet reaches static hosts over SSH.

    Each call opens one connection, runs one command and closes it: no connection is
    kept between calls, so a rebooted host or a rotated key is met fresh every time.
    """

    # Used when a host's ``HostAccess.port`` is None.
    port: int = 22
    # Seconds for TCP connect + SSH handshake + authentication. A healthy host on a LAN
    # answers in well under a second; 10 s rides out a loaded sshd (MaxStartups) without
    # holding a reconciler on a dead host for long.
    connect_timeout_s: float = 10.0
    # Seconds one remote command may take once connected. The probe reads two files; the
    # reboot wrapper returns within ``reboot_delay_s + reboot_wait_s``.
    command_timeout_s: float = 30.0
    # Tries per call for transient failures (refused, reset, lost, timed out), with
    # exponential backoff from ``retry_backoff_s``, capped at ``retry_backoff_max_s``.
    # Authentication and host key failures are never retried: the answer would not change.
    attempts: int = 3
    retry_backoff_s: float = 1.0
    retry_backoff_max_s: float = 8.0
    # Run on the host (by its login shell, inside ``sh -c``) to reboot it. ``sudo -n``
    # fails at once instead of prompting when sudoers does not allow it.
    # ``sudo -n reboot`` works on hosts without systemd.
    reboot_command: str = DEFAULT_REBOOT_COMMAND
    # The command starts this many seconds after the wrapper answers, so the answer gets
    # back before the host goes down (gpud waits 10 s for the same reason; 2 s is enough
    # for one SSH round trip). Fractions need GNU or busybox ``sleep``.
    reboot_delay_s: float = 2.0
    # After the delay, how long the wrapper waits for the command's exit status, so that
    # a command that fails at once (sudo refused) is reported with its stderr.
    # ``systemctl reboot`` returns in well under a second once it has queued the reboot.
    reboot_wait_s: float = 5.0
    # Run by ``terminate`` before the host is released; None: terminate only releases.
    poweroff_command: str | None = DEFAULT_POWEROFF_COMMAND
    # Log in as this user when the host's credential names none.
    username: str | None = None
    # A credential that is not a private key is refused unless this is set: a password
    # login can be phished by whoever holds a host's address, a key login cannot.
    allow_password: bool = False
    # A host with no pinned key is refused unless this is set. Then the first key a host
    # shows is kept in this process's memory (and logged with its fingerprint, so that an
    # operator can pin it); a different key later is refused. Lost at restart.
    trust_on_first_use: bool = False
    # Hosts checked at once by ``list_instances``.
    max_parallel: int = 16

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port must be within 1..65535, got {self.port}")
        for name in ("connect_timeout_s", "command_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {getattr(self, name)}")
        for name in ("retry_backoff_s", "retry_backoff_max_s", "reboot_delay_s", "reboot_wait_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0 seconds, got {getattr(self, name)}")
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if self.max_parallel < 1:
            raise ValueError(f"max_parallel must be >= 1, got {self.max_parallel}")
        if not self.reboot_command.strip():
            raise ValueError("reboot_command must not be empty")
        if self.poweroff_command is not None and not self.poweroff_command.strip():
            raise ValueError("poweroff_command must not be empty (None turns it off)")
        if self.reboot_delay_s + self.reboot_wait_s >= self.command_timeout_s:
            raise ValueError(
                "reboot_delay_s + reboot_wait_s must be under command_timeout_s, got "
                f"{self.reboot_delay_s:g} + {self.reboot_wait_s:g} >= {self.command_timeout_s:g}"
            )
