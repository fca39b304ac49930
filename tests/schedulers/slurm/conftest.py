"""The Slurm lab for the Slurm tests: a real cluster (slurmctld, 3 slurmd with 8 fake h100
each, slurmdbd on MariaDB, slurmrestd), started once per test session.

``slurm_lab`` yields a running ``gpufleet.testing.slurm_lab.SlurmLab`` (its API is written at
the top of that module). Each session gets its own lab: a fresh dir under /tmp, free ports
and its own job ids, so two sessions (or a developer's own lab) can run side by side.
Tests share it: leave every node as you found it (idle, resumed, slurmd running).

It never skips: without Slurm installed (``deploy/slurm-lab/slurm-lab install``) every test
that asks for it fails. When a test of the session failed, the lab's dir and logs are kept
(the summary says where); else it is purged. ``GPUFLEET_TEST_SLURM_LAB_DIR=<dir>`` reuses
(and leaves running) a lab in that dir instead, for quick reruns.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.testing.slurm_lab import (
    INSTALL_HINT,
    SlurmLab,
    SlurmLabError,
    free_port_base,
    missing_binaries,
)

_REPORT = pytest.StashKey[list[str]]()


def _report(config: pytest.Config, line: str) -> None:
    config.stash.setdefault(_REPORT, []).append(line)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = terminalreporter.config.stash.get(_REPORT, [])
    if lines:
        terminalreporter.section("slurm lab")
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def slurm_lab(request: pytest.FixtureRequest) -> Iterator[SlurmLab]:
    """A running Slurm lab, shared by the whole test session (see the module docstring)."""
    missing = missing_binaries()
    if missing:
        pytest.fail(
            f"the Slurm tests need a real Slurm; missing: {', '.join(missing)}. {INSTALL_HINT}",
            pytrace=False,
        )
    reuse = os.environ.get("GPUFLEET_TEST_SLURM_LAB_DIR")
    if reuse:
        lab = SlurmLab(dir=Path(reuse))
    else:
        # Parallel workers (pytest-xdist: gw0, gw1, ...) each start a lab of their own.
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        base = free_port_base(nodes=3, stripe=(int(worker.removeprefix("gw")), workers))
        lab = SlurmLab(
            dir=Path(tempfile.mkdtemp(prefix="gpufleet-slurm-lab-", dir="/tmp")),
            port_base=base,
            # job ids of side-by-side labs must not meet: they share the cgroup tree
            first_job_id=(base // 200) * 1000 + 1,
        )
    try:
        lab.up()
    except SlurmLabError as exc:
        with contextlib.suppress(SlurmLabError):
            lab.down()  # stop what did start; keep the dir and its logs
        _report(request.config, f"did not start; kept at {lab.dir}")
        pytest.fail(f"the Slurm lab did not start:\n{exc}", pytrace=False)
    assert lab.startup_s is not None
    _report(
        request.config,
        f"up in {lab.startup_s:.1f} s: Slurm {lab.version}, {lab.nodes} nodes × {lab.gpus} "
        f"fake h100, {lab.dir}",
    )
    yield lab
    if reuse:
        return
    if request.session.testsfailed:
        lab.down()
        _report(
            request.config,
            f"a test failed: lab kept at {lab.dir} (logs in {lab.log_dir}); "
            f"`SLURM_LAB_DIR={lab.dir} deploy/slurm-lab/slurm-lab up` restarts it, "
            "`... purge` deletes it and its database",
        )
    else:
        lab.purge()
