"""The agent's /metrics settings, inherited by ``AgentSettings`` (``GPUFLEET_AGENT_*``).

Apart only to keep ``settings.py`` short; nothing builds this class on its own.
"""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings

from gpufleet.agent.hostio.storage import DISK_EXCLUDE_DEFAULT


class MetricsSettings(BaseSettings):
    metrics_listen: str | None = Field(
        default="127.0.0.1:9404",
        description=(
            "host:port of the Prometheus /metrics endpoint, or unset for none. Loopback by "
            "default: expose it deliberately (0.0.0.0:9404) where Prometheus scrapes nodes."
        ),
    )
    sys_root: Path = Field(
        default=Path("/sys"),
        description=(
            "Where sysfs is (node_exporter's --path.sysfs): InfiniBand, NICs and Lustre's "
            "debugfs stats are read under it. A container that mounts the host's at "
            "/host/sys sets it there; tests point it at a recorded tree."
        ),
    )
    proc_root: Path = Field(
        default=Path("/proc"),
        description=(
            "Where procfs is (node_exporter's --path.procfs): diskstats, self/mountstats, "
            "self/mountinfo and Lustre's llite stats are read under it."
        ),
    )
    host_metrics: bool = Field(
        default=True,
        description=(
            "Export InfiniBand, NIC, block-device, NFS and Lustre counters on /metrics "
            "(node_exporter's names), read when scraped. Off where node_exporter already "
            "runs on the node, so the series are not there twice."
        ),
    )
    net_device_exclude: str = Field(
        default=r"^(lo|veth.+|cali.+|lxc.+|cilium_.+|flannel\..+|cni\d+|docker\d+)$",
        max_length=1000,
        description=(
            "Regex of network interfaces left out of /metrics. Loopback, and the per-pod "
            "virtual interfaces that come and go with every pod: each would be a new set "
            "of series. Empty: every interface."
        ),
    )
    disk_device_exclude: str = Field(
        default=DISK_EXCLUDE_DEFAULT,
        max_length=1000,
        description=(
            "Regex of block devices left out of /metrics: node_exporter's default, which "
            "drops partitions, loop and ram devices (whole disks, md and dm stay)."
        ),
    )
    metrics_job_labels: bool = Field(
        default=False,
        description=(
            "Label GPU series with the job holding the GPU, under dcgm-exporter's names: "
            "`hpc_job` from metrics_job_mapping_dir (Slurm), `pod` and `namespace` in "
            "Kubernetes mode when one pod holds every GPU of the node. Off by default: "
            "every job makes new series (Prometheus memory and disk); "
            "gpufleet_gpu_xid_errors_total never gets them, so alerts see one counter."
        ),
    )
    metrics_job_mapping_dir: Path | None = Field(
        default=None,
        description=(
            "dcgm-exporter's HPC job mapping directory (--hpc-job-mapping-dir): files "
            "named by GPU index, each holding the job id(s) on that GPU, written by the "
            "Slurm prolog and removed by the epilog. Unset: no hpc_job label."
        ),
    )
    metrics_job_label_max: int = Field(
        default=8,
        ge=1,
        le=64,
        description=(
            "At most this many distinct job label values per scrape; GPUs of further "
            "jobs get the value `other`. 8: one job per GPU on an 8-GPU node, yet a "
            "node sliced into many small jobs cannot multiply the series without bound."
        ),
    )

    @field_validator("net_device_exclude", "disk_device_exclude")
    @classmethod
    def _regex(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value
