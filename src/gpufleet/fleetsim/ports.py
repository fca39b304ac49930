"""What the repair pipeline needs of the simulation, and the executor of the pipeline:
Protocols one layer below them all, so ``engine`` → ``repairs`` → ``executor`` is the
only direction modules import (STYLE §1: no cycle, not even one annotations close)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gpufleet.core.enums import RepairStatus
from gpufleet.core.repair.models import PolicyConfig, RepairFact
from gpufleet.core.signatures.models import Catalog
from gpufleet.fleetsim.model import FleetConfig, JobEffect, PolicySpec
from gpufleet.fleetsim.state import Counts, Fault, Holder, Node


class Engine(Protocol):
    """The simulation as the repair pipeline and its executor drive it."""

    config: FleetConfig
    policy: PolicySpec
    catalog: Catalog
    seed: int
    now: float
    nodes: list[Node]
    counts: Counts
    out: set[int]

    def at(self, when: float, fn: Callable[[], None]) -> None: ...
    def interrupt(self, cause: str, effect: JobEffect | None) -> None: ...
    def notice_drain(self) -> None: ...
    def exclude(self, node: Node, holder: Holder) -> None: ...
    def release(self, node: Node) -> None: ...
    def set_fault(self, node: Node, fault: Fault) -> None: ...
    def cure(self, node: Node) -> None: ...
    def strike(self, fault: Fault, nodes: list[Node]) -> None: ...
    def human_fix_soon(self, fault: Fault, delay: float) -> None: ...


class Pipeline(Protocol):
    """The repair pipeline as its executor reads and moves it."""

    sim: Engine
    config: PolicyConfig
    repairs: dict[str, RepairFact]
    by_id: dict[str, Node]

    def clear_findings(self, node: Node) -> None: ...
    def plan_soon(self) -> None: ...
    def seen(self, node: Node, signature_id: str, gpu: int | None) -> None: ...
    def set_status(self, rid: str, status: RepairStatus, *, ended: bool = False) -> RepairFact: ...
