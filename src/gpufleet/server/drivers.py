"""Drivers by kind. The server builds one instance of each at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpufleet.core.errors import InvalidInput
from gpufleet.providers.base import Provider
from gpufleet.schedulers.base import Scheduler


@dataclass
class DriverRegistry:
    providers: dict[str, Provider] = field(default_factory=dict)
    schedulers: dict[str, Scheduler] = field(default_factory=dict)

    def provider(self, kind: str) -> Provider:
        try:
            return self.providers[kind]
        except KeyError:
            known = ", ".join(sorted(self.providers)) or "none"
            raise InvalidInput(
                f"provider {kind!r} is not configured on this server (configured: {known})",
                field="provider",
            ) from None

    def scheduler(self, kind: str) -> Scheduler:
        try:
            return self.schedulers[kind]
        except KeyError:
            known = ", ".join(sorted(self.schedulers)) or "none"
            raise InvalidInput(
                f"scheduler {kind!r} is not configured on this server (configured: {known})",
                field="scheduler",
            ) from None
