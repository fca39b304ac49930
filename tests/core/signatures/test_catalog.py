"""The packaged catalog loads, every entry is valid, and it covers the reference."""

from __future__ import annotations

import re
import tomllib
from importlib import resources
from pathlib import Path

import pytest

from gpufleet.core.enums import FindingSource
from gpufleet.core.signatures.catalog import (
    CatalogError,
    get_catalog,
    get_signature,
    get_signature_for_xid,
    load_catalog,
)
from gpufleet.core.signatures.models import (
    CheckRule,
    KernelLogRule,
    MetricRule,
    StackRule,
    StateRule,
)

REFERENCE = Path(__file__).parents[4] / "shared" / "reference" / "failure-signatures.md"
if not REFERENCE.exists():  # the shared checkout sits next to the repo, or at /work/shared
    REFERENCE = Path("/work/shared/reference/failure-signatures.md")

# Xid rows of the reference's main table (§1.3) and the Xids its "rows not shown" list
# names, copied here so the test does not depend on the shared checkout being present.
REFERENCE_TABLE_XIDS = {
    8,
    13,
    31,
    32,
    38,
    43,
    45,
    46,
    48,
    54,
    56,
    57,
    58,
    61,
    62,
    63,
    64,
    68,
    69,
    74,
    79,
    92,
    94,
    95,
    109,
    110,
    119,
    120,
    121,
    136,
    137,
    140,
    143,
    144,
    145,
    146,
    147,
    148,
    149,
    150,
    151,
    154,
    155,
    156,
    157,
    158,
    159,
    160,
    161,
    162,
    163,
    164,
    165,
    166,
    167,
    168,
    169,
    170,
    171,
    172,
}


def test_catalog_loads_and_is_not_trivial() -> None:
    catalog = get_catalog()
    assert catalog is get_catalog()  # loaded once
    assert len(catalog.signatures) > 100
    for source in (
        FindingSource.KERNEL_LOG,
        FindingSource.NVML,
        FindingSource.INFINIBAND,
        FindingSource.SCHEDULER,
        FindingSource.AGENT,
    ):
        assert catalog.by_source(source), source


def test_ids_are_unique() -> None:
    ids = [s.id for s in get_catalog().signatures]
    assert len(ids) == len(set(ids))


def test_every_xid_of_the_reference_table_has_its_own_entry() -> None:
    for xid in REFERENCE_TABLE_XIDS:
        sig = get_signature_for_xid(xid)
        assert sig is not None, xid
        assert sig.id == f"xid-{xid}"
        assert sig.nvidia is not None


def test_every_xid_from_1_to_172_is_covered() -> None:
    missing = [x for x in range(1, 173) if get_signature_for_xid(x) is None]
    assert missing == []


@pytest.mark.skipif(not REFERENCE.exists(), reason="shared/reference not checked out")
def test_nvidia_buckets_match_the_reference_table() -> None:
    rows = re.findall(
        r"^\| (\d+) \| ([A-Z0-9_ /]+?) \| [^|]* \| ([^|]*?) \| ([^|]*?) \|",
        REFERENCE.read_text(encoding="utf-8"),
        flags=re.M,
    )
    assert len(rows) >= len(REFERENCE_TABLE_XIDS)
    for xid, _mnemonic, immediate, investigatory in rows:
        sig = get_signature_for_xid(int(xid))
        assert sig is not None and sig.nvidia is not None, xid
        expected = "" if immediate == "(blank)" else immediate
        assert sig.nvidia.immediate == expected, xid
        if investigatory != "(blank)" and "Solo" not in investigatory:
            assert sig.nvidia.investigatory == investigatory, xid


def test_required_signatures_exist() -> None:
    for sig_id in (
        "xid-79",
        "xid-48",
        "gpu-fallen-off-bus",
        "gpu-fallen-off-bus-probe",
        "thermal-slowdown",
        "hw-slowdown",
        "power-brake",
        "ecc-dbe",
        "ecc-sbe-rate",
        "row-remap-pending",
        "row-remap-failure",
        "pcie-replay-rate",
        "nvlink-error-counters",
        "ib-link-down",
        "ib-link-flap",
        "ib-rate-downgrade",
        "ib-symbol-error-rate",
        "gpu-missing",
        "slurm-foreign-drain",
        "slurm-foreign-down",
        "nvml-init-failed",
        "sxid-fatal",
    ):
        assert get_signature(sig_id) is not None, sig_id


def test_rules_fit_their_source() -> None:
    for sig in get_catalog().signatures:
        if sig.source is FindingSource.KERNEL_LOG:
            assert isinstance(sig.match, KernelLogRule)
        elif sig.source in (FindingSource.SCHEDULER, FindingSource.AGENT):
            assert isinstance(sig.match, StateRule)
        elif sig.source is FindingSource.ACTIVE_CHECK:
            assert isinstance(sig.match, CheckRule)
        elif sig.source is FindingSource.STACK:
            assert isinstance(sig.match, StackRule)
        else:
            assert isinstance(sig.match, MetricRule | StateRule)


def test_the_packaged_file_is_plain_toml() -> None:
    text = resources.files("gpufleet.core.signatures").joinpath("catalog.toml").read_text()
    assert tomllib.loads(text)["version"]


def _minimal(**entry: object) -> str:
    base = {
        "id": "x-1",
        "title": "Test entry",
        "category": "driver",
        "severity": "warning",
        "source": "kernel-log",
        "action": "reboot",
        "reference": "test",
        "match": '{ pattern = "NVRM: boom", prefilter = ["NVRM"] }',
    }
    base.update(entry)
    body = "\n".join(
        f"{k} = {v}" if k == "match" or str(v).startswith("{") else f'{k} = "{v}"'
        for k, v in base.items()
    )
    return f'version = "t"\n[[signatures]]\n{body}\n'


def test_a_minimal_catalog_loads() -> None:
    assert load_catalog(_minimal()).signatures[0].id == "x-1"


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"severity": "bad"}, "severity"),
        ({"action": "explode"}, "action"),
        ({"id": "Bad Id"}, "id"),
        ({"match": '{ pattern = "NVRM: (", prefilter = ["NVRM"] }'}, "invalid regex"),
        ({"match": '{ pattern = "x", prefilter = [] }'}, "prefilter"),
        (
            {
                "match": '{ kind = "metric", field = "gpu_tempp", op = ">", value = 1 }',
                "source": "nvml",
            },
            "unknown metric field",
        ),
        (
            {"match": '{ kind = "state", condition = "moon_phase" }', "source": "agent"},
            "unknown condition",
        ),
        (
            {"escalation": '{ repeat = 2, within_s = 60, then = "restart_workload" }'},
            "more drastic",
        ),
        ({"source": "nvml"}, "kernel-log"),
    ],
)
def test_bad_entries_are_rejected_with_a_message_naming_them(
    change: dict[str, str], needle: str
) -> None:
    with pytest.raises(CatalogError) as err:
        load_catalog(_minimal(**change), origin="test.toml")
    text = str(err.value)
    assert "test.toml" in text
    assert "x-1" in text or "Bad Id" in text
    assert needle in text


def test_duplicate_ids_and_codes_are_rejected() -> None:
    entry = _minimal().split("\n", 1)[1]
    with pytest.raises(CatalogError, match="duplicate signature id"):
        load_catalog('version = "t"\n' + entry + entry)
    xid = _minimal(match='{ pattern = "Xid (?P<xid>\\\\d+)", prefilter = ["Xid"], codes = [1] }')
    second = xid.split("\n", 1)[1].replace('"x-1"', '"x-2"')
    with pytest.raises(CatalogError, match="already claimed"):
        load_catalog(xid + second)


def test_not_toml_is_rejected() -> None:
    with pytest.raises(CatalogError, match="not valid TOML"):
        load_catalog("version = ")
