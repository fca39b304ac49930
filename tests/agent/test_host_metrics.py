"""The host's I/O counters on the agent's /metrics, from the recorded trees in
tests/fixtures/hostio (README there): every expected value below is read off the
fixture files by hand, not recomputed with the code under test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from gpufleet.agent.exporter import scrape
from gpufleet.agent.hostio.reader import HostIoReader
from gpufleet.agent.hostio.storage import (
    DISK_EXCLUDE_DEFAULT,
    parse_diskstats,
    parse_lustre_stats,
    parse_mountstats,
)
from gpufleet.agent.main import build_agent, build_host_reader
from gpufleet.agent.runtime import Agent
from gpufleet.agent.settings import AgentSettings
from gpufleet.client.agent import AgentClient
from gpufleet.core.clock import FakeClock

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hostio"
SYS, PROC = FIXTURES / "sys", FIXTURES / "proc"
Key = tuple[str, frozenset[tuple[str, str]]]


def make_agent(tmp_path: Path) -> Agent:
    settings = AgentSettings(state_dir=tmp_path, node_token="t", metrics_listen=None)  # type: ignore[arg-type]
    client = AgentClient(base_url="http://127.0.0.1:1", node_token="t")
    return build_agent(settings, client=client, collectors=[], sources=[], clock=FakeClock())


def fixture_reader(**overrides: object) -> HostIoReader:
    settings = AgentSettings(node_token="t", sys_root=SYS, proc_root=PROC, **overrides)  # type: ignore[arg-type]
    reader = build_host_reader(settings)
    assert reader is not None
    return reader


def parse(text: str) -> tuple[dict[Key, float], dict[str, str]]:
    """Samples by (name, labels without hostname), and each family's type, through
    prometheus_client's parser. Fails on a duplicate series or a family split in two."""
    samples: dict[Key, float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in types, f"family {family.name} split or repeated"
        types[family.name] = family.type
        for s in family.samples:
            assert s.labels.get("hostname") == "node-7", s
            labels = frozenset((k, v) for k, v in s.labels.items() if k != "hostname")
            key = (s.name, labels)
            assert key not in samples, f"duplicate series {key}"
            samples[key] = s.value
    return samples, types


def get(samples: dict[Key, float], name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


@pytest.fixture
async def scraped(tmp_path: Path) -> tuple[dict[Key, float], dict[str, str], str]:
    agent = make_agent(tmp_path)
    try:
        text = await scrape(agent, hostname="node-7", host=fixture_reader())
    finally:
        agent.spool.close()
    samples, types = parse(text)
    return samples, types, text


async def test_infiniband_ports(scraped: tuple[dict[Key, float], dict[str, str], str]) -> None:
    samples, types, _ = scraped
    p1 = {"device": "mlx5_0", "port": "1"}
    p2 = {"device": "mlx5_0", "port": "2"}
    assert get(samples, "node_infiniband_state_id", **p1) == 4
    assert get(samples, "node_infiniband_state_id", **p2) == 1
    assert get(samples, "node_infiniband_physical_state_id", **p1) == 5
    assert get(samples, "node_infiniband_physical_state_id", **p2) == 3
    assert get(samples, "node_infiniband_rate_bytes_per_second", **p1) == 50_000_000_000
    assert get(samples, "node_infiniband_rate_bytes_per_second", **p2) == 1_250_000_000
    # port_rcv_data 2617824309126 words of 4 bytes
    assert get(samples, "node_infiniband_port_data_received_bytes_total", **p1) == 10471297236504
    assert get(samples, "node_infiniband_port_data_transmitted_bytes_total", **p1) == 10396846938352
    assert get(samples, "node_infiniband_port_packets_received_total", **p1) == 1201887765
    assert get(samples, "node_infiniband_port_packets_transmitted_total", **p1) == 1198402813
    assert get(samples, "node_infiniband_link_downed_total", **p1) == 1
    assert get(samples, "node_infiniband_symbol_error_total", **p1) == 7
    assert get(samples, "node_infiniband_port_errors_received_total", **p1) == 3
    assert get(samples, "node_infiniband_port_discards_transmitted_total", **p1) == 12
    assert get(samples, "node_infiniband_port_transmit_wait_total", **p1) == 88215906
    assert get(samples, "node_infiniband_local_ack_timeout_errors_total", **p1) == 5
    assert get(samples, "node_infiniband_req_cqes_errors_total", **p1) == 4
    assert get(samples, "node_infiniband_link_downed_total", **p2) == 0
    # port 2: "N/A (no PMA)" and the counters that are not there are absent, not 0
    assert get(samples, "node_infiniband_port_transmit_wait_total", **p2) is None
    assert get(samples, "node_infiniband_unicast_packets_received_total", **p2) is None
    assert get(samples, "node_infiniband_local_ack_timeout_errors_total", **p2) is None
    assert (
        get(
            samples,
            "node_infiniband_info",
            device="mlx5_0",
            board_id="MT_0000000838",
            firmware_version="28.39.1002",
            hca_type="MT4129",
        )
        == 1
    )
    assert types["node_infiniband_state_id"] == "gauge"
    assert types["node_infiniband_link_downed"] == "counter"  # the parser drops _total


async def test_network_interfaces(scraped: tuple[dict[Key, float], dict[str, str], str]) -> None:
    samples, _, text = scraped
    eno1 = {"device": "eno1"}
    assert get(samples, "node_network_up", **eno1) == 1
    assert get(samples, "node_network_carrier", **eno1) == 1
    assert get(samples, "node_network_carrier_changes_total", **eno1) == 4
    assert get(samples, "node_network_speed_bytes", **eno1) == 3_125_000_000  # 25000 Mb/s
    assert get(samples, "node_network_mtu_bytes", **eno1) == 9000
    assert get(samples, "node_network_receive_bytes_total", **eno1) == 884630214433
    assert get(samples, "node_network_transmit_bytes_total", **eno1) == 193201446172
    assert get(samples, "node_network_receive_packets_total", **eno1) == 712543298
    assert get(samples, "node_network_transmit_packets_total", **eno1) == 402117724
    assert get(samples, "node_network_receive_errs_total", **eno1) == 2
    assert get(samples, "node_network_receive_drop_total", **eno1) == 1877
    assert get(samples, "node_network_transmit_drop_total", **eno1) == 0
    down = {"device": "enp3s0f1"}
    assert get(samples, "node_network_up", **down) == 0
    assert get(samples, "node_network_carrier_changes_total", **down) == 1
    assert get(samples, "node_network_carrier", **down) is None  # EINVAL: absent
    assert get(samples, "node_network_speed_bytes", **down) is None  # -1: unknown
    assert get(samples, "node_network_speed_bytes", device="ibp24s0") is None
    assert get(samples, "node_network_mtu_bytes", device="ibp24s0") == 4092
    for skipped in ("lo", "veth3f2a1c9", "bonding_masters"):
        assert f'device="{skipped}"' not in text


async def test_block_devices(scraped: tuple[dict[Key, float], dict[str, str], str]) -> None:
    samples, types, _ = scraped
    devices = {
        dict(labels)["device"]
        for name, labels in samples
        if name == "node_disk_reads_completed_total"
    }
    # partitions, loop and ram are out, as node_exporter's default pattern has it
    assert devices == {"sda", "nvme0n1", "nvme1n1", "md0", "dm-0"}
    nvme = {"device": "nvme0n1"}
    assert get(samples, "node_disk_reads_completed_total", **nvme) == 1185349
    assert get(samples, "node_disk_reads_merged_total", **nvme) == 201
    assert get(samples, "node_disk_read_bytes_total", **nvme) == 95434522 * 512
    assert get(samples, "node_disk_read_time_seconds_total", **nvme) == 341.839
    assert get(samples, "node_disk_writes_completed_total", **nvme) == 3218478
    assert get(samples, "node_disk_written_bytes_total", **nvme) == 231452392 * 512
    assert get(samples, "node_disk_write_time_seconds_total", **nvme) == 4121.938
    assert get(samples, "node_disk_io_now", **nvme) == 3
    assert get(samples, "node_disk_io_time_seconds_total", **nvme) == 1546.984
    assert get(samples, "node_disk_io_time_weighted_seconds_total", **nvme) == 4563.254
    assert get(samples, "node_disk_discards_completed_total", **nvme) == 8821
    assert get(samples, "node_disk_discarded_sectors_total", **nvme) == 912388744
    assert get(samples, "node_disk_flush_requests_total", **nvme) == 230116
    assert get(samples, "node_disk_flush_requests_time_seconds_total", **nvme) == 99.476
    assert types["node_disk_io_now"] == "gauge"
    assert types["node_disk_read_bytes"] == "counter"


async def test_nfs_mounts(scraped: tuple[dict[Key, float], dict[str, str], str]) -> None:
    samples, _, _ = scraped
    home = {"export": "10.20.0.5:/export/home", "protocol": "tcp", "mountaddr": "10.20.0.5"}
    data = {"export": "10.20.0.9:/datasets", "protocol": "rdma", "mountaddr": "10.20.0.9"}
    assert get(samples, "node_mountstats_nfs_read_bytes_total", **home) == 53687091200
    assert get(samples, "node_mountstats_nfs_write_bytes_total", **home) == 21474836480
    assert get(samples, "node_mountstats_nfs_total_read_bytes_total", **home) == 53741670400
    assert get(samples, "node_mountstats_nfs_age_seconds_total", **home) == 86412
    assert get(samples, "node_mountstats_nfs_read_bytes_total", **data) == 107374182400
    read = {**home, "operation": "READ"}
    write = {**home, "operation": "WRITE"}
    assert get(samples, "node_mountstats_nfs_operations_requests_total", **read) == 51200
    assert get(samples, "node_mountstats_nfs_operations_requests_total", **write) == 20480
    assert get(samples, "node_mountstats_nfs_operations_transmissions_total", **write) == 20490
    assert get(samples, "node_mountstats_nfs_operations_major_timeouts_total", **write) == 3
    assert get(samples, "node_mountstats_nfs_operations_request_time_seconds_total", **write) == (
        302.117
    )
    assert get(samples, "node_mountstats_nfs_operations_response_time_seconds_total", **write) == (
        297.102
    )
    assert get(samples, "node_mountstats_nfs_operations_queue_time_seconds_total", **write) == 4.21
    assert get(samples, "node_mountstats_nfs_operations_errors_total", **write) == 2
    assert (
        get(
            samples, "node_mountstats_nfs_operations_major_timeouts_total", **data, operation="READ"
        )
        == 11
    )
    # an operation never used is left out; the pod's second mount of /export/home is
    # the same superblock and is not a second series (the parser would refuse duplicates)
    assert get(
        samples, "node_mountstats_nfs_operations_requests_total", **home, operation="LINK"
    ) is (None)
    exports = {
        dict(k[1])["export"] for k in samples if k[0] == "node_mountstats_nfs_read_bytes_total"
    }
    assert exports == {"10.20.0.5:/export/home", "10.20.0.9:/datasets"}


async def test_lustre_clients(scraped: tuple[dict[Key, float], dict[str, str], str]) -> None:
    samples, _, _ = scraped
    assert get(samples, "gpufleet_lustre_read_bytes_total", fs="scratch") == 5381357568
    assert get(samples, "gpufleet_lustre_write_bytes_total", fs="scratch") == 2550136832
    assert get(samples, "gpufleet_lustre_read_bytes_total", fs="home") == 1073741824  # ≤ 2.12
    assert get(samples, "gpufleet_lustre_write_bytes_total", fs="home") == 268435456
    assert get(samples, "gpufleet_lustre_operations_total", fs="scratch", operation="open") == 402
    assert get(samples, "gpufleet_lustre_operations_total", fs="home", operation="getattr") == 1020
    assert (
        get(samples, "gpufleet_lustre_operation_time_seconds_total", fs="scratch", operation="read")
        == 3.106523
    )
    # [regs] lines (old Lustre) carry no time
    assert (
        get(samples, "gpufleet_lustre_operation_time_seconds_total", fs="home", operation="open")
        is None
    )


async def test_every_series_has_hostname_and_parses(
    scraped: tuple[dict[Key, float], dict[str, str], str],
) -> None:
    _, types, text = scraped  # parse() already held every sample to hostname="node-7"
    assert "Hostname" not in text
    assert {"node_infiniband_state_id", "node_network_up", "gpufleet_agent_cpu_seconds"} <= set(
        types
    )
    for line in text.splitlines():
        assert line.startswith("#") or re.match(r"^[a-zA-Z_:][a-zA-Z0-9_:]*\{.*\} \S+$", line), line


def test_missing_roots_give_no_series(tmp_path: Path) -> None:
    reader = HostIoReader(sys_root=tmp_path / "nope", proc_root=tmp_path / "nope")
    snap = reader.read()
    assert not (snap.ib_ports or snap.net or snap.disks or snap.nfs or snap.lustre)


def test_odd_files_are_skipped(tmp_path: Path) -> None:
    port = tmp_path / "sys/class/infiniband/mlx5_1/ports/1"
    (port / "counters").mkdir(parents=True)
    (port / "state").write_text("garbage\n")
    (port / "phys_state").write_text("5: LinkUp\n")
    (port / "rate").write_text("\n")
    (port / "counters" / "symbol_error").write_text("-3\n")
    (port / "counters" / "link_downed").mkdir()  # a directory where a file should be
    (port / "counters" / "port_rcv_errors").write_text("12\n")
    nic = tmp_path / "sys/class/net/eth9"
    (nic / "statistics").mkdir(parents=True)
    (nic / "operstate").write_text("up\n")
    (nic / "mtu").write_text("lots\n")
    (nic / "statistics" / "rx_bytes").write_text("18446744073709551615\n")  # u64 max
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/diskstats").write_bytes(b"\xff\xfe\x00 8 0 sda 1 2\n")
    snap = HostIoReader(sys_root=tmp_path / "sys", proc_root=tmp_path / "proc").read()
    [p] = snap.ib_ports
    assert (p.state_id, p.physical_state_id, p.rate_bytes_per_second) == (None, 5, None)
    assert p.counters == {"port_errors_received_total": 12}
    [n] = snap.net
    assert n.mtu_bytes is None and n.statistics == {"receive_bytes_total": 2**64 - 1}
    assert snap.disks == []


def test_diskstats_of_older_kernels() -> None:
    exclude = re.compile(DISK_EXCLUDE_DEFAULT)
    old = parse_diskstats((FIXTURES / "variants/diskstats-4.15.txt").read_text(), exclude=exclude)
    assert [d.device for d in old] == ["sda", "nvme0n1"]
    assert set(old[1].values) == {
        "reads_completed_total",
        "reads_merged_total",
        "read_bytes_total",
        "read_time_seconds_total",
        "writes_completed_total",
        "writes_merged_total",
        "written_bytes_total",
        "write_time_seconds_total",
        "io_now",
        "io_time_seconds_total",
        "io_time_weighted_seconds_total",
    }
    mid = parse_diskstats((FIXTURES / "variants/diskstats-4.18.txt").read_text(), exclude=exclude)
    assert [d.device for d in mid] == ["sda", "nvme0n1"]  # sdb: not a number; sdc: cut
    assert mid[1].values["discarded_sectors_total"] == 912388744
    assert "flush_requests_total" not in mid[1].values


def test_reader_survives_a_parser_bug(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    reader = fixture_reader()

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("gpufleet.agent.hostio.reader.parse_diskstats", boom)
    snap = reader.read()
    snap2 = reader.read()
    assert snap.disks == [] and snap.ib_ports and snap.nfs  # the rest is still there
    assert snap2.disks == []
    assert caplog.text.count("reading diskstats for /metrics failed") == 1  # logged once


def test_host_metrics_off_and_excludes() -> None:
    assert build_host_reader(AgentSettings(node_token="t", host_metrics=False)) is None  # type: ignore[arg-type]
    reader = fixture_reader(net_device_exclude="", disk_device_exclude="^sda$")
    snap = reader.read()
    assert {n.device for n in snap.net} == {"lo", "eno1", "ibp24s0", "enp3s0f1", "veth3f2a1c9"}
    assert "sda" not in {d.device for d in snap.disks} and "loop0" in {d.device for d in snap.disks}
    skipped = fixture_reader(infiniband_exclude=["mlx5_0"]).read()
    assert skipped.ib_ports == [] and skipped.ib_devices == []
    with pytest.raises(ValueError, match="not a regular expression"):
        AgentSettings(node_token="t", net_device_exclude="(")  # type: ignore[arg-type]


def test_roots_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUFLEET_AGENT_SYS_ROOT", "/host/sys")
    monkeypatch.setenv("GPUFLEET_AGENT_PROC_ROOT", "/host/proc")
    s = AgentSettings(node_token="t")  # type: ignore[arg-type]
    assert (s.sys_root, s.proc_root) == (Path("/host/sys"), Path("/host/proc"))
    assert s.infiniband_dir() == Path("/host/sys/class/infiniband")
    monkeypatch.delenv("GPUFLEET_AGENT_SYS_ROOT")
    assert AgentSettings(node_token="t").infiniband_dir() == Path("/sys/class/infiniband")  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("0123456789 abcdeNFSRAD:-_.[]/\n\t"), max_size=400))
def test_parsers_never_raise(text: str) -> None:
    parse_diskstats(text, exclude=re.compile(DISK_EXCLUDE_DEFAULT))
    parse_mountstats("device a:/b mounted on /m with fstype nfs4\n" + text, mountinfo=text)
    parse_lustre_stats(text, fs="x")
