from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.collectors.base import Event, Sample
from gpufleet.agent.exporter import GPU_METRICS, last_xid_from, render, serve
from gpufleet.agent.hostio.reader import HostIoReader
from gpufleet.agent.job_labels import JobLabels, JobLabelSet
from gpufleet.agent.main import build_agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import FindingSource


def agent(tmp_path: Path):  # type: ignore[no-untyped-def]
    settings = AgentSettings(state_dir=tmp_path, node_token="t", metrics_listen=None)  # type: ignore[arg-type]
    client = AgentClient(base_url="http://127.0.0.1:1", node_token="t")
    return build_agent(settings, client=client, collectors=[], sources=[], clock=FakeClock())


def test_dcgm_names_and_labels(tmp_path: Path) -> None:
    a = agent(tmp_path)
    a.latest["GPU-a"] = Sample(
        "gpu",
        {"utilization_pct": 97, "memory_used_mib": 100, "memory_total_mib": 1000},
        0,
        "GPU-a",
        "0000:3b:00.0",
        model="NVIDIA H100 80GB HBM3",
        minor_number=0,
    )
    a.detector.events(
        [
            Event(
                "xid-79",
                FakeClock().now(),
                FindingSource.KERNEL_LOG,
                "x",
                pci_bus_id="0000:3b:00.0",
            )
        ],
        FakeClock().now(),
    )
    text = render(a, hostname="gpu-node-07", last_xid=last_xid_from(a))
    assert (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pci_bus_id="0000:3b:00.0",device="nvidia0",'
        'modelName="NVIDIA H100 80GB HBM3",hostname="gpu-node-07"} 97'
    ) in text
    assert "Hostname" not in text
    assert "DCGM_FI_DEV_FB_FREE{" in text and "} 900\n" in text
    assert "DCGM_FI_DEV_POWER_USAGE" not in text  # unsupported: absent, not 0
    assert 'DCGM_FI_DEV_XID_ERRORS{gpu="0"' in text and text.count("} 79\n") == 1
    assert 'gpufleet_agent_open_findings{signature="xid-79",severity="fatal"' in text
    assert "gpufleet_agent_spool_findings" in text
    a.spool.close()


async def test_http_endpoint(tmp_path: Path) -> None:
    a = agent(tmp_path)
    server = await serve(a, listen="127.0.0.1:0", hostname="h")
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    data = await reader.read()
    writer.close()
    server.close()
    await server.wait_closed()
    assert data.startswith(b"HTTP/1.1 200 OK") and b"gpufleet_agent_spool_findings" in data
    a.spool.close()


# dcgm-exporter's own table for the fields the agent shares with it: etc/default-counters.csv
# at d5e5f51 (wave2-anchors §A.1, failure-signatures §3.4), the lines commented out there
# included (a custom CSV turns them on). name → (type, help); help None: ours differs on
# purpose (the agent sums NVML's flit and data CRC counters into the flit one).
DCGM_EXPORTER_FIELDS: dict[str, tuple[str, str | None]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz)."),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("counter", "Total number of PCIe retries."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": (
        "counter",
        "Total number of single-bit volatile ECC errors.",
    ),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": (
        "counter",
        "Total number of double-bit volatile ECC errors.",
    ),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": (
        "counter",
        "Total number of single-bit persistent ECC errors.",
    ),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": (
        "counter",
        "Total number of double-bit persistent ECC errors.",
    ),
    "DCGM_FI_DEV_RETIRED_PENDING": ("counter", "Total number of pages pending retirement."),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("counter", None),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("counter", "Total number of NVLink retries."),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (
        "counter",
        "Total number of NVLink recovery errors.",
    ),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for uncorrectable errors",
    ),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": (
        "counter",
        "Number of remapped rows for correctable errors",
    ),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed"),
}
# rendermetrics' labels on every GPU series (no MIG), `hostname` since d5e5f51
DCGM_EXPORTER_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname"}
EVERY_FIELD = {
    "utilization_pct": 97,
    "temperature_c": 61,
    "power_w": 512.25,
    "sm_clock_mhz": 1980,
    "memory_used_mib": 100,
    "memory_total_mib": 81559,
    "ecc_sbe_volatile": 1,
    "ecc_dbe_volatile": 0,
    "ecc_sbe_aggregate": 12345678901,
    "ecc_dbe_aggregate": 0,
    "pcie_replay_count": 3,
    "clocks_event_reasons": 4,
    "remapped_rows_uncorrectable": 0,
    "remapped_rows_correctable": 2,
    "remapped_rows_failure": 0,
    "remapped_rows_pending": 0,
    "retired_pages_pending": 0,
    "pcie_link_gen": 5,
    "pcie_link_width": 16,
    "nvlink_replay_errors": 0,
    "nvlink_recovery_errors": 0,
    "nvlink_crc_errors": 0,
}


def headers(text: str) -> dict[str, tuple[str, str]]:
    """name → (type, help) from the # HELP / # TYPE lines, names as written."""
    helps = dict(
        line.removeprefix("# HELP ").split(" ", 1)
        for line in text.splitlines()
        if line.startswith("# HELP ")
    )
    return {
        name: (kind, helps[name])
        for name, kind in (
            line.removeprefix("# TYPE ").split(" ", 1)
            for line in text.splitlines()
            if line.startswith("# TYPE ")
        )
    }


def test_gpu_series_hold_to_dcgm_exporters_names_types_and_labels(tmp_path: Path) -> None:
    a = agent(tmp_path)
    for i in range(2):
        a.latest[f"GPU-{i}"] = Sample(
            "gpu",
            EVERY_FIELD,
            i,
            f"GPU-{i}",
            f"0000:{0x18 + i:02x}:00.0",
            model="NVIDIA H100 80GB HBM3",
            minor_number=i,
        )
    text = render(a, hostname="gpu-node-07", last_xid=last_xid_from(a))
    a.spool.close()
    exported = headers(text)
    for name, (kind, help_text) in DCGM_EXPORTER_FIELDS.items():
        assert name in exported, f"{name} not exported"
        assert exported[name][0] == kind, f"{name}: {exported[name][0]}, dcgm-exporter {kind}"
        if help_text is not None:
            assert exported[name][1] == help_text, name
    dcgm_samples = [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("DCGM_FI_")
    ]
    assert len(dcgm_samples) == 2 * len(GPU_METRICS)
    for s in dcgm_samples:  # the agent's extra DCGM fields carry the same label set
        assert set(s.labels) == DCGM_EXPORTER_LABELS, s
    assert "Hostname" not in text
    ecc = (
        'DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{gpu="1",UUID="GPU-1",pci_bus_id="0000:19:00.0",'
        'device="nvidia1",modelName="NVIDIA H100 80GB HBM3",hostname="gpu-node-07"}'
    )
    assert f"{ecc} 12345678901\n" in text  # every digit of a 64-bit counter


async def test_xid_counter_per_gpu_and_code(tmp_path: Path) -> None:
    a = agent(tmp_path)
    gpu = Sample(
        "gpu", {"utilization_pct": 1}, 3, "GPU-d", "0000:3b:00.0", model="H100", minor_number=3
    )
    a.latest["GPU-d"] = gpu
    a.xids.learn([gpu])
    t0 = FakeClock().now()

    def event(xid: int, source: FindingSource, at_s: float, **where: object) -> Event:
        sig = f"xid-{xid}" if xid != 999 else "xid-unknown"
        return Event(sig, t0 + dt.timedelta(seconds=at_s), source, "x", xid=xid, **where)  # type: ignore[arg-type]

    await a.on_events(
        [
            event(79, FindingSource.KERNEL_LOG, 0, pci_bus_id="0000:3b:00.0"),
            event(79, FindingSource.NVML, 1, gpu_uuid="GPU-d", gpu_index=3),  # the same one
            event(13, FindingSource.KERNEL_LOG, 30, pci_bus_id="0000:3b:00.0"),
            event(13, FindingSource.KERNEL_LOG, 31, pci_bus_id="0000:3b:00.0"),
            event(999, FindingSource.NVML, 40, gpu_uuid="GPU-d", gpu_index=3),  # not in catalog
        ]
    )
    text = render(a, hostname="h", last_xid=last_xid_from(a), job_labels={3: (("hpc_job", "42"),)})
    a.spool.close()
    where = 'gpu="3",UUID="GPU-d",pci_bus_id="0000:3b:00.0",device="nvidia3",modelName="H100"'
    assert f'gpufleet_gpu_xid_errors_total{{{where},xid="79",hostname="h"}} 1\n' in text
    assert f'gpufleet_gpu_xid_errors_total{{{where},xid="13",hostname="h"}} 2\n' in text
    assert f'gpufleet_gpu_xid_errors_total{{{where},xid="999",hostname="h"}} 1\n' in text
    assert "# TYPE gpufleet_gpu_xid_errors_total counter" in text
    # job labels go on the DCGM series, never on the counter alerts rely on
    assert "DCGM_FI_DEV_GPU_UTIL{" + where + ',hpc_job="42",hostname="h"} 1' in text
    assert "hpc_job" not in "".join(x for x in text.splitlines() if "xid_errors_total" in x)


def test_agent_health_series(tmp_path: Path) -> None:
    a = agent(tmp_path)
    text = render(a, hostname="h", last_xid=last_xid_from(a))
    a.spool.close()
    samples = {
        s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
    }
    assert samples["gpufleet_agent_cpu_seconds_total"] > 0
    assert samples["gpufleet_agent_resident_memory_bytes"] > 10 * 2**20
    assert samples["gpufleet_agent_spool_findings"] == 0
    assert "# TYPE gpufleet_agent_open_findings gauge" in text  # declared with no finding


async def test_http_endpoint_with_host_io_and_a_failing_scrape(tmp_path: Path) -> None:
    fixtures = Path(__file__).parents[1] / "fixtures" / "hostio"
    a = agent(tmp_path)
    host = HostIoReader(sys_root=fixtures / "sys", proc_root=fixtures / "proc")

    class BrokenJobs(JobLabels):
        def for_gpus(self, gpus: Sequence[Sample]) -> dict[int, JobLabelSet]:
            raise RuntimeError("bug")

    async def get(server: asyncio.Server) -> bytes:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = await reader.read()
        writer.close()
        server.close()
        await server.wait_closed()
        return data

    ok = await get(await serve(a, listen="127.0.0.1:0", hostname="h", host=host))
    assert ok.startswith(b"HTTP/1.1 200 OK")
    assert b'node_infiniband_state_id{device="mlx5_0",port="1",hostname="h"} 4\n' in ok
    broken = BrokenJobs(mapping_dir=None)
    failed = await get(await serve(a, listen="127.0.0.1:0", hostname="h", jobs=broken))
    assert failed.startswith(b"HTTP/1.1 500")
    a.spool.close()
