"""Which job holds each GPU, as labels on the GPU series (off unless turned on).

Label names are dcgm-exporter's, so its dashboards and joins work:

* **Slurm** (``hpc_job``): dcgm-exporter's HPC job mapping directory. A Slurm prolog
  writes a file named after the GPU index holding the job id (one per line), the epilog
  removes it: the convention Slinky and the GPU Operator's prologs already follow, so
  one prolog serves both exporters. Several jobs on one GPU are joined with ``,``
  (dcgm-exporter repeats the series per job, which double-counts a ``sum`` over GPUs).
  MIG files (``<gpu>.<instance>``) are ignored: the agent exports whole GPUs.
* **Kubernetes** (``pod``, ``namespace``): from the agent's listing of its node's pods
  (``kube_pods.py``). The listing says how many GPUs a pod holds, not which: only when
  one pod holds every GPU of the node (a whole-node training pod, the common case) is
  the mapping certain, and then every GPU gets it. Per-GPU mapping would need the
  kubelet's pod-resources socket, which the agent does not read. A stale listing (the
  last ones failed) is not used.

Cardinality: at most ``max_values`` distinct label values per scrape; GPUs beyond that
get the value ``other``. Job ids still change from job to job, which is why this is off
by default: every job is a new set of series for as long as the retention keeps them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from gpufleet.agent.collectors.base import Sample
from gpufleet.agent.hostio.files import list_dir, read_text
from gpufleet.agent.kube_pods import PodListing

HPC_JOB = "hpc_job"
OTHER = "other"
JobLabelSet = tuple[tuple[str, str], ...]


class JobLabels:
    def __init__(
        self,
        *,
        mapping_dir: Path | None,
        pods: Callable[[], PodListing | None] | None = None,
        max_values: int = 8,
    ) -> None:
        self.mapping_dir = mapping_dir
        self.pods = pods
        self.max_values = max_values

    def for_gpus(self, gpus: Sequence[Sample]) -> dict[int, JobLabelSet]:
        """GPU index → its job labels, for the GPUs a job holds (others: absent)."""
        found: dict[int, JobLabelSet] = {}
        if self.mapping_dir is not None:
            for index, jobs in read_job_mapping(self.mapping_dir).items():
                found[index] = ((HPC_JOB, ",".join(jobs)),)
        indexes = sorted(s.gpu_index for s in gpus if s.gpu_index is not None)
        pod = self._whole_node_pod(len(indexes))
        if pod is not None:
            for index in indexes:
                found[index] = found.get(index, ()) + pod
        return cap_values(found, self.max_values)

    def _whole_node_pod(self, gpu_count: int) -> JobLabelSet | None:
        listing = self.pods() if self.pods is not None else None
        if listing is None or listing.stale or gpu_count == 0:
            return None
        holding = [p for p in listing.pods if p.gpus > 0 and not p.ended]
        if len(holding) != 1 or holding[0].gpus < gpu_count:
            return None
        return (("pod", holding[0].name), ("namespace", holding[0].namespace))


def read_job_mapping(directory: Path) -> dict[int, list[str]]:
    """``<dir>/<gpu index>`` files → the job ids in each (sorted, blank lines dropped)."""
    out: dict[int, list[str]] = {}
    for name in list_dir(directory):
        if not name.isdigit():
            continue  # MIG "<gpu>.<gi>" files, editor leftovers
        text = read_text(directory / name, limit=4096)
        if text is None:
            continue  # a directory, or removed by the epilog meanwhile
        jobs = sorted({line.strip() for line in text.splitlines() if line.strip()})
        if jobs:
            out[int(name)] = jobs
    return out


def cap_values(found: dict[int, JobLabelSet], max_values: int) -> dict[int, JobLabelSet]:
    """Keep the first ``max_values`` distinct label sets, by GPU index; the rest ``other``."""
    kept: list[JobLabelSet] = []
    out: dict[int, JobLabelSet] = {}
    for index in sorted(found):
        labels = found[index]
        if labels not in kept and len(kept) < max_values:
            kept.append(labels)
        out[index] = labels if labels in kept else tuple((k, OTHER) for k, _ in labels)
    return out
