"""Every kernel-log signature fires on its line and stays quiet on its near miss.

Parametrized over the catalog: a new kernel-log entry without a case here fails
``test_every_kernel_log_entry_has_cases``. Entries on the shared Xid and SXid patterns
get their lines generated for every code they claim.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from gpufleet.core.enums import RepairAction, Severity
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.matcher import KernelLogMatcher, Match, match_line, normalize_pci
from gpufleet.core.signatures.models import KernelLogRule, Signature

FIXTURES = Path(__file__).parents[2] / "fixtures" / "kernel-logs"
FM = "[Jul 23 2024 07:53:55] [ERROR] [tid 841] "

# id -> (lines that fire it, fed in order; lines that must fire nothing)
CASES: dict[str, tuple[Sequence[str], Sequence[str]]] = {
    "gpu-fallen-off-bus": (
        ["NVRM: GPU 0000:18:00.0: GPU has fallen off the bus."],
        ["NVRM: GPU 0000:18:00.0: GPU recovered, was not fallen off"],
    ),
    "gpu-fallen-off-bus-probe": (
        [
            "NVRM: The NVIDIA GPU 0000:b3:00.0",
            "NVRM: (PCI ID: 10de:26b5) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
        ],
        [
            "NVRM: The NVIDIA GPU 0000:b3:00.0",
            "NVRM: (PCI ID: 10de:26b5) installed in this system is",
            "NVRM: not supported by the 550.54.15 NVIDIA driver release.",
        ],
    ),
    "gpu-init-failed": (
        ["NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x26:0xffff:1601)"],
        ["NVRM: GPU 0000:3b:00.0: RmInitAdapter: retrying after FLR"],
    ),
    "driver-api-mismatch": (
        [
            "NVRM: API mismatch: the client has the version 535.104.05, but",
            "NVRM: this kernel module has the version 535.86.10.  Please",
            "NVRM: make sure that this kernel module and all NVIDIA driver",
        ],
        [
            "NVRM: API mismatch: the client has the version 535.104.05, but",
            "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  535.86.10",
        ],
    ),
    "nvlink-rx-detect-failed": (
        ["NVRM: knvlinkUpdatePostRxDetectLinkMask_IMPL: Failed to update Rx Detect Link mask!"],
        ["NVRM: knvlinkUpdatePostRxDetectLinkMask_IMPL: Rx Detect Link mask updated"],
    ),
    "fm-nvswitch-fatal": (
        [
            FM + "detected NVSwitch fatal error 20034 on fid 0 on NVSwitch pci bus id "
            "00000000:86:00.0 physical id 3 port 33"
        ],
        [FM + "detected NVSwitch count 4 matches HGX H100 topology"],
    ),
    "fm-nvswitch-nonfatal": (
        [
            FM + "detected NVSwitch non-fatal error 12028 on fid 0 on NVSwitch pci bus id "
            "00000000:86:00.0 physical id 3 port 33"
        ],
        [FM + "detected NVSwitch non-fatal error threshold set to 10"],
    ),
    "fm-topology-mismatch": (
        [
            FM + "detected number of NVSwitches don't match with any supported system "
            "topology, aborting fabric manager"
        ],
        [FM + "number of NVSwitches detected: 4"],
    ),
    "nccl-segfault": (
        [
            "pt_main_thread[2536443]: segfault at 7f797fe00000 ip 00007f7c7ac69996 sp "
            "00007f7b8dffe1e8 error 4 in libnccl.so.2[7f7c7ac00000+d3d3000]"
        ],
        ["NCCL INFO NET/Plugin: Loaded net plugin libnccl-net.so"],
    ),
    "peermem-invalid-context": (
        [
            "nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context, "
            "skipping further processing"
        ],
        ["ib_core: invalid context id 3 ignored"],
    ),
    "nic-insufficient-power": (
        [
            "mlx5_core 0000:5c:00.0: mlx5_pcie_event:299:(pid 268269): Detected insufficient "
            "power on the PCIe slot (27W)."
        ],
        ["mlx5_core 0000:5c:00.0: insufficient power warning cleared"],
    ),
    "nic-module-high-temperature": (
        [
            "mlx5_core 0000:5c:00.0: mlx5_port_module_event:1131:(pid 0): Port module "
            "event[error]: module 0, Cable error, High Temperature"
        ],
        [
            "mlx5_core 0000:5c:00.0: mlx5_port_module_event:1131:(pid 0): Port module event: "
            "module 0, Cable plugged"
        ],
    ),
    "ib-kmsg-link-down": (
        ["mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link DOWN"],
        ["bonding: bond0: Link DOWN event ignored on eth3"],
    ),
    "pcie-bandwidth-limited": (
        [
            "pci 0000:04:00.0: 252.048 Gb/s available PCIe bandwidth, limited by 16.0 GT/s PCIe "
            "x16 link at 0000:01:00.0 (capable of 504.112 Gb/s with 32.0 GT/s PCIe x16 link)"
        ],
        ["pci 0000:04:00.0: 504.112 Gb/s available PCIe bandwidth (32.0 GT/s PCIe x16 link)"],
    ),
    "pcie-aer-uncorrected": (
        ["pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:3b:00.0"],
        ["pcieport 0000:00:03.1: AER: Corrected error received: 0000:3b:00.0"],
    ),
}

# Lines every catalog must leave alone: banners, identity lines, SXid follow-ups, noise.
NEVER = [
    "NVRM: loading NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024",
    "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build",
    "NVRM: GPU at PCI:0000:3b:00: GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b",
    "NVRM: GPU Board Serial Number: 1653723052734",
    "NVRM: Persistence mode is deprecated and will be removed in a future release.",
    "NVRM: The NVIDIA probe routine was not called for 1 device(s).",
    "NVRM: This can occur when a driver such as: nouveau, rivafb, nvidiafb or rivatv",
    "nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver for UNIX platforms  550.54.15",
    "nvidia-nvlink: Nvlink Core is being initialized, major device number 234",
    "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Severity 1 Engine instance 60 "
    "Sub-engine instance 00",
    "nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Data {0x10000000, 0x10000000}",
    "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
    "mlx5_core 0000:ab:00.0: mlx5_cmd_out_err:838:(pid 1441871): ACCESS_REG(0x805) op_mod(0x1)"
    " failed, status bad resource(0x5), syndrome (0x305684), err(-22)",
    "[Jul 23 2024 07:53:55] [INFO] [tid 841] NV_WARN_NOTHING_TO_DO",
    "python[2211]: segfault at 0 ip 00007f2b1c2d3e4f sp 00007ffd5b1e8a10 error 4 in libc.so.6",
    "audit: type=1400 msg='grep NVRM: Xid 79 /var/log/kern.log'",
    "NVRM: Xid (PCI:0000:3b:00)",
]


def _coded(sig: Signature) -> list[tuple[Sequence[str], Sequence[str]]]:
    rule = sig.match
    assert isinstance(rule, KernelLogRule)
    if rule.pattern_ref == "nvrm-xid":
        codes = rule.codes or (999,)
        return [
            (
                [f"NVRM: Xid (PCI:0000:3b:00): {c}, pid=4242, name=python3, Ch 00000008"],
                [f"NVRM: GPU 0000:3b:00.0: Xid-like counter {c}, not an Xid"],
            )
            for c in codes
        ]
    if rule.pattern_ref == "nvswitch-sxid":
        codes = rule.codes or (29999,)
        sev = "Non-fatal" if rule.excludes else "Fatal"
        return [
            (
                [f"nvidia-nvswitch3: SXid (PCI:0000:05:00.0): {c}, {sev}, Link 12 Test error"],
                [f"nvidia-nvswitch3: SXid (PCI:0000:05:00.0): {c}, Severity 1 Engine instance 6"],
            )
            for c in codes
        ]
    return [CASES[sig.id]] if sig.id in CASES else []


KERNEL = [s for s in get_catalog().signatures if isinstance(s.match, KernelLogRule)]
PARAMS = [
    pytest.param(sig.id, fire, miss, id=f"{sig.id}#{i}")
    for sig in KERNEL
    for i, (fire, miss) in enumerate(_coded(sig))
]


def _run(lines: Sequence[str], matcher: KernelLogMatcher | None = None) -> list[Match]:
    m = matcher or KernelLogMatcher()
    return [x for line in lines for x in m.feed(line)]


def test_every_kernel_log_entry_has_cases() -> None:
    missing = [s.id for s in KERNEL if not _coded(s)]
    assert missing == [], f"add a firing line and a near miss to CASES for {missing}"
    assert set(CASES) <= {s.id for s in KERNEL}, "CASES names an id the catalog lacks"


@pytest.mark.parametrize(("sig_id", "fire", "miss"), PARAMS)
def test_fires_and_near_miss_does_not(
    sig_id: str, fire: Sequence[str], miss: Sequence[str]
) -> None:
    sig = get_catalog().get(sig_id)
    assert sig is not None and isinstance(sig.match, KernelLogRule)
    assert any(p in fire[0] for p in sig.match.prefilter), "the firing line must pass the prefilter"
    assert [m.signature for m in _run(fire)] == [sig_id]
    assert _run(miss) == []


@pytest.mark.parametrize("line", NEVER)
def test_informational_lines_never_match(line: str) -> None:
    assert _run([line, "[ 12.345678] " + line]) == []


# ---- the recorded real lines (reference §1.10), verbatim ---------------------------------

EXPECTED_REFERENCE = [
    (3, "xid-79", 79, "0000:91:00.0", Severity.FATAL, RepairAction.REBOOT),
    (4, "gpu-fallen-off-bus", None, "0000:91:00.0", Severity.FATAL, RepairAction.REBOOT),
    (5, "sxid-ltssm-fault-up", None, "0000:06:00.0", Severity.FATAL, RepairAction.REBOOT),
    (8, "xid-119", 119, "0000:9b:00.0", Severity.CRITICAL, RepairAction.RESET_GPU),
    (9, "xid-13", 13, "0000:38:00.0", Severity.WARNING, RepairAction.RESTART_WORKLOAD),
    (10, "xid-13", 13, "0000:38:00.0", Severity.WARNING, RepairAction.RESTART_WORKLOAD),
    (11, "xid-43", 43, "0000:38:00.0", Severity.INFO, RepairAction.NONE),
    (12, "xid-48", 48, "0000:52:00.0", Severity.CRITICAL, RepairAction.RESET_GPU),
    (13, "xid-63", 63, "0000:52:00.0", Severity.WARNING, RepairAction.RESET_GPU),
    (14, "xid-94", 94, "0000:52:00.0", Severity.WARNING, RepairAction.RESTART_WORKLOAD),
    (15, "xid-63", 63, "0000:10:1c.0", Severity.WARNING, RepairAction.RESET_GPU),
    (16, "xid-154", 154, "0000:55:00.0", Severity.CRITICAL, RepairAction.RESET_GPU),
    (17, "xid-31", 31, "0000:3f:00.0", Severity.WARNING, RepairAction.RESTART_WORKLOAD),
    (18, "xid-74", 74, "0003:00:00.0", Severity.CRITICAL, RepairAction.RESET_GPU),
    (19, "xid-74", 74, "0000:b9:00.0", Severity.CRITICAL, RepairAction.RESET_GPU),
    (20, "xid-149", 149, "0019:01:00.0", Severity.CRITICAL, RepairAction.RESET_GPU),
    (21, "xid-149", 149, "0000:00:00.0", Severity.CRITICAL, RepairAction.RESET_GPU),
    (22, "xid-79", 79, "0000:01:00.0", Severity.FATAL, RepairAction.REBOOT),
    (23, "xid-154", 154, "0000:01:00.0", Severity.FATAL, RepairAction.REBOOT),
    (24, "gpu-fallen-off-bus-probe", None, "0000:b3:00.0", Severity.FATAL, RepairAction.REBOOT),
    (27, "fm-nvswitch-fatal", None, "0000:86:00.0", Severity.CRITICAL, RepairAction.REBOOT),
]


def _scan_bytes(data: bytes, chunk: int) -> list[Match]:
    m = KernelLogMatcher(gpu_indexes={"0000:91:00.0": 5})
    out: list[Match] = []
    for i in range(0, len(data), chunk):
        out.extend(m.feed_bytes(data[i : i + chunk]))
    return out + m.finish()


@pytest.mark.parametrize("chunk", [1 << 20, 7, 64, 1000])
def test_reference_lines_verbatim(chunk: int) -> None:
    data = (FIXTURES / "reference-1.10.log").read_bytes()
    found = _scan_bytes(data, chunk)
    got = [(m.line_number, m.signature, m.xid, m.pci, m.severity, m.action) for m in found]
    assert got == EXPECTED_REFERENCE
    first = found[0]
    assert first.gpu_uuid == "GPU-b6c3b2be-c55b-d076-fa0e-d464e4c7e08b"
    assert first.gpu_index == 5
    assert first.uptime_s == pytest.approx(6781741.548779)
    probe = next(m for m in found if m.signature == "gpu-fallen-off-bus-probe")
    assert probe.line.count("\n") == 2
    assert next(m for m in found if m.signature == "sxid-ltssm-fault-up").sxid == 20034


def test_line_by_line_and_bytes_agree() -> None:
    text = (FIXTURES / "reference-1.10.log").read_text()
    m = KernelLogMatcher()
    by_line = [
        x.signature
        for n, line in enumerate(text.splitlines(), 1)
        for x in m.feed(line, line_number=n)
    ]
    assert by_line == [e[1] for e in EXPECTED_REFERENCE]


def test_healthy_boot_log_has_no_findings() -> None:
    assert _scan_bytes((FIXTURES / "healthy-boot.log").read_bytes(), 1 << 20) == []


def test_last_line_without_newline_is_matched() -> None:
    m = KernelLogMatcher()
    assert m.feed_bytes(b"x\nNVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.") == []
    [found] = m.finish()
    assert (found.signature, found.line_number) == ("xid-79", 2)


# ---- variants: every prefix style, PCI spellings, multi-line with prefixes ----------------

PREFIXES: dict[str, Callable[[int], str]] = {
    "bare": lambda _: "",
    "dmesg": lambda i: f"[ {1234 + i}.567890] ",
    "dmesg-T": lambda i: f"[Tue Mar  5 10:12:0{i} 2024] ",
    "dmesg-x": lambda i: f"kern  :err   : [ {1234 + i}.567890] ",
    "dmesg-x-iso": lambda i: f"kern  :warn  : 2025-01-21T04:41:4{i},283575+00:00 ",
    "journal-short": lambda i: f"Mar 05 10:12:0{i} gpu-node-7 kernel: ",
    "journal-iso": lambda i: f"2024-03-05T10:12:0{i}.123456+0000 gpu-node-7 kernel: ",
    "journal-monotonic": lambda i: f"[ {1234 + i}.567890] gpu-node-7 kernel: ",
    "journal-full": lambda i: f"Tue 2024-03-05 10:12:0{i} UTC gpu-node-7 kernel: ",
    "rfc3164": lambda i: f"<4>Mar  5 10:12:0{i} gpu-node-7 kernel: [ {1234 + i}.5] ",
    "rfc5424": lambda i: f"<4>1 2024-03-05T10:12:0{i}.000Z gpu-node-7 kernel - - - ",
    "kmsg": lambda i: f"4,{100 + i},{1234567890 + i},-;",
}

VARIANT_MESSAGES: list[tuple[list[str], str, str]] = [
    (
        [
            "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, "
            "GPU has fallen off the bus."
        ],
        "xid-79",
        "0000:3b:00.0",
    ),
    (["NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus."], "gpu-fallen-off-bus", "0000:3b:00.0"),
    (
        ["nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"],
        "sxid-ltssm-fault-up",
        "0000:06:00.0",
    ),
    (
        [
            "NVRM: The NVIDIA GPU 0000:b3:00.0",
            "NVRM: (PCI ID: 10de:26b5) installed in this system has",
            "NVRM: fallen off the bus and is not responding to commands.",
        ],
        "gpu-fallen-off-bus-probe",
        "0000:b3:00.0",
    ),
]


@pytest.mark.parametrize("style", PREFIXES)
@pytest.mark.parametrize(("lines", "sig_id", "pci"), VARIANT_MESSAGES)
def test_every_prefix_style(style: str, lines: list[str], sig_id: str, pci: str) -> None:
    prefixed = [PREFIXES[style](i) + line for i, line in enumerate(lines)]
    found = _run(prefixed)
    assert [(m.signature, m.pci) for m in found] == [(sig_id, pci)]
    assert found[0].line == "\n".join(prefixed)
    if style.startswith("journal") or style.startswith("rfc"):
        assert found[0].host == "gpu-node-7"


def test_multi_line_survives_interleaved_noise_and_dmesg_indent() -> None:
    lines = [
        "[ 1843.308145] NVRM: The NVIDIA GPU 0000:b3:00.0",
        "[ 1843.308150] e1000e: eth0 NIC Link is Up 1000 Mbps Full Duplex",
        "               NVRM: (PCI ID: 10de:26b5) installed in this system has",
        "               NVRM: fallen off the bus and is not responding to commands.",
    ]
    assert [m.signature for m in _run(lines)] == ["gpu-fallen-off-bus-probe"]


def test_multi_line_joined_on_one_line_still_matches() -> None:
    line = (
        "Mar 05 10:12:01 gpu-7 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0 NVRM: (PCI ID: "
        "10de:26b5) installed in this system has NVRM: fallen off the bus and is not "
        "responding to commands."
    )
    assert [m.signature for m in match_line(line)] == ["gpu-fallen-off-bus-probe"]


def test_multi_line_window_expires() -> None:
    lines = ["NVRM: The NVIDIA GPU 0000:b3:00.0"] + ["NVRM: GPU Board Serial Number: 1"] * 4
    lines.append("NVRM: fallen off the bus and is not responding to commands.")
    assert _run(lines) == []


@pytest.mark.parametrize(
    ("written", "normal"),
    [
        ("PCI:0000:3b:00", "0000:3b:00.0"),
        ("PCI:0000:3B:00", "0000:3b:00.0"),
        ("0000:03:00", "0000:03:00.0"),
        ("PCI:3b:00", "0000:3b:00.0"),
        ("PCI:0018:01:00", "0018:01:00.0"),
        ("PCI:0000:10:1c", "0000:10:1c.0"),
        ("PCI:0000:3b:00.0", "0000:3b:00.0"),
    ],
)
def test_xid_pci_spellings(written: str, normal: str) -> None:
    [m] = match_line(f"NVRM: Xid ({written}): 14, Channel 00000001")
    assert (m.signature, m.xid, m.pci) == ("xid-informational", 14, normal)


def test_normalize_pci() -> None:
    assert normalize_pci("00000000:86:00.0") == "0000:86:00.0"
    assert normalize_pci("PCI:0019:01:00") == "0019:01:00.0"
    assert normalize_pci("3b:00.1") == "0000:3b:00.1"
    assert normalize_pci("nonsense") is None
    assert normalize_pci(None) is None


def test_nvrm_lines_with_extra_fields() -> None:
    [m] = match_line(
        "NVRM: Xid (PCI:0000:3b:00 GPU-b6c3b2be): 48, pid=77, name=python, "
        "channel 0x00000009, errorString CTX SWITCH TIMEOUT"
    )
    assert (m.signature, m.pci) == ("xid-48", "0000:3b:00.0")
    [old] = match_line("NVRM: Xid (0000:03:00): 79, GPU has fallen off the bus.")
    assert old.signature == "xid-79"


def test_unknown_xid_falls_back() -> None:
    [m] = match_line("NVRM: Xid (PCI:0000:3b:00): 201, pid=1, name=x, new error")
    assert (m.signature, m.xid, m.severity) == ("xid-unknown", 201, Severity.CRITICAL)


@pytest.mark.parametrize(
    ("text", "severity", "action"),
    [
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
            Severity.CRITICAL,
            RepairAction.RESET_GPU,
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
            Severity.FATAL,
            RepairAction.REBOOT,
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
            Severity.FATAL,
            RepairAction.REBOOT,
        ),
        (
            "154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)",
            Severity.CRITICAL,
            RepairAction.RESET_GPU,
        ),
        (
            "154, GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)",
            Severity.INFO,
            RepairAction.NONE,
        ),
        (
            "94, pid=1, name=x, Contained: SM (0x1). RST: No, D-RST: No",
            Severity.WARNING,
            RepairAction.RESTART_WORKLOAD,
        ),
        (
            "94, pid=1, name=x, Contained: SM (0x1). RST: Yes, D-RST: No",
            Severity.CRITICAL,
            RepairAction.RESET_GPU,
        ),
        (
            "145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (0x0409a0c2 0x00000008 0x00000001)",
            Severity.INFO,
            RepairAction.NONE,
        ),
        (
            "145, RLW_REMAP Fatal XC0 i0 Link 13 (0x0409a0c2 0x00000040 0x00000001)",
            Severity.CRITICAL,
            RepairAction.RESET_GPU,
        ),
        (
            "146, TLW_RX Nonfatal XC0 i0 Link 2 (0x0409a0c2 0x00000001 0x00000001)",
            Severity.WARNING,
            RepairAction.NONE,
        ),
        (
            "149, NETIR_BER_EVENT Fatal XC0 i0 Link 2 (0x0409a0c2 0x00000001)",
            Severity.INFO,
            RepairAction.NONE,
        ),
    ],
)
def test_the_line_can_state_its_own_action(
    text: str, severity: Severity, action: RepairAction
) -> None:
    [m] = match_line(f"NVRM: Xid (PCI:0008:01:00): {text}")
    assert (m.severity, m.action) == (severity, action)


def test_aer_non_fatal_is_a_warning() -> None:
    [m] = match_line(
        "pcieport 0000:00:03.1: AER: Uncorrected (Non-Fatal) error received: 0000:3b:00.0"
    )
    assert (m.signature, m.severity, m.action, m.pci) == (
        "pcie-aer-uncorrected",
        Severity.WARNING,
        RepairAction.NONE,
        "0000:3b:00.0",
    )


def test_a_custom_catalog_is_compiled_separately() -> None:
    from gpufleet.core.signatures.catalog import load_catalog

    cat = load_catalog(
        'version = "t"\n[[signatures]]\nid = "boom"\ntitle = "Boom line"\ncategory = "driver"\n'
        'severity = "warning"\nsource = "kernel-log"\naction = "none"\nreference = "test"\n'
        'match = { pattern = "BOOM (?P<pci>[0-9a-f:.]+)", prefilter = ["BOOM"] }\n'
    )
    [m] = KernelLogMatcher(cat).feed("[ 1.0] BOOM 0000:3b:00.0")
    assert (m.signature, m.pci) == ("boom", "0000:3b:00.0")
    assert KernelLogMatcher().feed("[ 1.0] BOOM 0000:3b:00.0") == []


@pytest.mark.parametrize(
    ("line", "signature", "pci"),
    [
        # Log scrubbers redact the address; the Xid still counts, for the node.
        ("NVRM: Xid (PCI:<redacted>): 79, pid='<unknown>', name=<unknown>, GPU has fallen "
         "off the bus.", "xid-79", None),
        ("NVRM: Xid (PCI:XXXX:XX:XX): 79, pid=2131, GPU has fallen off the bus.", "xid-79", None),
        ("NVRM: Xid (): 48, pid=9, An uncorrectable double bit error (DBE) has been detected",
         "xid-48", None),
        # Older drivers' words for a GPU that fell off the bus.
        ("NVRM: GPU at PCI:0000:02:00: GPU has fallen off the bus.", "gpu-fallen-off-bus",
         "0000:02:00.0"),
        ("NVRM: GPU at 0000:02:00.0 has fallen off the bus.", "gpu-fallen-off-bus",
         "0000:02:00.0"),
    ],
)  # fmt: skip
def test_xid_and_fallen_off_bus_variants(line: str, signature: str, pci: str | None) -> None:
    found = match_line(line)
    assert [(m.signature, m.pci) for m in found] == [(signature, pci)], found


def test_an_xid_without_its_number_is_no_xid() -> None:
    assert match_line("NVRM: Xid (PCI:<redacted>): pid=2131, name=python3") == []
