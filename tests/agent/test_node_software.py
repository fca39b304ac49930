"""What the agent reads of its node's software (``agent/software.py``), and the skew of a
node against its cluster's stack (``core.stacks``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from gpufleet.agent.software import read_software
from gpufleet.core.stacks import (
    NodeSoftware,
    StackSpec,
    driver_from_proc,
    os_from_release,
    skew,
    slurm_from_version,
)

# As the driver prints it (proprietary and open kernel modules), and as slurmd -V does.
PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  "
    "Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:57:25 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
OS_RELEASE = 'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'


@pytest.mark.parametrize(
    ("text", "want"),
    [(PROPRIETARY, "550.54.15"), (OPEN, "580.95.05"), ("", None), ("NVRM version: ?", None)],
)
def test_the_driver_version_is_read_from_proc(text: str, want: str | None) -> None:
    assert driver_from_proc(text) == want


def test_slurm_and_os_versions() -> None:
    assert slurm_from_version("slurm 22.05.8\n") == "22.05.8"
    assert slurm_from_version("slurm-wlm 24.11.1") == "24.11.1"
    assert slurm_from_version("bash: slurmd: command not found") is None
    assert os_from_release(OS_RELEASE) == "Ubuntu 24.04.1 LTS"
    assert os_from_release('NAME="Rocky Linux"\nVERSION_ID="9.4"\n') == "Rocky Linux 9.4"
    assert os_from_release("") is None


def _program(path: Path, script: str) -> str:
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_the_agent_reads_what_is_there_and_leaves_out_what_is_not(tmp_path: Path) -> None:
    (tmp_path / "version").write_text(OPEN)
    (tmp_path / "os-release").write_text(OS_RELEASE)
    (tmp_path / "image").write_text("ubuntu-24.04-gpu-2026.12\n")
    slurmd = _program(tmp_path / "slurmd", 'echo "slurm 25.05.3"')
    got = read_software(
        agent="0.1.0",
        image_file=tmp_path / "image",
        os_release=tmp_path / "os-release",
        nvidia_version=tmp_path / "version",
        slurmd=slurmd,
    )
    assert got == NodeSoftware(
        os_image="ubuntu-24.04-gpu-2026.12",
        kernel=os.uname().release,
        driver="580.95.05",
        slurm="25.05.3",
        agent="0.1.0",
    )
    # No image file (the distribution's name stands), no driver loaded, slurmd failing.
    broken = _program(tmp_path / "broken", "exit 1")
    bare = read_software(
        agent="0.1.0",
        image_file=tmp_path / "none",
        os_release=tmp_path / "os-release",
        nvidia_version=tmp_path / "none",
        slurmd=broken,
    )
    assert (bare.os_image, bare.driver, bare.slurm) == ("Ubuntu 24.04.1 LTS", None, None)


def test_skew_names_each_pinned_component_the_node_runs_otherwise() -> None:
    stack = StackSpec(os_image="img-1", driver="580.95.05", slurm="25.05.3", cuda="12.9")
    node = NodeSoftware(os_image="img-1", driver="570.172.08", slurm="25.05.3", agent="0.1.0")
    assert [(s.component, s.want, s.have) for s in skew(stack, node)] == [
        ("driver", "580.95.05", "570.172.08"),
        ("cuda", "12.9", None),  # pinned, not reported: not known to be right
    ]
    assert skew(stack, NodeSoftware()) == []  # nothing reported yet: unknown, not skew
    assert skew(StackSpec(), node) == []  # a stack that pins nothing
