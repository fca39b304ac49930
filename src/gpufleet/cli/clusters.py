"""``gpufleet clusters``: list, create, show, status, delete; ``migrate`` to another
stack in a maintenance window (followed with ``gpufleet rollouts``); the repair breaker; the
provider configuration (``provider-config``, cli/provider_config.py). A kubernetes
cluster is created with its kubeconfig (``--kubeconfig FILE [--context NAME]``, read here
and sent once; the server keeps it sealed) or ``--in-cluster``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from gpufleet.cli import autoscale, config, provider_config, rollouts
from gpufleet.cli.errors import CliError
from gpufleet.cli.output import (
    HEALTH_STYLES,
    STATE_STYLES,
    OutputFormat,
    OutputOpt,
    counts,
    emit,
    fields,
    fmt_time,
    health_text,
    note,
    plain,
    print_table,
    state_text,
    table,
)
from gpufleet.cli.paging import collect
from gpufleet.core.enums import ClusterStatus, ProviderKind, SchedulerKind, WindowClose
from gpufleet.core.errors import InvalidInput
from gpufleet.core.gpu_models import DEFAULT_GPU_MODEL
from gpufleet.core.models import (
    Breaker,
    Cluster,
    ClusterStatusReport,
    NodeCounts,
    Page,
    SchedulerConfig,
)
from gpufleet.core.windows import parse_max_unavailable, parse_window

app = typer.Typer(help="GPU clusters.", no_args_is_help=True)
app.add_typer(provider_config.app, name="provider-config")
app.add_typer(autoscale.app, name="autoscale")

# Label keys as Kubernetes spells them (optional prefix/, then a name), values anything
# without a newline; checked here so a typo fails before anything is sent.
_LABEL_KEY = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$")

ProjectOpt = Annotated[
    str | None, typer.Option("--project", "-p", help="Project id or name to look in.")
]
ClusterRef = Annotated[str, typer.Argument(help="Cluster id, or its name.")]


def parse_labels(values: list[str]) -> dict[str, str]:
    """``["team=ml", "tier=prod"]`` → dict; a malformed one is a usage error (exit 2)."""
    labels: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not _LABEL_KEY.match(key) or "\n" in value:
            raise typer.BadParameter(
                f"{item!r} is not KEY=VALUE (KEY: letters, digits, '.', '_', '-', "
                "optionally prefix/)",
                param_hint="--label",
            )
        labels[key] = value
    return labels


def _render_list(page: Page[Cluster]) -> None:
    t = table(
        "NAME", "STATUS", "HEALTH", "SIZE", "GPUS/NODE", "GPU MODEL", "SCHED", "ID",
        right=("SIZE", "GPUS/NODE"),
    )  # fmt: skip
    for c in page.items:
        t.add_row(
            plain(c.name),
            state_text(c.status.value),
            health_text(c.health.value),
            str(c.size),
            str(c.gpus_per_node),
            plain(c.gpu_model),
            c.scheduler.value,
            plain(c.id),
        )
    print_table(t, empty="no clusters")


def _node_rows(nodes: NodeCounts | None) -> list[tuple[str, Text | str]]:
    if nodes is None:
        return []
    return [
        ("nodes", f"{nodes.total} ({nodes.gpus} GPUs)"),
        ("  by state", counts(nodes.by_state, STATE_STYLES)),
        ("  by health", counts(nodes.by_health, HEALTH_STYLES)),
    ]


def _scheduler_rows(config: SchedulerConfig | None) -> list[tuple[str, Text | str]]:
    if config is None:
        return []
    slurm = (
        [("  slurm", "on its nodes (Slinky): holds drain in Slurm first")] if config.slurm else []
    )
    if config.in_cluster:
        return [("  credentials", "in-cluster (the server's own service account)"), *slurm]
    return [
        ("  api server", config.server or "-"),
        ("  context", config.context or "-"),
        ("  kubeconfig", f"stored sealed (credential {config.credential_id})"),
        *slurm,
    ]


def _render_one(c: Cluster) -> None:
    autoscale = (
        "off"
        if c.autoscale_min is None and c.autoscale_max is None
        else f"{c.autoscale_min if c.autoscale_min is not None else '-'}"
        f"..{c.autoscale_max if c.autoscale_max is not None else '-'}"
    )
    rows: list[tuple[str, Text | str]] = [
        ("name", c.name),
        ("id", c.id),
        ("project", c.project_id),
        ("status", state_text(c.status.value)),
        ("detail", c.status_detail or "-"),
        ("health", health_text(c.health.value)),
        ("size", str(c.size)),
        ("gpus", f"{c.gpus_per_node} x {c.gpu_model} per node"),
        ("stack", c.stack or "-"),
        ("scheduler", c.scheduler.value),
        *_scheduler_rows(c.scheduler_config),
        ("provider", c.provider.value),
        (
            "acceptance tests",
            ", ".join(check.label for check in c.acceptance_suite.checks)
            if c.acceptance_tests
            else "off (opted out)",
        ),
        ("autoscale", autoscale),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(c.labels.items())) or "-"),
        ("startup scripts", str(len(c.startup_scripts))),
        ("created", fmt_time(c.created_at)),
        ("updated", fmt_time(c.updated_at)),
        *_node_rows(c.nodes),
    ]
    print_table(fields(rows))


def _render_status(s: ClusterStatusReport) -> None:
    rows: list[tuple[str, Text | str]] = [
        ("name", s.name),
        ("id", s.id),
        ("status", state_text(s.status.value)),
        ("detail", s.status_detail or "-"),
        ("health", health_text(s.health.value)),
        ("size", str(s.size)),
        *_node_rows(s.nodes),
    ]
    print_table(fields(rows))


@app.command("list")
def list_clusters(
    ctx: typer.Context,
    project: ProjectOpt = None,
    status: Annotated[
        ClusterStatus | None, typer.Option(case_sensitive=False, help="Only this status.")
    ] = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """List clusters in your projects."""
    with config.client_for(ctx) as client:
        page = collect(
            lambda cursor, limit: client.list_clusters(
                project=project, status=status, cursor=cursor, limit=limit
            )
        )
    emit(output, page, _render_list)


@app.command("create")
def create_cluster(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Cluster name, unique in the project.")],
    project: Annotated[str, typer.Option("--project", "-p", help="Project id or name.")],
    size: Annotated[int, typer.Option(min=0, help="Number of nodes.")] = 2,
    gpus_per_node: Annotated[int, typer.Option(min=1, help="GPUs in each node.")] = 8,
    gpu_model: Annotated[str, typer.Option(help="GPU model name, as NVML reports it.")] = (
        DEFAULT_GPU_MODEL
    ),
    scheduler: Annotated[SchedulerKind, typer.Option(case_sensitive=False)] = SchedulerKind.SIM,
    provider: Annotated[ProviderKind, typer.Option(case_sensitive=False)] = ProviderKind.SIM,
    acceptance_tests: Annotated[
        bool,
        typer.Option(
            "--acceptance-tests/--no-acceptance-tests",
            help="Run acceptance checks before the cluster (or a new node) takes work.",
        ),
    ] = True,
    label: Annotated[
        list[str] | None, typer.Option("--label", "-l", help="KEY=VALUE; repeat for more.")
    ] = None,
    startup_script: Annotated[
        list[str] | None,
        typer.Option("--startup-script", help="Shell script run on each new node; repeatable."),
    ] = None,
    autoscale_min: Annotated[int | None, typer.Option(min=0)] = None,
    autoscale_max: Annotated[int | None, typer.Option(min=0)] = None,
    node_prefix: Annotated[
        str | None,
        typer.Option(help="Node names start with this (default '<name>-'), e.g. 'gpu-'."),
    ] = None,
    first_node_index: Annotated[
        int, typer.Option(min=0, help="Number of the first node: 1 with gpu- gives gpu-001.")
    ] = 0,
    stack: Annotated[
        str | None,
        typer.Option(help="The software stack its nodes run (default: the latest)."),
    ] = None,
    provider_config_file: Annotated[
        Path | None,
        typer.Option(
            "--provider-config",
            help="YAML or JSON mapping: the provider's configuration (aws: region, "
            "credential, placement).",
            dir_okay=False,
        ),
    ] = None,
    kubeconfig_file: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            help="kubernetes: the cluster's kubeconfig file (sent once, stored sealed; the "
            "server checks that its API server answers).",
            dir_okay=False,
        ),
    ] = None,
    kube_context: Annotated[
        str | None,
        typer.Option(
            "--context",
            help="kubernetes: the kubeconfig's context to use (default: its current-context).",
        ),
    ] = None,
    in_cluster: Annotated[
        bool,
        typer.Option(
            "--in-cluster",
            help="kubernetes: use the server's own pod's service account (the server runs "
            "in that cluster) instead of a kubeconfig.",
        ),
    ] = False,
    slinky: Annotated[
        bool,
        typer.Option(
            "--slinky",
            help="kubernetes: Slurm runs on its nodes (Slinky slurmd pods); a repair drains "
            "the Slurm node first, through the server's Slurm driver.",
        ),
    ] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Create a cluster; it provisions, runs acceptance tests, then becomes ready."""
    labels = parse_labels(label or [])
    kubeconfig = _kube_options(
        scheduler, kubeconfig_file=kubeconfig_file, context=kube_context, in_cluster=in_cluster
    )
    if slinky and scheduler is not SchedulerKind.KUBERNETES:
        raise CliError("--slinky is for --scheduler kubernetes only")
    settings = (
        provider_config.read_config_file(provider_config_file)
        if provider_config_file is not None
        else None
    )
    with config.client_for(ctx) as client:
        cluster = client.create_cluster(
            project=project,
            name=name,
            size=size,
            scheduler=scheduler,
            provider=provider,
            gpu_model=gpu_model,
            gpus_per_node=gpus_per_node,
            acceptance_tests=acceptance_tests,
            startup_scripts=startup_script or [],
            autoscale_min=autoscale_min,
            autoscale_max=autoscale_max,
            labels=labels,
            node_prefix=node_prefix,
            first_node_index=first_node_index,
            provider_config=settings,
            kubeconfig=kubeconfig,
            kube_context=kube_context,
            kube_in_cluster=in_cluster,
            kube_slurm=slinky,
            stack=stack,
        )
    emit(output, cluster, _render_one)


def _kube_options(
    scheduler: SchedulerKind, *, kubeconfig_file: Path | None, context: str | None, in_cluster: bool
) -> str | None:
    """The kubeconfig's text, read here; a usage error (exit 2) for options that do not go
    together or a file that cannot be read, before anything is sent."""
    if scheduler is not SchedulerKind.KUBERNETES:
        given = {
            "--kubeconfig": kubeconfig_file is not None,
            "--context": context is not None,
            "--in-cluster": in_cluster,
        }
        wrong = next((option for option, is_given in given.items() if is_given), None)
        if wrong is not None:
            raise CliError(f"{wrong} is for --scheduler kubernetes only")
        return None
    if in_cluster and (kubeconfig_file is not None or context is not None):
        raise CliError("give --kubeconfig FILE [--context NAME] or --in-cluster, not both")
    if not in_cluster and kubeconfig_file is None:
        raise CliError(
            "a kubernetes cluster needs its API server's credentials: --kubeconfig FILE "
            "[--context NAME], or --in-cluster when the server runs in that cluster"
        )
    if kubeconfig_file is None:
        return None
    try:
        text = kubeconfig_file.read_text()
    except OSError as exc:
        raise CliError(
            f"{kubeconfig_file}: cannot read it ({exc.strerror}); nothing was sent"
        ) from None
    except UnicodeDecodeError:
        raise CliError(
            f"{kubeconfig_file}: not a text file, so not a kubeconfig; nothing was sent"
        ) from None
    if not text.strip():
        raise CliError(f"{kubeconfig_file}: empty; nothing was sent")
    return text


@app.command("show")
def show_cluster(
    ctx: typer.Context,
    ref: ClusterRef,
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Show a cluster's spec and its node counts."""
    with config.client_for(ctx) as client:
        cluster = client.find_cluster(ref, project=project)
        if cluster.nodes is None:  # listings may leave counts out; the detail has them
            cluster = client.get_cluster(cluster.id)
    emit(output, cluster, _render_one)


@app.command("status")
def cluster_status(
    ctx: typer.Context,
    ref: ClusterRef,
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Show a cluster's status, health and nodes by state and health."""
    with config.client_for(ctx) as client:
        report = client.get_cluster_status(client.find_cluster(ref, project=project).id)
    emit(output, report, _render_status)


@app.command("delete")
def delete_cluster(
    ctx: typer.Context,
    ref: ClusterRef,
    project: ProjectOpt = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Delete a cluster. The server does it in the background; status goes to deleting."""
    with config.client_for(ctx) as client:
        cluster = client.find_cluster(ref, project=project)
        if not yes:
            typer.confirm(
                f"Delete cluster {cluster.name} ({cluster.size} nodes, id {cluster.id})?",
                abort=True,
                err=True,
            )
        deleted = client.delete_cluster(cluster.id)
    if output is OutputFormat.JSON:
        emit(output, deleted, _render_one)
    else:
        note(f"cluster {deleted.name} is {deleted.status.value}")


@app.command("migrate")
def migrate(
    ctx: typer.Context,
    ref: ClusterRef,
    to_stack: Annotated[
        str, typer.Option("--to", help="The stack to move to (`gpufleet stacks list`).")
    ],
    window: Annotated[
        str,
        typer.Option(
            help="When nodes may go out of service: 'sat 02:00/4h', 'mon,wed 22:00/3h', "
            "'daily 01:00/90m' (every week or day), or once, '2026-12-06T02:00/2h'."
        ),
    ],
    tz: Annotated[
        str, typer.Option(help="IANA time zone the window is read in, e.g. Europe/Berlin.")
    ] = "UTC",
    max_unavailable: Annotated[
        str,
        typer.Option(help="Most nodes out at once: a count (1, 2) or a share (25%)."),
    ] = "1",
    failure_budget: Annotated[
        int, typer.Option(min=1, help="Pause after this many nodes fail their migration.")
    ] = 1,
    on_window_close: Annotated[
        WindowClose,
        typer.Option(
            help="A node not reinstalled when the window closes: wait (cordoned, for the "
            "next opening) or release (back in service, in line again)."
        ),
    ] = WindowClose.WAIT,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why; kept in the audit log.")] = "",
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Move a cluster to another stack inside a maintenance window (project admins).

    Node by node, at most --max-unavailable at once: cordoned, drained (jobs end, never
    killed), reinstalled, re-accepted. Follow it with `gpufleet rollouts show ID`."""
    # The server checks the same; here a typo fails before anything is sent.
    try:
        parse_window(window, tz=tz)
        max_unavailable = parse_max_unavailable(max_unavailable)
    except InvalidInput as exc:
        raise CliError(f"{exc.message}; nothing was sent") from None
    with config.client_for(ctx) as client:
        cluster = client.find_cluster(ref, project=project)
        made = client.create_rollout(
            cluster.id,
            to_stack=to_stack,
            window=window,
            tz=tz,
            max_unavailable=max_unavailable,
            failure_budget=failure_budget,
            on_window_close=on_window_close,
            reason=reason,
        )
    emit(output, made, rollouts.render_summary)
    if output is OutputFormat.TABLE:
        note(f"follow it with: gpufleet rollouts show {made.id}")


def _render_breaker(b: Breaker) -> None:
    share = f"{b.affected_nodes} of {b.total_nodes} nodes cordoned or under repair"
    if b.total_nodes:
        share += f" ({b.affected_nodes / b.total_nodes:.0%})"
    rows: list[tuple[str, Text | str]] = [
        ("cluster", b.cluster_id),
        (
            "breaker",
            Text("tripped: approvals refused", style="bold red")
            if b.tripped
            else Text("closed: approvals go through", style="green"),
        ),
        ("tripped at", fmt_time(b.tripped_at)),
        ("reason", b.reason or "-"),
        ("trips above", f"{b.max_share:.0%} of the nodes out at once"),
        ("now", share),
    ]
    print_table(fields(rows))


@app.command("breaker")
def show_breaker(
    ctx: typer.Context,
    ref: ClusterRef,
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Show a cluster's repair breaker: tripped or not, and how many nodes are out."""
    with config.client_for(ctx) as client:
        breaker = client.get_breaker(client.find_cluster(ref, project=project).id)
    emit(output, breaker, _render_breaker)


@app.command("breaker-reset")
def reset_breaker(
    ctx: typer.Context,
    ref: ClusterRef,
    reason: Annotated[str, typer.Option("--reason", "-r", help="Why it is safe again. Required.")],
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Close a tripped repair breaker (project admins), so approvals go through again."""
    if not reason.strip():
        raise typer.BadParameter("give the reason in words; it is kept in the audit log",
                                 param_hint="--reason")  # fmt: skip
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(ref, project=project).id
        breaker = client.reset_breaker(cluster_id, reason=reason.strip())
    emit(output, breaker, _render_breaker)


_TTL = re.compile(r"^\s*(\d+)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_ttl(value: str) -> int:
    """``90m``, ``24h``, ``7d`` or seconds, as seconds."""
    match = _TTL.match(value)
    if match is None:
        raise typer.BadParameter(f"{value!r}: give a number with s, m, h or d, e.g. 24h",
                                 param_hint="--ttl")  # fmt: skip
    return int(match.group(1)) * _UNIT_S[match.group(2)]


@app.command("enroll-token")
def enroll_token(
    ctx: typer.Context,
    ref: ClusterRef,
    ttl: Annotated[
        str, typer.Option("--ttl", help="How long it works: 90m, 24h (default), up to 30d.")
    ] = "24h",
    project: ProjectOpt = None,
    output: OutputOpt = OutputFormat.TABLE,
) -> None:
    """Make the cluster's enroll token and print it (shown this once; the previous one
    stops working).

    For bare-metal clusters (ipmi, redfish, ssh): the install puts it on each machine
    (GPUFLEET_AGENT_ENROLL_TOKEN_FILE), whose agent trades it and its hostname for its
    node's token. Needs the project's admin role and a credential that does not expire."""
    ttl_s = parse_ttl(ttl)
    with config.client_for(ctx) as client:
        cluster_id = client.find_cluster(ref, project=project).id
        issued = client.issue_enroll_token(cluster_id, ttl_s=ttl_s)
    emit(output, issued, lambda t: print(t.token))
