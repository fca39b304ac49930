"""Acceptance on the sim (``gpufleet.testing.fleet``): machines that take 5 s of fake
time to boot, no repair cooldown, and a lighter suite for tests about something else.

Every loop runs for real (provisioning, acceptance, the check runner, repairs) and so do
the simulated agents, stepped through the real agent API: they run the startup scripts
with /bin/sh and the check tools as the sim's programs, whose figures follow injected
faults.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gpufleet.testing.fleet import SimFleet, sim_app

STEP_S = 15.0  # fake seconds a tick: DCGM level 3 takes 15 min as on real nodes
# The default suite, lighter: DCGM level 1 (its memory test still sees bad ECC memory),
# two HCAs. tests/server/test_acceptance.py runs the default suite itself.
QUICK_SUITE = {
    "checks": [
        {"kind": "dcgm-diag", "params": {"level": 1}},
        {"kind": "nccl"},
        {"kind": "ib-write-bw", "params": {"hcas": ["mlx5_0", "mlx5_1"]}},
        {"kind": "nccl", "scope": "cluster"},
    ]
}


@asynccontextmanager
async def bringup(
    database_url: str,
    tmp_path: Path,
    *,
    policy: dict[str, Any] | None = None,
    step_s: float = 1.0,
) -> AsyncIterator[SimFleet]:
    """An app on a fake clock with project ``ml``, sim agents and every loop; no cluster
    yet. Machines boot in 5 s of fake time, reboots take 20 s."""
    async with sim_app(
        database_url,
        tmp_path,
        policy={"cooldown_s": 0.0, **(policy or {})},
        step_s=step_s,
        sim_provision_delay_s=(5.0, 5.0),
    ) as fleet:
        yield fleet
