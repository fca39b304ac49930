"""The report ack tells the agent its node's state in gpufleet, and the agent keeps it in
``<state_dir>/node-state``: the file a cloud node's boot waits on before slurmd starts
(acceptance passed: ``in_service``; docs/slurm-power-saving.md)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from apihelpers import create_project, node_tokens, nodes_of, ready_cluster

from gpufleet.agent.sender import Sender, SendStatus
from gpufleet.agent.spool import Spool
from gpufleet.client.agent import AgentClient
from gpufleet.core.agent_protocol import GpuSample, NodeIdentity, NodeReport
from gpufleet.core.enums import NodeState
from gpufleet.server.db.tables import NodeRow
from gpufleet.testing.app import RunningApp


def _report(seq: int) -> NodeReport:
    gpu = GpuSample(
        index=0, uuid="GPU-00000000-0000-0000-0000-000000000001", utilization_pct=0.0,
        memory_used_mib=0.0, memory_total_mib=81_559.0, temperature_c=31.0, power_w=70.0,
        sm_clock_mhz=345.0,
    )  # fmt: skip
    return NodeReport(seq=seq, sampled_at=dt.datetime.now(dt.UTC), gpus=[gpu])


async def test_the_agent_keeps_its_node_state_from_each_ack(
    app: RunningApp, tmp_path: Path
) -> None:
    await create_project(app.client, "ml")
    cluster = await ready_cluster(app, size=1)
    node = (await nodes_of(app, cluster["id"]))[0]
    token = (await node_tokens(app, cluster["id"]))[node["name"]]
    state_file = tmp_path / "node-state"
    spool = Spool(tmp_path / "state", metrics_limit_bytes=2**20)
    async with app.anonymous() as http:
        sender = Sender(
            AgentClient(base_url="http://test", node_token=token, http=http),
            spool,
            identity=NodeIdentity(hostname=node["name"]),
            retry_initial_s=0.1,
            retry_max_s=0.2,
            status=SendStatus(),
            node_state_file=state_file,
        )
        seq = 10**9  # past whatever the sim agent of this node sent
        spool.metrics.add(_report(seq))
        assert await sender.send_metrics_once() is False
        assert state_file.read_text() == "in_service\n"
        async with app.ctx.db.transaction() as session:  # e.g. a repair took it out
            row = await session.get(NodeRow, node["id"])
            assert row is not None
            row.state = NodeState.CORDONED.value
        spool.metrics.add(_report(seq + 1))
        await sender.send_metrics_once()
        assert state_file.read_text() == "cordoned\n"
    assert not (tmp_path / "node-state.tmp").exists()  # written whole, then renamed
