"""Scheduling, as the server sees each Slurm or Kubernetes cluster: nodes by state, the
GPUs pending jobs wait for, what is out of the scheduler's hands (cordoned, draining,
drained) and for how long repairs wait for jobs to leave."""

from __future__ import annotations

from gpufleet.dashboards.panels import CLUSTER, RATE, DashboardSpec, PanelSpec, Query

OUT = 'state=~"cordoned|draining|drained"'

BY_STATE = PanelSpec(
    "Nodes by state, per cluster",
    [
        Query(
            "sum by (cluster, state) "
            f"(max without (instance) (gpufleet_nodes_by_state{{{CLUSTER}}}))",
            "{{cluster}} {{state}}",
        )
    ],
    stacked=True,
    width=24,
)
SCHEDULABLE = PanelSpec(
    "Schedulable share",
    [
        Query(
            "sum by (cluster) "
            f'(max without (instance) (gpufleet_nodes_by_state{{{CLUSTER}, state="in_service"}})) '
            f"/ sum by (cluster) (max without (instance) (gpufleet_nodes_by_state{{{CLUSTER}}}))",
            "{{cluster}}",
        )
    ],
    unit="percentunit",
    minimum=0,
    description="Nodes in service (the scheduler may place jobs on them) over all nodes.",
)
DRAINS = PanelSpec(
    "Cordoned, draining, drained",
    [
        Query(
            "sum by (cluster, state) "
            f"(max without (instance) (gpufleet_nodes_by_state{{{CLUSTER}, {OUT}}}))",
            "{{cluster}} {{state}}",
        )
    ],
    stacked=True,
    description="Nodes taken from the scheduler: held for a repair, waiting for jobs to "
    "end, or empty and waiting for the repair to start.",
)
DRAIN_WAIT = PanelSpec(
    "Drain wait (p90)",
    [
        Query(
            "histogram_quantile(0.9, sum by (le, action) (rate("
            f'gpufleet_repair_step_duration_seconds_bucket{{step="draining"}}[{RATE}])))',
            "{{action}}",
        )
    ],
    unit="s",
    description="How long repairs waited for running jobs to finish (the drain step), as "
    "repairs leave it.",
)
REPAIRING = PanelSpec(
    "Nodes in repair or failed",
    [
        Query(
            "sum by (cluster, state) (max without (instance) "
            f'(gpufleet_nodes_by_state{{{CLUSTER}, state=~"repairing|failed"}}))',
            "{{cluster}} {{state}}",
        )
    ],
    stacked=True,
)

PENDING = PanelSpec(
    "Pending GPU demand",
    [
        Query(
            f"sum by (cluster) (max without (instance) (gpufleet_pending_gpu_demand{{{CLUSTER}}}))",
            "{{cluster}}",
        )
    ],
    minimum=0,
    description="GPUs the cluster's pending jobs wait for (jobs more nodes would start: "
    "Slurm's Resources/Priority/ReqNodeNotAvail, unschedulable pods), as the server last "
    "read it from the scheduler.",
)

# Store gauges (nodes, findings, repairs, demand) are exported alike by every server
# replica: ``max without (instance)`` keeps one copy of each series before a sum.
DASHBOARD = DashboardSpec(
    uid="gpufleet-scheduling",
    title="gpufleet / Scheduling",
    description="Per Slurm or Kubernetes cluster: nodes by state, the schedulable share, "
    "pending GPU demand, drains and their wait.",
    rows=[("Clusters", [BY_STATE, SCHEDULABLE, PENDING, DRAINS, DRAIN_WAIT, REPAIRING])],
    host_variables=False,
    tags=("scheduling", "slurm", "kubernetes"),
)
