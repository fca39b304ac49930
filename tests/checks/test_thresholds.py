"""The thresholds shipped as package data: valid, complete, and the look-ups people type."""

from __future__ import annotations

import pytest

from gpufleet.checks.thresholds import (
    ThresholdsError,
    UnknownName,
    get_thresholds,
    load_thresholds,
)
from gpufleet.core.gpu_models import GPU_MODELS


def test_every_core_gpu_model_has_single_node_nccl_limits() -> None:
    table = get_thresholds()
    assert set(table.gpu_models) == set(GPU_MODELS)
    for name in GPU_MODELS:
        limit = table.nccl_single_node(name)
        assert 0 < limit.fail_below <= limit.warn_below
        assert limit.expected is not None and limit.expected > limit.warn_below
        assert limit.source


def test_reference_figures_for_h100_and_fabrics() -> None:
    table = get_thresholds()
    h100 = table.nccl_single_node("NVIDIA H100 80GB HBM3")
    assert (h100.warn_below, h100.fail_below) == (430.0, 380.0)  # §4.1 proposal
    ndr, hdr = table.fabrics["NDR"], table.fabrics["HDR"]
    assert (ndr.line_rate_gbits, hdr.line_rate_gbits) == (400.0, 200.0)
    # §4.2 proposal: pass >= 0.9 × line rate, fail < 0.8 ×.
    for fabric in (ndr, hdr, table.fabrics["EDR"]):
        assert fabric.ib_write_bw.warn_below == pytest.approx(0.9 * fabric.line_rate_gbits)
        assert fabric.ib_write_bw.fail_below == pytest.approx(0.8 * fabric.line_rate_gbits)
    multi = table.nccl_multi_node("NDR")
    assert (multi.warn_below, multi.fail_below) == (340.0, 300.0)


def test_multi_node_limit_scales_with_nics() -> None:
    table = get_thresholds()
    four = table.nccl_multi_node("NDR", nics_per_node=4)
    assert (four.warn_below, four.fail_below) == (170.0, 150.0)
    assert table.nccl_multi_node("NDR", nics_per_node=8) == table.nccl_multi_node("NDR")


@pytest.mark.parametrize(
    ("typed", "name"),
    [("H100", "NVIDIA H100 80GB HBM3"), ("nvidia h200", "NVIDIA H200"),
     ("a100", "NVIDIA A100-SXM4-80GB"), ("B200", "NVIDIA B200"),
     ("NVIDIA  H100 80GB HBM3", "NVIDIA H100 80GB HBM3")],
)  # fmt: skip
def test_gpu_model_names_resolve(typed: str, name: str) -> None:
    assert get_thresholds().resolve_gpu_model(typed) == name


def test_unknown_and_ambiguous_names() -> None:
    table = get_thresholds()
    with pytest.raises(UnknownName, match="unknown GPU model 'V100'; known: NVIDIA H100"):
        table.resolve_gpu_model("V100")
    with pytest.raises(UnknownName, match="ambiguous"):
        table.resolve_gpu_model("NVIDIA")
    assert table.resolve_fabric("ndr") == "NDR"
    with pytest.raises(UnknownName, match="unknown fabric 'XDR'"):
        table.resolve_fabric("XDR")


def test_bad_data_is_refused_with_the_field_named() -> None:
    good = (
        'version = 1\n[gpu_burn]\nslow_gpu_below_median_pct = 15.0\nsource = "x"\n[fabrics]\n'
        "[gpu_models]\n"
    )
    bad_order = good + (
        '[gpu_models."NVIDIA H200".nccl_all_reduce_single_node]\n'
        'warn_below = 100.0\nfail_below = 200.0\nsource = "x"\n'
    )
    with pytest.raises(ThresholdsError, match=r"fail_below 200\.0 is above warn_below 100\.0"):
        load_thresholds(bad_order)
    unknown_model = good + (
        '[gpu_models."Tesla V100".nccl_all_reduce_single_node]\n'
        'warn_below = 1.0\nfail_below = 1.0\nsource = "x"\n'
    )
    with pytest.raises(ThresholdsError, match=r"not in core/gpu_models\.py"):
        load_thresholds(unknown_model)
    with pytest.raises(ThresholdsError, match="not valid TOML"):
        load_thresholds("version = ")
    assert load_thresholds(good).fabrics == {}
