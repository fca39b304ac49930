"""Kubernetes mode's pod context: the agent lists the pods on its node from the API
server (the kmock emulator, over real HTTP) with its service-account token, and an open
finding's evidence ends with the GPU pods it knew of at that moment."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest
from recording_server import RecordingServer

from gpufleet.agent.collectors.base import Event
from gpufleet.agent.findings import EVIDENCE_LIMIT, FindingChange, with_context
from gpufleet.agent.kube_pods import NodePods, PodListing, in_cluster_api_url, pods_line
from gpufleet.agent.main import build_agent, build_node_pods
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.core.agent_protocol import FindingState
from gpufleet.core.clock import FakeClock
from gpufleet.core.enums import FindingSource, Severity
from gpufleet.schedulers.kubernetes.parsing import parse_pod
from gpufleet.testing.kube_api import NODES, PODS, RunningKubeApi, kube_api, pod_object
from gpufleet.testing.waits import eventually

NODE = "gpu-7"
TOKEN = "eyJhbGciOiJSUzI1NiJ9.first-token"  # a made-up service-account token
LOGGER = "gpufleet.agent.kube_pods"


def pod(
    name: str, on: str = NODE, *, ns: str = "ml", deleting: str | None = None, **kw: Any
) -> dict[str, Any]:
    obj = pod_object(name, on, namespace=ns, **kw)
    if deleting is not None:
        obj["metadata"]["deletionTimestamp"] = deleting
    return obj


def seed_node(api: RunningKubeApi) -> None:
    api.emulator.seed(NODES, {"metadata": {"name": NODE}})
    api.emulator.seed(PODS, pod("train-0", gpus=8))
    api.emulator.seed(
        PODS,
        pod(
            "infer-5d9f8-x2x",
            gpus=1,
            owner=("ReplicaSet", "infer-5d9f8"),
            labels={"pod-template-hash": "5d9f8"},
        ),
    )
    # Left out: no GPUs (a DaemonSet's, a CPU pod's), ended, or on another node.
    api.emulator.seed(PODS, pod("dcgm-exporter-abc", ns="gpu", owner=("DaemonSet", "dcgm")))
    api.emulator.seed(PODS, pod("etl", owner=("Job", "etl")))
    api.emulator.seed(PODS, pod("done", gpus=4, phase="Succeeded"))
    api.emulator.seed(PODS, pod("train-1", "gpu-8", gpus=8))


@pytest.fixture
async def api() -> AsyncIterator[RunningKubeApi]:
    async with kube_api() as running:
        yield running


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n", encoding="utf-8")
    return path


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def reader(
    api: RunningKubeApi, token_file: Path, tmp_path: Path, clock: FakeClock
) -> AsyncIterator[NodePods]:
    pods = NodePods(
        node=NODE,
        api_url=api.url,
        token_file=token_file,
        ca_file=tmp_path / "ca.crt",  # http: not read
        interval_s=30.0,
        clock=clock,
        timeout_s=5.0,
    )
    yield pods
    await pods.aclose()


def pod_lists(api: RunningKubeApi) -> list[kmock.Request]:
    return [r for r in api.emulator if r.method == kmock.method.GET and r.resource == PODS]


def write(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")


def remove(path: Path) -> None:
    path.unlink()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


# -- the reader ----------------------------------------------------------------------


async def test_lists_this_nodes_gpu_pods_with_the_rotated_token(
    api: RunningKubeApi, reader: NodePods, token_file: Path, clock: FakeClock
) -> None:
    seed_node(api)
    listing = await reader.refresh()
    assert listing is not None and not listing.stale and listing.read_at == clock.now()
    assert [p.key for p in listing.pods] == ["ml/train-0", "ml/infer-5d9f8-x2x"]
    (request,) = pod_lists(api)
    assert request.params["fieldSelector"] == f"spec.nodeName={NODE}"  # reached the server
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert reader.context() == (
        f"pods on {NODE}: ml/train-0 (Job train, 8 GPUs), "
        "ml/infer-5d9f8-x2x (Deployment infer, 1 GPU)"
    )

    write(token_file, "eyJhbGciOiJSUzI1NiJ9.second-token")  # the kubelet rotated it
    api.emulator.change(PODS, "train-0", {"status": {"phase": "Succeeded"}}, "ml")
    listing = await reader.refresh()
    assert listing is not None and [p.key for p in listing.pods] == ["ml/infer-5d9f8-x2x"]
    assert pod_lists(api)[-1].headers["Authorization"] == "Bearer eyJhbGciOiJSUzI1NiJ9.second-token"


async def test_a_node_without_gpu_pods(api: RunningKubeApi, reader: NodePods) -> None:
    assert reader.context() is None  # nothing known yet: no line at all
    api.emulator.seed(PODS, pod("dcgm-exporter-abc", ns="gpu", owner=("DaemonSet", "dcgm")))
    await reader.refresh()
    assert reader.context() == f"pods on {NODE}: none with GPUs"


async def test_forbidden_keeps_the_last_listing_and_logs_once_without_the_token(
    api: RunningKubeApi, reader: NodePods, caplog: pytest.LogCaptureFixture, clock: FakeClock
) -> None:
    seed_node(api)
    good = await reader.refresh()
    assert good is not None
    deny = True

    def forbidden(request: kmock.Request) -> Any:
        if not deny:
            return None  # served as usual
        # An API server would not echo the token; if anything ever did, it stays out.
        said = request.headers["Authorization"]
        return kmock.KubernetesError(status=403, reason="Forbidden", message=f"no: {said}")

    api.emulator[kmock.action.LIST, PODS] << forbidden
    caplog.set_level(logging.INFO, logger=LOGGER)
    for _ in range(3):
        clock.advance(30)
        kept = await reader.refresh()
        assert kept is not None and kept.stale and kept.pods == good.pods
        assert kept.read_at == good.read_at
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text  # once, not every interval
    assert "403" in warnings[0].getMessage() and "keeping the listing" in caplog.text
    assert TOKEN not in caplog.text and "<token>" in caplog.text

    clock.advance(1)  # 91 s old: over two intervals, the line says when it was read
    assert reader.context() == (
        f"pods on {NODE} (as of 00:00:00Z): ml/train-0 (Job train, 8 GPUs), "
        "ml/infer-5d9f8-x2x (Deployment infer, 1 GPU)"
    )
    deny = False
    fresh = await reader.refresh()
    assert fresh is not None and not fresh.stale and fresh.read_at == clock.now()
    assert "listed again after http 403" in caplog.text
    assert "(as of" not in (reader.context() or "")


async def test_unreachable_or_no_token_is_logged_once_and_never_raises(
    token_file: Path, tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with kube_api() as api:
        seed_node(api)
        pods = NodePods(
            node=NODE,
            api_url=api.url,
            token_file=token_file,
            ca_file=tmp_path / "ca.crt",
            interval_s=30.0,
            clock=clock,
            timeout_s=5.0,
        )
        await pods.refresh()
    # The API server is gone now.
    for _ in range(2):
        kept = await pods.refresh()
        assert kept is not None and kept.stale and len(kept.pods) == 2
    remove(token_file)
    for _ in range(2):
        await pods.refresh()
    await pods.aclose()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "cannot reach" in messages[0] and "service-account token" in messages[1]
    assert TOKEN not in caplog.text

    nowhere = NodePods(
        node=NODE,
        api_url=f"https://127.0.0.1:{closed_port()}",
        token_file=tmp_path / "a-token",
        ca_file=tmp_path / "missing-ca.crt",
        interval_s=30.0,
        clock=clock,
    )
    write(tmp_path / "a-token", TOKEN)
    assert await nowhere.refresh() is None
    assert nowhere.context() is None
    assert "cannot use the cluster CA" in caplog.text


async def test_the_loop_lists_at_once_and_stops_on_the_signal(
    api: RunningKubeApi, reader: NodePods
) -> None:
    seed_node(api)
    stop = asyncio.Event()
    task = asyncio.create_task(reader.run(stop))
    await eventually(lambda: reader.listing is not None, timeout_s=5.0)
    stop.set()
    await asyncio.wait_for(task, timeout=2.0)  # does not sit out the 30 s interval


# -- the evidence line ---------------------------------------------------------------


def listing_of(*objects: dict[str, Any], at: dt.datetime) -> PodListing:
    pods = [parse_pod(o) for o in objects]
    ordered = sorted((p for p in pods if p.gpus and not p.ended), key=lambda p: (-p.gpus, p.key))
    return PodListing(pods=tuple(ordered), read_at=at)


def test_five_pods_named_and_the_rest_counted(clock: FakeClock) -> None:
    objects = [pod(f"w-{i}", gpus=1, owner=("PyTorchJob", "llm")) for i in range(7)]
    objects.append(pod("big", gpus=4, owner=None, deleting="2026-01-01T00:00:00Z"))
    line = pods_line(NODE, listing_of(*objects, at=clock.now()), now=clock.now(), stale_after_s=60)
    assert line == (
        f"pods on {NODE}: ml/big (4 GPUs, terminating), ml/w-0 (PyTorchJob llm, 1 GPU), "
        "ml/w-1 (PyTorchJob llm, 1 GPU), ml/w-2 (PyTorchJob llm, 1 GPU), "
        "ml/w-3 (PyTorchJob llm, 1 GPU), and 3 more"
    )


def test_an_old_listing_says_when_it_was_read(clock: FakeClock) -> None:
    listing = listing_of(pod("train-0", gpus=8), at=clock.now())
    assert "(as of" not in pods_line(NODE, listing, now=clock.now(), stale_after_s=60)
    later = clock.now() + dt.timedelta(seconds=61)
    assert pods_line(NODE, listing, now=later, stale_after_s=60).startswith(
        f"pods on {NODE} (as of 00:00:00Z): ml/train-0"
    )
    next_day = clock.now() + dt.timedelta(days=1)
    assert "(as of 2026-01-01T00:00:00Z)" in pods_line(
        NODE, listing, now=next_day, stale_after_s=60
    )


def change(evidence: str, state: FindingState = FindingState.OPEN) -> FindingChange:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return FindingChange(
        key="xid-48@0000:3b:00.0",
        signature_id="xid-48",
        state=state,
        severity=Severity.CRITICAL,
        source=FindingSource.KERNEL_LOG,
        evidence=evidence,
        first_seen=at,
        last_seen=at,
    )


def test_the_pod_line_is_cut_never_the_evidence() -> None:
    line = f"pods on {NODE}: " + ", ".join(f"ml/w-{i} (Job w, 8 GPUs)" for i in range(5))
    assert with_context(change("NVRM: Xid 48"), line).evidence == f"NVRM: Xid 48\n{line}"
    assert with_context(change(""), line).evidence == line

    original = "x" * (EVIDENCE_LIMIT - 40)
    cut = with_context(change(original), line)
    assert len(cut.evidence) == EVIDENCE_LIMIT
    assert cut.evidence.startswith(original + "\npods on gpu-7: ml/w-0")
    assert cut.evidence.endswith("…")
    cut.to_report(1)  # the wire model takes it

    for full in ("x" * (EVIDENCE_LIMIT - 10), "x" * EVIDENCE_LIMIT):
        assert with_context(change(full), line).evidence == full  # no room: no line


# -- through the agent's runtime -----------------------------------------------------


@pytest.fixture
def server() -> Iterator[RecordingServer]:
    s = RecordingServer()
    yield s
    with contextlib.suppress(AssertionError):
        s.down()


async def test_an_open_finding_carries_the_pods_a_clear_does_not(
    api: RunningKubeApi,
    server: RecordingServer,
    token_file: Path,
    tmp_path: Path,
    clock: FakeClock,
) -> None:
    settings = AgentSettings(
        server_url=server.url,
        node_token="node-token",
        state_dir=tmp_path / "state",
        kubernetes_node=NODE,
        kubernetes_api_url=api.url + "/",
        kubernetes_token_file=token_file,
        retry_initial_s=0.02,
        retry_max_s=0.1,
        sample_interval_s=0.05,
        metrics_listen=None,
    )
    pods = build_node_pods(settings, environ={}, clock=clock)
    assert pods is not None and pods.api_url == api.url
    http = httpx.AsyncClient(timeout=15.0)
    client = AgentClient(base_url=server.url, node_token="node-token", http=http)
    agent = build_agent(
        settings, client=client, collectors=[], sources=[], clock=clock, context=pods.context
    )
    stop = asyncio.Event()
    running = asyncio.create_task(agent.run(stop))
    try:
        xid = Event("xid-48", clock.now(), FindingSource.KERNEL_LOG, "NVRM: Xid (PCI:0000:3b:00)")
        await agent.on_events([xid])  # before any listing: nothing known, no line
        seed_node(api)
        await pods.refresh()
        clock.advance(60)
        await agent.on_events([Event("xid-48", clock.now(), FindingSource.KERNEL_LOG, "again")])
        cleared = agent.submit([change("cleared: quiet", FindingState.CLEARED)])
        assert cleared[0].evidence == "cleared: quiet"
        await eventually(lambda: len(server.stored) == 3, timeout_s=5.0)
    finally:
        stop.set()
        await running
        agent.spool.close()
        await http.aclose()
        await pods.aclose()
    evidence = [f["evidence"] for f in server.stored]
    assert evidence == [
        "NVRM: Xid (PCI:0000:3b:00)",
        "again\npods on gpu-7: ml/train-0 (Job train, 8 GPUs), "
        "ml/infer-5d9f8-x2x (Deployment infer, 1 GPU)",
        "cleared: quiet",
    ]
    # The detector keeps the bare evidence: the next repeat gets one line, not two.
    assert [f.evidence for f in agent.detector.open_findings()] == ["again"]


def test_wiring_needs_kubernetes_mode_and_an_api(tmp_path: Path, clock: FakeClock) -> None:
    plain = AgentSettings(hostname="gpu-a", state_dir=tmp_path)
    in_a_pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert build_node_pods(plain, environ=in_a_pod, clock=clock) is None
    kube = AgentSettings(kubernetes_node=NODE, state_dir=tmp_path)
    assert build_node_pods(kube, environ={}, clock=clock) is None  # no API: warned, no context
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    pods = build_node_pods(kube, environ=env, clock=clock)
    assert pods is not None and pods.api_url == "https://[fd00::1]:443"
    assert pods.token_file == Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    assert pods.interval_s == 30.0
    assert in_cluster_api_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None
    with pytest.raises(ValueError, match="http:// or https://"):
        AgentSettings(kubernetes_api_url="kubernetes.default.svc")
    with pytest.raises(ValueError, match="greater than 0"):
        AgentSettings(kubernetes_pods_interval_s=0)
