"""Fleet health and repairs: the server's view (nodes, findings, repairs, its own loops
and API) next to the agents' (report freshness, spool, send failures)."""

from __future__ import annotations

from gpufleet.dashboards.panels import CLUSTER, HOST, RATE, DashboardSpec, PanelSpec, Query

NODES = PanelSpec(
    "Nodes by state",
    [
        Query(
            f"sum by (state) (max without (instance) (gpufleet_nodes_by_state{{{CLUSTER}}}))",
            "{{state}}",
        )
    ],
    description="Lifecycle state of every node that is not removed.",
    stacked=True,
)
HEALTH = PanelSpec(
    "Nodes by health",
    [
        Query(
            f"sum by (health) (max without (instance) (gpufleet_nodes_by_health{{{CLUSTER}}}))",
            "{{health}}",
        )
    ],
    description="unknown: no agent report within the staleness window.",
    stacked=True,
)
FINDINGS = PanelSpec(
    "Open findings by signature",
    [
        Query(
            "sum by (signature, severity) "
            f"(max without (instance) (gpufleet_findings_open{{{CLUSTER}}}))",
            "{{signature}} ({{severity}})",
        )
    ],
    description="Findings not cleared, by failure-signature catalog id.",
    stacked=True,
)
REPORT_AGE = PanelSpec(
    "Oldest agent report",
    [
        Query(
            f"max by (cluster, state) (gpufleet_node_last_report_age_seconds{{{CLUSTER}}})",
            "{{cluster}} {{state}}",
        )
    ],
    unit="s",
    description="Seconds since the least recent agent report, per cluster and node state.",
)
REPAIRS = PanelSpec(
    "Repairs by status",
    [
        Query(
            "sum by (status, action) "
            f"(max without (instance) (gpufleet_repairs_by_status{{{CLUSTER}}}))",
            "{{action}} {{status}}",
        )
    ],
    description="Every repair ever made, by its status (ended ones stay in their end status).",
    stacked=True,
)
WAITING = PanelSpec(
    "Longest wait in a repair step",
    [
        Query(
            f"max by (status, action) (gpufleet_repair_oldest_step_age_seconds{{{CLUSTER}}})",
            "{{action}} {{status}}",
        )
    ],
    unit="s",
    description="For open repairs: how long the oldest has been in its step "
    "(proposed: waiting for an admin's approval).",
)
MTTR = PanelSpec(
    "Mean time to repair",
    [
        Query(
            f"sum by (action) (max without (instance) (gpufleet_repair_mttr_seconds{{{CLUSTER}}}) "
            f"* max without (instance) (gpufleet_repair_recoveries{{{CLUSTER}}})) "
            f"/ sum by (action) (max without (instance) (gpufleet_repair_recoveries{{{CLUSTER}}}))",
            "{{action}}",
        )
    ],
    unit="s",
    description="Proposal to node back in service, over repairs that succeeded in the "
    "metrics window (7 days by default), weighted by each cluster's recoveries.",
)
STEP_TIME = PanelSpec(
    "Time in repair steps (p90)",
    [
        Query(
            "histogram_quantile(0.9, sum by (le, step) "
            f"(rate(gpufleet_repair_step_duration_seconds_bucket[{RATE}])))",
            "{{step}}",
        )
    ],
    unit="s",
    description="Observed as a repair leaves a step: proposed is the approval wait, "
    "draining the wait for jobs to finish.",
)
BREAKER = PanelSpec(
    "Repair breaker tripped",
    [Query(f"max by (cluster) (gpufleet_repair_breaker_tripped{{{CLUSTER}}})", "{{cluster}}")],
    description="1 while a cluster's repair circuit breaker stops new repairs.",
    kind="stat",
)
INGEST = PanelSpec(
    "Agent reports stored",
    [Query(f"sum(rate(gpufleet_agent_reports_accepted_total[{RATE}]))", "reports/s")],
    unit="reqps",
    description="Agent reports the server stored, all replicas.",
)
LATENCY = PanelSpec(
    "API latency (p99)",
    [
        Query(
            "histogram_quantile(0.99, sum by (le, route) "
            f"(rate(gpufleet_http_request_duration_seconds_bucket[{RATE}])))",
            "{{route}}",
        )
    ],
    unit="s",
)
LOOPS = PanelSpec(
    "Background loop passes",
    [
        Query(
            f"sum by (loop, result) (rate(gpufleet_loop_passes_total[{RATE}]))",
            "{{loop}} {{result}}",
        )
    ],
    unit="ops",
    description="failed: a pass raised (logged); standby: another replica holds the lease.",
)
AGENT_SEND = PanelSpec(
    "Agent send failures and spool",
    [
        Query(f"gpufleet_agent_send_failures{{{HOST}}}", "{{hostname}} send failures"),
        Query(f"gpufleet_agent_spool_reports{{{HOST}}}", "{{hostname}} spooled reports"),
        Query(f"gpufleet_agent_spool_findings{{{HOST}}}", "{{hostname}} spooled findings"),
    ],
    description="Consecutive failed sends, and what waits on disk to be sent.",
)
AGENT_FINDINGS = PanelSpec(
    "Findings open on agents",
    [
        Query(
            f"sum by (hostname, signature) (gpufleet_agent_open_findings{{{HOST}}})",
            "{{hostname}} {{signature}}",
        )
    ],
    description="What each agent's detector holds open now, before the server hears of it.",
)

DASHBOARD = DashboardSpec(
    uid="gpufleet-fleet",
    title="gpufleet / Fleet health and repairs",
    description="Nodes, findings and repairs per cluster; the server's loops and API; "
    "the agents' reporting.",
    rows=[
        ("Fleet", [NODES, HEALTH, FINDINGS, REPORT_AGE]),
        ("Repairs", [REPAIRS, WAITING, MTTR, STEP_TIME, BREAKER]),
        ("Control plane", [INGEST, LATENCY, LOOPS]),
        ("Agents", [AGENT_SEND, AGENT_FINDINGS]),
    ],
    tags=("fleet", "repairs"),
)
