from __future__ import annotations

import asyncio
from pathlib import Path

from gpufleet.agent.collectors.base import Event, Sample
from gpufleet.agent.exporter import last_xid_from, render, serve
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
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",pci_bus_id="0000:3b:00.0",'
        'modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-07"} 97'
    ) in text
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
