"""`gpufleet demo --slurm`: the demo plus a cluster on a real Slurm lab it starts."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from gpufleet.core.errors import InvalidInput
from gpufleet.server.demo_slurm import LabShape, cluster_shape
from gpufleet.testing.processes import ServerProcess, free_port, printed_value
from gpufleet.testing.slurm_lab import SlurmLab, free_port_base


def test_cluster_shape_from_sinfo() -> None:
    listing = "lab-001|gpu:h100:8\nlab-002|gpu:h100:8(S:0-1)\nlab-003|gpu:h100:8\n"
    assert cluster_shape(listing) == LabShape("lab-", 1, 3, 8)
    assert cluster_shape("gpu-000|gpu:4\n") == LabShape("gpu-", 0, 1, 4)


@pytest.mark.parametrize(
    "listing",
    [
        "",
        "lab-001|gpu:h100:8\nlab-003|gpu:h100:8\n",  # a gap
        "lab-001|gpu:h100:8\nnode-002|gpu:h100:8\n",  # two prefixes
        "lab-001|gpu:h100:8\nlab-002|gpu:h100:4\n",  # different GPU counts
        "lab-001|(null)\n",  # no GPUs
        "head|gpu:8\n",  # not <prefix>NNN
    ],
)
def test_cluster_shape_refuses_what_it_would_have_to_guess(listing: str) -> None:
    with pytest.raises(InvalidInput):
        cluster_shape(listing)


@pytest.mark.slow
def test_demo_slurm_manages_the_lab_nodes(tmp_path: Path) -> None:
    port = free_port()
    # short: the munge socket path inside must fit a unix socket
    lab_dir = Path(tempfile.mkdtemp(prefix="gf-demo-lab-", dir="/tmp"))
    base = free_port_base(nodes=3)
    proc = ServerProcess(
        args=["demo", "--slurm", "--port", str(port), "--data-dir", str(tmp_path / "demo")],
        env={
            "GPUFLEET_DATABASE_URL": "",
            "GPUFLEET_SIM_FAULT_RATE_PER_GPU_DAY": "0",
            "SLURM_LAB_DIR": str(lab_dir),
            "SLURM_LAB_PORT_BASE": str(base),
            "SLURM_LAB_FIRST_JOB_ID": str((base // 200) * 1000 + 500_001),
        },
        log_path=tmp_path / "demo.log",
    )
    lab = SlurmLab(dir=lab_dir)
    proc.start()
    try:
        url = printed_value(proc, "GPUFLEET_URL", timeout_s=90)
        token = printed_value(proc, "GPUFLEET_TOKEN")
        proc.wait_ready(url)
        assert "Slurm lab up in" in proc.output()
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
        clusters = {c["name"]: c for c in api.get("/api/v1/clusters").json()["items"]}
        assert set(clusters) == {"demo", "inference", "slurm"}
        slurm = clusters["slurm"]
        assert (slurm["scheduler"], slurm["provider"], slurm["size"]) == ("slurm", "sim", 3)

        def in_service() -> list[str]:
            items = api.get("/api/v1/nodes", params={"cluster": slurm["id"]}).json()["items"]
            return sorted(n["name"] for n in items if n["state"] == "in_service")

        deadline = time.monotonic() + 60
        while in_service() != ["lab-001", "lab-002", "lab-003"]:
            assert time.monotonic() < deadline, (in_service(), proc.output()[-3000:])
            time.sleep(0.5)
        # The names are the lab's own: Slurm knows each of them.
        assert set(lab.node_states()) == {"lab-001", "lab-002", "lab-003"}
        proc.stop()  # SIGINT, as Ctrl-C: the demo stops the lab, keeping its state
        status = subprocess.run(
            [str(lab.script), "status"],
            env={**os.environ, "SLURM_LAB_DIR": str(lab_dir)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert status.returncode == 3, status.stdout  # 3: not up
        assert (lab_dir / "state" / "node_state").exists()
    finally:
        proc.stop()
        lab.purge()
