"""Settings of the sim provider."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimProviderConfig:
    """How simulated machines behave. Delays are ``(low, high)`` seconds, drawn uniformly;
    rates are the share of attempts that fail, 0..1.

    ``seed`` is for the ``SimWorld`` the server builds next to this provider (the world
    owns the randomness, so the sim provider and scheduler draw from one stream that is
    saved with the world); None draws a fresh seed.
    """

    provision_delay_s: tuple[float, float] = (30.0, 90.0)  # GPU cloud VMs boot in ~0.5-1.5 min
    reboot_delay_s: tuple[float, float] = (10.0, 30.0)  # an OS reboot, no reinstall
    failure_rate: float = 0.0  # share of provisions/reinstalls that never boot
    seed: int | None = None
    max_instances: int | None = None  # capacity of the simulated cloud; None: unlimited
    # Share of reboots (and power cycles) after which the machine never comes back: it
    # goes FAILED once the boot delay has passed. 0 by default: a reboot reuses a working
    # OS install, so only broken hardware makes it fail, and tests opt into that.
    reboot_failure_rate: float = 0.0
    # ``nvidia-smi -r`` takes seconds: the GPU leaves the bus and re-initialises.
    reset_gpu_delay_s: tuple[float, float] = (5.0, 15.0)
    reset_gpu_failure_rate: float = 0.0  # share of GPU resets that fail (DriverError)

    def __post_init__(self) -> None:
        for name in ("provision_delay_s", "reboot_delay_s", "reset_gpu_delay_s"):
            low, high = getattr(self, name)
            if not 0 <= low <= high:
                raise ValueError(f"{name} must be 0 <= low <= high, got {(low, high)}")
        for name in ("failure_rate", "reboot_failure_rate", "reset_gpu_failure_rate"):
            rate = getattr(self, name)
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within 0..1, got {rate}")
