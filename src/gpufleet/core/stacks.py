"""Software stacks: a versioned set of what a GPU node runs (OS image, GPU driver, CUDA,
NCCL, DCGM, Slurm, gpufleet's agent), one of them marked latest. A cluster records the
stack it should run (new clusters take the latest unless an admin pins one); each node
reports what it actually runs. The difference is **skew**: shown on the node, and a
finding when it matters (a GPU driver other than the stack's: NCCL and the CUDA runtime
of the jobs are built against the driver, and a mixed-driver job is a debugging trap).

A stack's components are version strings compared as written: ``580.95.05`` is the
driver NVIDIA prints in ``/proc/driver/nvidia/version``, ``22.05.8`` what ``slurmd -V``
prints after ``slurm``. Nothing here knows the release orders of those projects.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

STACK_NAME = r"^[a-z0-9][a-z0-9._-]{0,62}$"
Version = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, max_length=64, pattern=r"^\S+$")
]
# The components a node reports that a stack pins, in the order they are shown.
COMPONENTS: tuple[str, ...] = ("os_image", "driver", "cuda", "nccl", "dcgm", "slurm", "agent")
# Skew in these makes a finding; in the others it is shown (the node page, the API).
FINDING_COMPONENTS = frozenset({"driver"})


class _Domain(BaseModel):
    model_config = ConfigDict(frozen=True, from_attributes=True, defer_build=True)


class StackSpec(_Domain):
    """What a stack pins. ``None``: not pinned (e.g. no Slurm on a Kubernetes stack)."""

    os_image: Version | None = None
    driver: Version | None = None
    cuda: Version | None = None
    nccl: Version | None = None
    dcgm: Version | None = None
    slurm: Version | None = None
    agent: Version | None = None


class Stack(StackSpec):
    name: str
    latest: bool
    notes: str
    created_by: str
    created_at: dt.datetime


class NodeSoftware(_Domain):
    """What a node's agent reads of its own software, sent with its identity. ``None``:
    not installed or not readable there (no NVIDIA driver loaded, no slurmd)."""

    os_image: Annotated[str, Field(max_length=120)] | None = None  # /etc/os-release
    kernel: Annotated[str, Field(max_length=120)] | None = None  # uname -r
    driver: Annotated[str, Field(max_length=64)] | None = None  # /proc/driver/nvidia/version
    cuda: Annotated[str, Field(max_length=64)] | None = None
    nccl: Annotated[str, Field(max_length=64)] | None = None
    dcgm: Annotated[str, Field(max_length=64)] | None = None
    slurm: Annotated[str, Field(max_length=64)] | None = None  # slurmd -V
    agent: Annotated[str, Field(max_length=64)] | None = None


class Skew(_Domain):
    """One component a node runs otherwise than its cluster's stack says."""

    component: str
    want: str
    have: str | None  # None: the node reports none


def skew(stack: StackSpec, software: NodeSoftware) -> list[Skew]:
    """Each pinned component the node runs otherwise (or does not report), in
    ``COMPONENTS`` order. A node that reported nothing yet has no skew: unknown is not
    different."""
    if software == NodeSoftware():
        return []
    out: list[Skew] = []
    for component in COMPONENTS:
        want = getattr(stack, component)
        have = getattr(software, component)
        if want is not None and have != want:
            out.append(Skew(component=component, want=want, have=have))
    return out


# /proc/driver/nvidia/version: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05
# Tue Sep 23 ..." (open modules: "NVIDIA UNIX Open Kernel Module for x86_64  580.95.05").
_DRIVER = re.compile(r"NVRM version:.*?\s(\d+\.\d+(?:\.\d+)?)\s")
_SLURM = re.compile(r"^slurm(?:-wlm)?\s+(\S+)", re.IGNORECASE)


def driver_from_proc(text: str) -> str | None:
    """The driver version from ``/proc/driver/nvidia/version``; None if it is not there."""
    match = _DRIVER.search(text)
    return match.group(1) if match else None


def slurm_from_version(text: str) -> str | None:
    """``slurmd -V``'s ``slurm 22.05.8`` → ``22.05.8``."""
    match = _SLURM.match(text.strip())
    return match.group(1) if match else None


def os_from_release(text: str) -> str | None:
    """``/etc/os-release``'s PRETTY_NAME (else NAME VERSION_ID)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"').strip("'")
    if values.get("PRETTY_NAME"):
        return values["PRETTY_NAME"][:120]
    named = " ".join(v for v in (values.get("NAME"), values.get("VERSION_ID")) if v)
    return named[:120] or None
