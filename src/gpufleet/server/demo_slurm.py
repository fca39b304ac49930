"""``gpufleet demo --slurm``: the demo fleet plus a cluster on a real Slurm lab.

The lab is ``deploy/slurm-lab/slurm-lab`` from a source checkout (real slurmctld,
slurmdbd and one slurmd per node, all on this machine). Its nodes become the cluster
``slurm`` of the demo project: machines from the sim provider named like the lab's
nodes, scheduled by the real Slurm. A repair drains the node in Slurm (``sinfo -R``
shows ``gpufleet: <repair id> <signature>``), waits for its jobs, reboots the simulated
machine and resumes the node; accounting copies the lab's finished jobs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpufleet.core.errors import InvalidInput

SCRIPT_ENV = "GPUFLEET_SLURM_LAB_SCRIPT"
DEMO_SLURM_CLUSTER = "slurm"
_NODE = re.compile(r"^(?P<prefix>.*?)(?P<index>\d{3,})$")
_GPUS = re.compile(r"\bgpu(?::[A-Za-z0-9_.-]+)?:(?P<count>\d+)")


@dataclass(frozen=True, slots=True)
class LabShape:
    node_prefix: str
    first_index: int
    size: int
    gpus_per_node: int


@dataclass(frozen=True, slots=True)
class SlurmDemo:
    """The lab's nodes as one cluster: ``<prefix><first_index + slot, 3 digits>``."""

    slurm_conf: Path
    node_prefix: str
    first_index: int
    size: int
    gpus_per_node: int
    startup_s: float


def find_script() -> Path:
    """The lab script: ``$GPUFLEET_SLURM_LAB_SCRIPT``, else the checkout's own."""
    configured = os.environ.get(SCRIPT_ENV)
    candidates = [Path(configured)] if configured else []
    candidates.append(Path(__file__).resolve().parents[3] / "deploy" / "slurm-lab" / "slurm-lab")
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise InvalidInput(
        "demo --slurm needs deploy/slurm-lab/slurm-lab from a gpufleet source checkout "
        f"(or {SCRIPT_ENV}=<path to it>)",
        field="slurm",
    )


def start_lab(lab_dir: Path, *, script: Path | None = None) -> SlurmDemo:
    """``slurm-lab up`` in ``lab_dir`` (idempotent) and the cluster shape it has.

    Raises ``InvalidInput`` when the lab cannot run here (not root, Slurm missing) with
    the script's own words.
    """
    script = script or find_script()
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    if shutil.which("slurmctld", path=search) is None:
        raise InvalidInput(
            f"Slurm is not installed: run `sudo {script} install` first", field="slurm"
        )
    env = {**os.environ, "SLURM_LAB_DIR": str(lab_dir)}
    started = time.monotonic()
    up = subprocess.run(  # noqa: S603 - our own script
        [str(script), "up"], env=env, capture_output=True, text=True, timeout=180, check=False
    )
    if up.returncode != 0:
        raise InvalidInput(
            f"`{script} up` failed ({up.returncode}): {(up.stderr or up.stdout).strip()[-2000:]}",
            field="slurm",
        )
    startup_s = time.monotonic() - started
    slurm_conf = lab_dir / "etc" / "slurm.conf"
    listing = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N|%G"],  # noqa: S607 - Slurm's client on PATH
        env={**os.environ, "SLURM_CONF": str(slurm_conf)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    shape = cluster_shape(listing)
    return SlurmDemo(
        slurm_conf=slurm_conf,
        node_prefix=shape.node_prefix,
        first_index=shape.first_index,
        size=shape.size,
        gpus_per_node=shape.gpus_per_node,
        startup_s=startup_s,
    )


def cluster_shape(listing: str) -> LabShape:
    """``sinfo -h -N -o '%N|%G'`` lines → prefix, first index, size, GPUs per node.

    The nodes must be one run ``<prefix>NNN`` with the same GPU count (what the lab
    makes); anything else is refused, not guessed.
    """
    nodes: dict[str, int] = {}
    for line in listing.splitlines():
        if not line.strip():
            continue
        name, _, gres = line.strip().partition("|")
        m = _GPUS.search(gres)
        nodes[name] = int(m["count"]) if m else 0
    if not nodes:
        raise InvalidInput("the Slurm lab has no nodes", field="slurm")
    parsed = [_NODE.match(name) for name in sorted(nodes)]
    if any(m is None for m in parsed):
        raise InvalidInput(f"lab node names are not <prefix>NNN: {sorted(nodes)}", field="slurm")
    prefixes = {m["prefix"] for m in parsed if m}
    indexes = sorted(int(m["index"]) for m in parsed if m)
    gpus = set(nodes.values())
    if len(prefixes) != 1 or indexes != list(range(indexes[0], indexes[0] + len(indexes))):
        raise InvalidInput(f"lab nodes are not one numbered run: {sorted(nodes)}", field="slurm")
    if len(gpus) != 1 or 0 in gpus:
        raise InvalidInput(f"lab nodes differ in GPUs or have none: {nodes}", field="slurm")
    return LabShape(prefixes.pop(), indexes[0], len(indexes), gpus.pop())


def stop_lab(lab_dir: Path, *, script: Path | None = None) -> None:
    """``slurm-lab down``: every daemon stops, the state stays for the next demo."""
    script = script or find_script()
    subprocess.run(  # noqa: S603
        [str(script), "down"],
        env={**os.environ, "SLURM_LAB_DIR": str(lab_dir)},
        capture_output=True,
        timeout=120,
        check=False,
    )
