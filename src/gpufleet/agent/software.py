"""What software this node runs, read once at agent start and sent with its identity
(``core.stacks.NodeSoftware``): the OS image, kernel, NVIDIA driver, Slurm and the agent.
Each reading that fails is left out (None), never guessed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpufleet.core.stacks import NodeSoftware, driver_from_proc, os_from_release, slurm_from_version

# An image built for gpufleet names itself here (one line: the stack's os_image); else
# the distribution's own PRETTY_NAME stands for it.
IMAGE_FILE = Path("/etc/gpufleet-image")
OS_RELEASE = Path("/etc/os-release")
NVIDIA_VERSION = Path("/proc/driver/nvidia/version")


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None


def read_software(
    *,
    agent: str,
    image_file: Path = IMAGE_FILE,
    os_release: Path = OS_RELEASE,
    nvidia_version: Path = NVIDIA_VERSION,
    slurmd: str | None = None,
) -> NodeSoftware:
    """This node's software now. ``slurmd``: the program to ask (default: on PATH)."""
    image = (_read(image_file) or "").strip().splitlines()
    release = _read(os_release)
    proc = _read(nvidia_version)
    return NodeSoftware(
        os_image=image[0][:120] if image and image[0] else (os_from_release(release or "")),
        kernel=os.uname().release[:120],
        driver=driver_from_proc(proc) if proc else None,
        slurm=_slurm_version(slurmd or shutil.which("slurmd")),
        agent=agent,
    )


def _slurm_version(program: str | None) -> str | None:
    if program is None:
        return None
    try:
        done = subprocess.run(  # noqa: S603 - a fixed program and flag
            [program, "-V"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return slurm_from_version(done.stdout) if done.returncode == 0 else None
