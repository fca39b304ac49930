"""Prometheus ``/metrics`` for the agent, on asyncio (no extra dependency).

GPU metrics use dcgm-exporter's names and labels (``gpu``, ``UUID``, ``pci_bus_id``,
``modelName``, ``Hostname``) so existing Grafana dashboards work unchanged; units
follow dcgm-exporter too (power in W, framebuffer in MiB). A reading the GPU does not
support is left out rather than exported as 0. ``gpufleet_agent_*`` covers the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from gpufleet.agent.collectors.base import Sample
from gpufleet.agent.detectors import count_open
from gpufleet.agent.runtime import Agent

log = logging.getLogger(__name__)

# (dcgm-exporter name, our field, type, help)
GPU_METRICS: tuple[tuple[str, str, str, str], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "utilization_pct", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_FB_USED", "memory_used_mib", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "_fb_free", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_XID_ERRORS", "_last_xid", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe_volatile", "counter", "Total SBE (volatile)."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_volatile", "counter", "Total DBE (volatile)."),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_sbe_aggregate", "counter", "Total SBE (aggregate)."),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc_dbe_aggregate", "counter", "Total DBE (aggregate)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay_count", "counter", "PCIe replays."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "clocks_event_reasons", "gauge", "Clock event bits."),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_uncorrectable",
        "counter",
        "Rows remapped for uncorrectable errors.",
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "remapped_rows_correctable",
        "counter",
        "Rows remapped for correctable errors.",
    ),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "remapped_rows_failure", "gauge", "Row remap failed."),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "remapped_rows_pending", "gauge", "Row remap pending."),
    ("DCGM_FI_DEV_RETIRED_PENDING", "retired_pages_pending", "gauge", "Page retire pending."),
    ("DCGM_FI_DEV_PCIE_LINK_GEN", "pcie_link_gen", "gauge", "PCIe link generation."),
    ("DCGM_FI_DEV_PCIE_LINK_WIDTH", "pcie_link_width", "gauge", "PCIe link width."),
    (
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "nvlink_replay_errors",
        "counter",
        "NVLink replay errors.",
    ),
    (
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "nvlink_recovery_errors",
        "counter",
        "NVLink recovery errors.",
    ),
    (
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        "nvlink_crc_errors",
        "counter",
        "NVLink CRC errors (flit + data).",
    ),
)
PORT_METRICS: tuple[tuple[str, str, str], ...] = (
    ("gpufleet_ib_port_state", "ib_port_state", "gauge"),
    ("gpufleet_ib_phys_state", "ib_phys_state", "gauge"),
    ("gpufleet_ib_rate_gbps", "ib_rate_gbps", "gauge"),
    ("gpufleet_ib_link_downed_total", "ib_link_downed", "counter"),
    ("gpufleet_ib_symbol_error_total", "ib_symbol_error", "counter"),
    ("gpufleet_ib_port_rcv_errors_total", "ib_port_rcv_errors", "counter"),
)


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str | None]]) -> str:
    return ",".join(f'{k}="{_esc(v)}"' for k, v in pairs if v is not None)


def render(agent: Agent, *, hostname: str, last_xid: Callable[[Sample], int]) -> str:
    """The exposition text for the agent's current state."""
    lines: list[str] = []
    gpus = sorted(
        (s for s in agent.latest.values() if s.scope == "gpu"), key=lambda s: s.gpu_index or 0
    )
    for name, fld, kind, help_text in GPU_METRICS:
        rows = []
        for s in gpus:
            value = _gpu_value(s, fld, last_xid)
            if value is not None:
                labels = _labels(
                    (
                        ("gpu", str(s.gpu_index)),
                        ("UUID", s.gpu_uuid),
                        ("pci_bus_id", s.pci_bus_id),
                        ("modelName", s.model),
                        ("Hostname", hostname),
                    )
                )
                rows.append(f"{name}{{{labels}}} {value:g}")
        if rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows]
    ports = [s for s in agent.latest.values() if s.scope == "port"]
    for name, fld, kind in PORT_METRICS:
        rows = [
            f"{name}{{{_labels((('port', s.component), ('Hostname', hostname)))}}} "
            f"{s.values[fld]:g}"
            for s in ports
            if fld in s.values
        ]
        if rows:
            lines += [f"# TYPE {name} {kind}", *rows]
    lines += [
        "# HELP gpufleet_agent_open_findings Open findings on this node.",
        "# TYPE gpufleet_agent_open_findings gauge",
    ]
    for (sig, severity), n in sorted(count_open(agent.detector.open_findings()).items()):
        labels = _labels((("signature", sig), ("severity", severity), ("Hostname", hostname)))
        lines.append(f"gpufleet_agent_open_findings{{{labels}}} {n}")
    host = _labels((("Hostname", hostname),))
    status = agent.status
    lines += [
        "# TYPE gpufleet_agent_spool_findings gauge",
        f"gpufleet_agent_spool_findings{{{host}}} {agent.spool.findings.depth()}",
        "# TYPE gpufleet_agent_spool_reports gauge",
        f"gpufleet_agent_spool_reports{{{host}}} {agent.spool.metrics.depth()}",
        "# TYPE gpufleet_agent_spool_reports_dropped_total counter",
        f"gpufleet_agent_spool_reports_dropped_total{{{host}}} {agent.spool.metrics.dropped}",
        "# TYPE gpufleet_agent_send_failures gauge",
        f"gpufleet_agent_send_failures{{{host}}} {status.consecutive_failures}",
    ]
    for name, at in (("findings", status.last_finding_send), ("reports", status.last_report_send)):
        if at is not None:
            lines += [
                f"# TYPE gpufleet_agent_last_{name}_send_timestamp_seconds gauge",
                f"gpufleet_agent_last_{name}_send_timestamp_seconds{{{host}}} {at:.3f}",
            ]
    return "\n".join(lines) + "\n"


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


async def serve(agent: Agent, *, listen: str, hostname: str) -> asyncio.Server:
    """Start the /metrics server on ``host:port``; the caller closes it."""
    host, _, port = listen.rpartition(":")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5.0)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b"/"
            if path.split(b"?")[0] == b"/metrics":
                body = render(agent, hostname=hostname, last_xid=last_xid_from(agent)).encode()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
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

    server = await asyncio.start_server(handle, host.strip("[]") or None, int(port))
    log.info("serving /metrics on %s", listen)
    return server
