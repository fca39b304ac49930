"""Prometheus ``/metrics`` for the agent, on asyncio (no extra dependency).

GPU metrics use dcgm-exporter's names, types and labels (``gpu``, ``UUID``,
``pci_bus_id``, ``device``, ``modelName``, ``hostname`` — ``Hostname`` before
dcgm-exporter d5e5f51) so existing Grafana dashboards work unchanged; units follow
dcgm-exporter too (power in W, framebuffer in MiB). A reading the GPU does not support is
left out rather than exported as 0. Every series carries ``hostname``.

Besides: ``gpufleet_gpu_xid_errors_total`` (Xids counted per GPU and code), the host's
InfiniBand, NIC, block-device, NFS and Lustre counters under node_exporter's names
(``hostio/``, read at scrape time in a thread), optional job labels (``job_labels.py``)
and ``gpufleet_agent_*`` for the agent itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
from collections.abc import Callable, Mapping, Sequence

from gpufleet.agent.collectors.base import Sample
from gpufleet.agent.detectors import count_open
from gpufleet.agent.exposition import Exposition, Kind
from gpufleet.agent.hostio.reader import HostIoReader, HostSnapshot
from gpufleet.agent.hostio.render import add_host_metrics
from gpufleet.agent.job_labels import JobLabels, JobLabelSet
from gpufleet.agent.runtime import Agent

log = logging.getLogger(__name__)

# (dcgm-exporter name, our field, type, help): help texts are dcgm-exporter's CSV ones
GPU_METRICS: tuple[tuple[str, str, Kind, str], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "utilization_pct", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_FB_USED", "memory_used_mib", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "_fb_free", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_XID_ERRORS", "_last_xid", "gauge", "Value of the last XID error encountered."),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "ecc_sbe_volatile",
        "counter",
        "Total number of single-bit volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "ecc_dbe_volatile",
        "counter",
        "Total number of double-bit volatile ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "ecc_sbe_aggregate",
        "counter",
        "Total number of single-bit persistent ECC errors.",
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "ecc_dbe_aggregate",
        "counter",
        "Total number of double-bit persistent ECC errors.",
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "pcie_replay_count",
        "counter",
        "Total number of PCIe retries.",
    ),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clocks_event_reasons", "gauge", "Clock event bits."),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_uncorrectable",
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_correctable",
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "remapped_rows_failure",
        "gauge",
        "Whether remapping of rows has failed",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "remapped_rows_pending", "gauge", "Row remap pending."),
    # A counter in dcgm-exporter's CSV although it is a 0/1 state: its type, kept.
    (
        "DCGM_FI_DEV_RETIRED_PENDING",
        "retired_pages_pending",
        "counter",
        "Total number of pages pending retirement.",
    ),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "pcie_link_gen", "gauge", "PCIe link generation."),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "pcie_link_width", "gauge", "PCIe link width."),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "nvlink_replay_errors",
        "counter",
        "Total number of NVLink retries.",
    ),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "nvlink_recovery_errors",
        "counter",
        "Total number of NVLink recovery errors.",
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "nvlink_crc_errors",
        "counter",
        # NVML's flit and data CRC counters, summed (dcgm-exporter: flit only).
        "Total number of NVLink CRC errors (flow-control flit + data).",
    ),
)
XID_COUNTER = "gpufleet_gpu_xid_errors_total"


def gpu_samples(agent: Agent) -> list[Sample]:
    return sorted(
        (s for s in agent.latest.values() if s.scope == "gpu"), key=lambda s: s.gpu_index or 0
    )


def gpu_labels(s: Sample) -> list[tuple[str, str | None]]:
    """dcgm-exporter's label set for one GPU (``hostname`` is added to every series)."""
    return [
        ("gpu", None if s.gpu_index is None else str(s.gpu_index)),
        ("UUID", s.gpu_uuid),
        ("pci_bus_id", s.pci_bus_id),
        ("device", None if s.minor_number is None else f"nvidia{s.minor_number}"),
        ("modelName", s.model),
    ]


def render(
    agent: Agent,
    *,
    hostname: str,
    last_xid: Callable[[Sample], int],
    host: HostSnapshot | None = None,
    job_labels: Mapping[int, JobLabelSet] | None = None,
) -> str:
    """The exposition text for the agent's current state (and the host's, if read)."""
    exp = Exposition(const_labels=(("hostname", hostname),))
    gpus = gpu_samples(agent)
    jobs = job_labels or {}
    for name, fld, kind, help_text in GPU_METRICS:
        for s in gpus:
            value = _gpu_value(s, fld, last_xid)
            if value is not None:
                job = jobs.get(s.gpu_index, ()) if s.gpu_index is not None else ()
                exp.add(name, kind, help_text, [*gpu_labels(s), *job], value)
    _xid_counts(exp, agent, gpus)
    if host is not None:
        add_host_metrics(exp, host)
    _agent_health(exp, agent)
    return exp.text()


def _xid_counts(exp: Exposition, agent: Agent, gpus: Sequence[Sample]) -> None:
    help_text = "Xid errors seen on this GPU since the agent started, by Xid code."
    exp.declare(XID_COUNTER, "counter", help_text)
    for c in agent.xids.counts():
        gpu = next(
            (
                s
                for s in gpus
                if (c.pci_bus_id and s.pci_bus_id == c.pci_bus_id)
                or (c.gpu_uuid and s.gpu_uuid == c.gpu_uuid)
            ),
            None,
        )
        labels = (
            gpu_labels(gpu)
            if gpu is not None
            else [
                ("gpu", None if c.gpu_index is None else str(c.gpu_index)),
                ("UUID", c.gpu_uuid),
                ("pci_bus_id", c.pci_bus_id),
            ]
        )
        exp.add(XID_COUNTER, "counter", help_text, [*labels, ("xid", str(c.xid))], c.count)


def _agent_health(exp: Exposition, agent: Agent) -> None:
    exp.declare("gpufleet_agent_open_findings", "gauge", "Open findings on this node.")
    for (sig, severity), n in sorted(count_open(agent.detector.open_findings()).items()):
        exp.add(
            "gpufleet_agent_open_findings",
            "gauge",
            "Open findings on this node.",
            (("signature", sig), ("severity", severity)),
            n,
        )
    status = agent.status
    health: tuple[tuple[str, Kind, str, int], ...] = (
        (
            "gpufleet_agent_spool_findings",
            "gauge",
            "Finding changes spooled, not yet acknowledged by the server.",
            agent.spool.findings.depth(),
        ),
        (
            "gpufleet_agent_spool_reports",
            "gauge",
            "Metrics reports spooled, not yet acknowledged by the server.",
            agent.spool.metrics.depth(),
        ),
        (
            "gpufleet_agent_spool_reports_dropped_total",
            "counter",
            "Metrics reports dropped because the spool was full.",
            agent.spool.metrics.dropped,
        ),
        (
            "gpufleet_agent_send_failures",
            "gauge",
            "Consecutive failed sends to the server.",
            status.consecutive_failures,
        ),
    )
    for name, kind, help_text, value in health:
        exp.add(name, kind, help_text, (), value)
    for what, at in (("findings", status.last_finding_send), ("reports", status.last_report_send)):
        if at is not None:
            exp.add(
                f"gpufleet_agent_last_{what}_send_timestamp_seconds",
                "gauge",
                f"When {what} last reached the server (Unix time).",
                (),
                round(at, 3),
            )
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of the process
    exp.add(
        "gpufleet_agent_cpu_seconds_total",
        "counter",
        "User and system CPU time the agent process has used.",
        (),
        round(usage.ru_utime + usage.ru_stime, 6),
    )
    rss = resident_memory_bytes()
    if rss is not None:
        exp.add(
            "gpufleet_agent_resident_memory_bytes",
            "gauge",
            "Resident memory of the agent process.",
            (),
            rss,
        )


def resident_memory_bytes() -> int | None:
    """The agent's own RSS now (``/proc/self/statm``: pages), None off Linux."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def _gpu_value(s: Sample, fld: str, last_xid: Callable[[Sample], int]) -> float | None:
    if fld == "_fb_free":
        used, total = s.values.get("memory_used_mib"), s.values.get("memory_total_mib")
        return None if used is None or total is None else max(0.0, total - used)
    if fld == "_last_xid":
        return float(last_xid(s))
    return s.values.get(fld)


def last_xid_from(agent: Agent) -> Callable[[Sample], int]:
    """The last Xid seen per GPU (0: none), from the open Xid findings."""

    def lookup(gpu: Sample) -> int:
        best: tuple[float, int] = (0.0, 0)
        for f in agent.detector.open_findings():
            same = (f.gpu_uuid is not None and f.gpu_uuid == gpu.gpu_uuid) or (
                f.pci_bus_id is not None and f.pci_bus_id == gpu.pci_bus_id
            )
            if same and f.signature_id.startswith("xid-"):
                code = f.signature_id.removeprefix("xid-")
                if code.isdigit():
                    best = max(best, (f.last_seen.timestamp(), int(code)))
        return best[1]

    return lookup


async def scrape(
    agent: Agent,
    *,
    hostname: str,
    host: HostIoReader | None = None,
    jobs: JobLabels | None = None,
) -> str:
    """One scrape: the host's files and the job mapping are read in a thread (a few
    hundred small reads), then the text is built on the loop, where the agent's state
    lives, so no other task changes it halfway."""
    gpus = gpu_samples(agent)

    def read_files() -> tuple[HostSnapshot | None, Mapping[int, JobLabelSet] | None]:
        return (
            host.read() if host is not None else None,
            jobs.for_gpus(gpus) if jobs is not None else None,
        )

    snapshot, job_labels = await asyncio.to_thread(read_files) if host or jobs else (None, None)
    return render(
        agent,
        hostname=hostname,
        last_xid=last_xid_from(agent),
        host=snapshot,
        job_labels=job_labels,
    )


async def serve(
    agent: Agent,
    *,
    listen: str,
    hostname: str,
    host: HostIoReader | None = None,
    jobs: JobLabels | None = None,
) -> asyncio.Server:
    """Start the /metrics server on ``host:port``; the caller closes it."""
    address, _, port = listen.rpartition(":")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5.0)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
            if path.split(b"?")[0] == b"/metrics":
                try:
                    body = (await scrape(agent, hostname=hostname, host=host, jobs=jobs)).encode()
                    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                except Exception:  # a bug here must not end the server: answer 500
                    log.exception("rendering /metrics failed")
                    body, head = b"scrape failed\n", b"HTTP/1.1 500 Internal Server Error\r\n"
            else:
                body, head = b"not found\n", b"HTTP/1.1 404 Not Found\r\n"
            writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
            writer.write(body)
            await writer.drain()
        except (
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
            ConnectionError,
        ):
            pass  # a scraper that hung up or sent garbage; nothing to do
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, address.strip("[]") or None, int(port))
    log.info("serving /metrics on %s", listen)
    return server
