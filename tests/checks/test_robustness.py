"""Outputs nobody recorded yet: reformatted, noisy, cut anywhere, or garbage.

Two kinds of test. Variants of the real captures (extra whitespace, extra columns, CRLF,
launcher prefixes, extra header lines, unknown JSON keys) must parse to the same figures.
Property tests (hypothesis) check that a parser raises nothing but ``ParseError``, that
``check_output`` never raises and never passes random text, and that a real capture cut
anywhere before its final summary never passes.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpufleet.checks.dcgm import parse_dcgm_diag
from gpufleet.checks.evaluate import check_output, parse_output
from gpufleet.checks.gpuburn import parse_gpu_burn
from gpufleet.checks.models import CheckKind, ParseError
from gpufleet.checks.nccl import parse_nccl
from gpufleet.checks.perftest import parse_ib_write_bw
from gpufleet.checks.report import result_dict

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"
# database=None: nothing saved between runs on the shared tree; a failure prints its example.
FUZZ = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def read(name: str) -> str:
    with (FIXTURES / name).open(newline="") as f:
        return f.read()


# Real captures, each with the offset of its last essential line: cut before that line
# and the run did not finish. (Cut inside that very line, e.g. in the middle of the
# "Avg bus bandwidth" figure, and no parser can tell; the run's exit code can. For the
# two-run file the line is the first run's footer: a file cut cleanly after a complete
# run reads as a one-run file; cuts inside the second run are tested below.)
REAL = {
    "nccl-allreduce-h100-8gpu-reference.txt": (CheckKind.NCCL, "# Avg bus bandwidth"),
    "nccl-allreduce-a100-8gpu-mpirun.txt": (CheckKind.NCCL, "# Avg bus bandwidth"),
    "nccl-h100-2node-alltoall-sendrecv.txt": (CheckKind.NCCL, "# Avg bus bandwidth    : 72.4265"),
    "ib-write-bw-mbsec-all-sizes-numa-bound.txt": (CheckKind.IB_WRITE_BW, "LAST_DASHES"),
    "ib-write-bw-roce100g-gbits-dc-client.txt": (CheckKind.IB_WRITE_BW, "LAST_DASHES"),
    "gpu-burn-rtx-a400-ok.txt": (CheckKind.GPU_BURN, "GPU 0: OK"),
    "gpu-burn-b300-7gpu-idle-reported-ok.txt": (CheckKind.GPU_BURN, "GPU 6: OK"),
    "dcgm3-r3-1gpu-virtualclient.json": (CheckKind.DCGM_DIAG, "LAST_BRACE"),
    "dcgm3-r1-8gpu-from-dcgm-test.txt": (CheckKind.DCGM_DIAG, "LAST_BRACE"),
}


def test_a_second_run_cut_short_fails_the_file() -> None:
    text = read("nccl-h100-2node-alltoall-sendrecv.txt")
    line = "# Collective test starting: sendrecv_perf\n"
    start = text.index(line) + len(line)  # the second run has announced itself
    end = text.index("# Avg bus bandwidth    : 28.6299")
    for cut in range(start, end, 5):
        assert not check_output(CheckKind.NCCL, text[:cut]).passed, cut


def essential_offset(text: str, marker: str) -> int:
    if marker == "LAST_DASHES":
        return text.rstrip().rfind("\n") + 1
    if marker == "LAST_BRACE":
        return text.rfind("}")
    return text.rfind(marker)


def figures(kind: CheckKind, text: str) -> tuple[object, ...]:
    parsed = parse_output(kind, text)
    return (
        getattr(parsed, "passed", None),
        getattr(parsed, "avg_busbw", None),
        getattr(parsed, "gpus", None) if kind is CheckKind.NCCL else None,
        getattr(parsed, "wrong", None),
        getattr(parsed, "bw_avg_gbits", None),
        getattr(parsed, "msg_bytes", None),
        getattr(parsed, "failed_tests", None),
        getattr(parsed, "faulty", None),
    )


# --- variants of real captures -------------------------------------------------------


def crlf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\n", "\r\n")


def extra_whitespace(text: str) -> str:
    lines = []
    for line in text.split("\n"):
        tokens = line.split(" ")
        lines.append("\t " + "  \t".join(tokens) + "   ")  # tabs among the spaces
        lines.append("")
    return "\n".join(lines)


def mpi_prefix(text: str) -> str:
    return "".join("[1,0]<stdout>:" + line for line in text.splitlines(keepends=True))


NOISE = (
    "node7:1623025:1623025 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>\n"
    "NCCL version 2.21.5+cuda12.4\n"
    "Authorization required, but no authorization protocol specified\n"
    "WARNING: Conflicting CPU frequency values detected\n"
    "# some header line from a newer version: key=value\n"
)


def extra_lines(text: str) -> str:
    lines = text.splitlines(keepends=True)
    out = [NOISE]
    for i, line in enumerate(lines):
        out.append(line)
        if i % 7 == 3 and not line.lstrip().startswith(("{", "}", '"', "[", "]")):
            out.append(NOISE.splitlines(keepends=True)[i % 4])
    return "".join(out)


@pytest.mark.parametrize("name", [n for n, (k, _) in REAL.items() if k is not CheckKind.DCGM_DIAG])
@pytest.mark.parametrize("variant", [crlf, extra_whitespace, mpi_prefix, extra_lines])
def test_text_variants_parse_to_the_same_figures(name: str, variant: object) -> None:
    kind = REAL[name][0]
    text = read(name)
    assert callable(variant)
    assert figures(kind, variant(text)) == figures(kind, text)


def byte_order_mark(text: str) -> str:
    return "\ufeff" + text  # saved by a Windows editor


def no_final_newline(text: str) -> str:
    return text.rstrip("\r\n")


def non_breaking_spaces(text: str) -> str:
    return text.replace("  ", "\u00a0 ")  # copied from a web page


@pytest.mark.parametrize("name", list(REAL))
@pytest.mark.parametrize("variant", [byte_order_mark, no_final_newline, non_breaking_spaces])
def test_pasted_and_saved_variants_parse_to_the_same_figures(name: str, variant: object) -> None:
    kind = REAL[name][0]
    text = read(name)
    assert callable(variant)
    assert figures(kind, variant(crlf(text))) == figures(kind, text)
    assert figures(kind, variant(text)) == figures(kind, text)


def test_extra_columns_after_the_known_ones() -> None:
    text = read("nccl-allreduce-h100-8gpu-reference.txt")
    rccl = re.sub(r"(?m)^(\s+\d+\s+\d+\s+float.*)$", r"\1    RING    SIMPLE          32", text)
    rccl = rccl.replace("busbw #wrong\n", "busbw #wrong  algo  proto  nchannels\n")
    assert figures(CheckKind.NCCL, rccl) == figures(CheckKind.NCCL, text)
    ib = read("ib-write-bw-roce100g-gbits-dc-client.txt")
    wider = re.sub(r"(?m)^( \d+\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+)$", r"\1   0.00   12", ib)
    assert figures(CheckKind.IB_WRITE_BW, wider) == figures(CheckKind.IB_WRITE_BW, ib)
    burn = read("gpu-burn-rtx-a400-ok.txt")
    powered = re.sub(r"(temps: \d+ C)", r"\1   power: 690 W", burn)
    assert figures(CheckKind.GPU_BURN, powered) == figures(CheckKind.GPU_BURN, burn)


def _add_unknown_keys(value: object, rng: random.Random) -> object:
    if isinstance(value, dict):
        out = {k: _add_unknown_keys(v, rng) for k, v in value.items()}
        out[f"x_future_{rng.randrange(1000)}"] = {"nested": [1, "two", None]}
        items = list(out.items())
        rng.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        return [_add_unknown_keys(v, rng) for v in value]
    return value


@pytest.mark.parametrize(
    "name", ["dcgm3-r3-1gpu-virtualclient.json", "dcgm4-r1-gb10-persistence-mode-fail.json"]
)
@pytest.mark.parametrize("seed", range(5))
def test_unknown_json_keys_and_key_order(name: str, seed: int) -> None:
    text = read(name)
    doc = json.loads(text)
    rng = random.Random(seed)
    for dumped in (
        json.dumps(_add_unknown_keys(doc, rng)),
        json.dumps(_add_unknown_keys(doc, rng), indent=4),
        "Successfully ran diagnostic for group.\n" + crlf(json.dumps(doc, indent=1)) + "\n\n",
    ):
        assert figures(CheckKind.DCGM_DIAG, dumped) == figures(CheckKind.DCGM_DIAG, text)
        original, changed = parse_dcgm_diag(text), parse_dcgm_diag(dumped)
        assert [t.name for t in changed.tests] == [t.name for t in original.tests]
        assert changed.gpu_indices == original.gpu_indices


# --- properties ----------------------------------------------------------------------

PARSERS = (parse_nccl, parse_ib_write_bw, parse_gpu_burn, parse_dcgm_diag)
REAL_LINES = sorted(
    {line for n in REAL for line in read(n).splitlines() if line.strip()}
    | {line for p in FIXTURES.glob("*variant*") for line in read(p.name).splitlines()}
)


@FUZZ
@given(st.text(max_size=2000))
def test_random_text_raises_only_parse_error_and_never_passes(text: str) -> None:
    for parser in PARSERS:
        with contextlib.suppress(ParseError):
            parser(text)
    for kind in CheckKind:
        result = check_output(kind, text)
        assert not result.passed
        json.dumps(result_dict(result))


@FUZZ
@given(st.lists(st.sampled_from(REAL_LINES), max_size=80), st.sampled_from(list(CheckKind)))
def test_shuffled_real_lines_never_crash_a_parser(lines: list[str], kind: CheckKind) -> None:
    text = "\n".join(lines)
    with contextlib.suppress(ParseError):
        parse_output(kind, text)
    json.dumps(result_dict(check_output(kind, text)))


@FUZZ
@given(st.sampled_from(sorted(REAL)), st.floats(min_value=0.0, max_value=1.0))
def test_real_output_cut_before_its_summary_never_passes(name: str, where: float) -> None:
    kind, marker = REAL[name]
    text = read(name)
    assert check_output(kind, text).passed or name.startswith("gpu-burn-b300")
    cut = text[: int(essential_offset(text, marker) * where)]
    assert not check_output(kind, cut).passed


@FUZZ
@given(
    st.sampled_from(sorted(REAL)),
    st.integers(min_value=0, max_value=10_000),
    st.sampled_from(["\x00", "\ufffd", "}", "{", "#", "|", "-", "\r", "\t", "9" * 30]),
)
def test_injected_bytes_never_crash(name: str, at: int, junk: str) -> None:
    kind = REAL[name][0]
    text = read(name)
    at %= len(text) + 1
    mutated = text[:at] + junk + text[at:]
    json.dumps(result_dict(check_output(kind, mutated)))
