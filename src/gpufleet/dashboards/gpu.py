"""GPUs, from the agent's dcgm-exporter-named series (the agent on each node, or
dcgm-exporter itself where it runs): load, memory, power, heat, clocks and throttle
reasons, ECC and row remapping, NVLink and PCIe errors, Xids."""

from __future__ import annotations

from gpufleet.dashboards.panels import GPU, GPU_LEGEND, RATE, DashboardSpec, PanelSpec, Query

# DCGM_FI_DEV_CLOCKS_EVENT_REASONS bits (nvmlClocksEventReason*): each one 0 or 1.
THROTTLE_BITS = (
    (0x04, "SW power cap"),
    (0x08, "HW slowdown"),
    (0x20, "SW thermal"),
    (0x40, "HW thermal"),
    (0x80, "power brake"),
)


def gpu_series(metric: str, legend: str = GPU_LEGEND) -> Query:
    return Query(f"{metric}{{{GPU}}}", legend)


def gpu_rate(metric: str, what: str) -> Query:
    return Query(f"rate({metric}{{{GPU}}}[{RATE}])", f"{GPU_LEGEND} {what}")


UTIL = PanelSpec(
    "GPU utilization",
    [gpu_series("DCGM_FI_DEV_GPU_UTIL")],
    unit="percent",
    minimum=0,
    description="Share of time a kernel ran (NVML utilization.gpu).",
)
MEMORY = PanelSpec(
    "Framebuffer memory used",
    [
        Query(
            f"DCGM_FI_DEV_FB_USED{{{GPU}}} / "
            f"(DCGM_FI_DEV_FB_USED{{{GPU}}} + DCGM_FI_DEV_FB_FREE{{{GPU}}})",
            GPU_LEGEND,
        )
    ],
    unit="percentunit",
    minimum=0,
)
MEMORY_MIB = PanelSpec(
    "Framebuffer memory used (MiB)", [gpu_series("DCGM_FI_DEV_FB_USED")], unit="mbytes"
)
POWER = PanelSpec("Power draw", [gpu_series("DCGM_FI_DEV_POWER_USAGE")], unit="watt")
FLEET_POWER = PanelSpec(
    "Power draw per host",
    [Query(f"sum by (hostname) (DCGM_FI_DEV_POWER_USAGE{{{GPU}}})", "{{hostname}}")],
    unit="watt",
    stacked=True,
)
TEMP = PanelSpec("Temperature", [gpu_series("DCGM_FI_DEV_GPU_TEMP")], unit="celsius")
CLOCK = PanelSpec(
    "SM clock",
    [Query(f"DCGM_FI_DEV_SM_CLOCK{{{GPU}}} * 1e6", GPU_LEGEND)],
    unit="hertz",
)
THROTTLE = PanelSpec(
    "Clock event (throttle) reasons",
    [
        Query(
            f"floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS{{{GPU}}} / {bit}) % 2",
            f"{GPU_LEGEND} {name}",
        )
        for bit, name in THROTTLE_BITS
    ],
    description="1 while the reason holds. HW slowdown, HW thermal and power brake are "
    "hardware faults or a failing PSU/cooling; SW power cap at full load is normal.",
)
ECC = PanelSpec(
    "ECC errors (volatile, rate)",
    [
        gpu_rate("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "single-bit"),
        gpu_rate("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "double-bit"),
    ],
    unit="cps",
    description="Since the driver loaded. A double-bit error is uncorrectable (Xid 48).",
)
ECC_AGG = PanelSpec(
    "ECC errors (lifetime)",
    [
        gpu_series("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", f"{GPU_LEGEND} single-bit"),
        gpu_series("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", f"{GPU_LEGEND} double-bit"),
    ],
)
REMAP = PanelSpec(
    "Row remapping",
    [
        gpu_series("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", f"{GPU_LEGEND} correctable"),
        gpu_series("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", f"{GPU_LEGEND} uncorrectable"),
        gpu_series("DCGM_FI_DEV_ROW_REMAP_PENDING", f"{GPU_LEGEND} pending (reset needed)"),
        gpu_series("DCGM_FI_DEV_ROW_REMAP_FAILURE", f"{GPU_LEGEND} failed (replace)"),
    ],
    description="A pending remap needs a GPU reset; a failed one means the GPU is to be replaced.",
)
NVLINK = PanelSpec(
    "NVLink errors (rate)",
    [
        gpu_rate("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "CRC flit"),
        gpu_rate("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "replay"),
        gpu_rate("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "recovery"),
    ],
    unit="cps",
    description="Only on parts with NVLink (SXM, NVL).",
)
PCIE = PanelSpec(
    "PCIe replays (rate)",
    [gpu_rate("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "replays")],
    unit="cps",
    description="Link-level retransmissions: a bad riser, slot or cable.",
)
PCIE_LINK = PanelSpec(
    "PCIe link",
    [
        gpu_series("DCGM_FI_DEV_PCIE_LINK_GEN", f"{GPU_LEGEND} gen"),
        gpu_series("DCGM_FI_DEV_PCIE_LINK_WIDTH", f"{GPU_LEGEND} width"),
    ],
    description="A link trained below its gen or width halves the bandwidth.",
)
XIDS = PanelSpec(
    "Xid errors",
    [
        Query(
            "sum by (hostname, gpu, xid) "
            f"(increase(gpufleet_gpu_xid_errors_total{{{GPU}}}[{RATE}]))",
            "{{hostname}} GPU {{gpu}} Xid {{xid}}",
        )
    ],
    description="Xid events the agent saw (kernel log and NVML, counted once).",
)
LAST_XID = PanelSpec(
    "Last Xid",
    [gpu_series("DCGM_FI_DEV_XID_ERRORS")],
    kind="stat",
    description="The most recent Xid code per GPU (0: none).",
)

DASHBOARD = DashboardSpec(
    uid="gpufleet-gpu",
    title="gpufleet / GPUs",
    description="Per GPU, by host and UUID: load, memory, power, temperature, clocks and "
    "throttle reasons, ECC and row remapping, NVLink and PCIe errors, Xids.",
    rows=[
        ("Load", [UTIL, MEMORY, MEMORY_MIB, POWER, FLEET_POWER, TEMP]),
        ("Clocks", [CLOCK, THROTTLE]),
        ("Memory errors", [ECC, ECC_AGG, REMAP]),
        ("Interconnect", [NVLINK, PCIE, PCIE_LINK]),
        ("Xids", [XIDS, LAST_XID]),
    ],
    gpu_variable=True,
    tags=("gpu",),
)
