"""dcgmi diag JSON parser (DCGM 3.x and 4.x), on the outputs in tests/fixtures/checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.checks.dcgm import DcgmStatus, parse_dcgm_diag, parse_status
from gpufleet.checks.models import ParseError

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checks"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def dcgm4_document(*tests: object) -> dict[str, object]:
    """A DCGM 4.x document around test objects (the shape of dcgm_diag_schema.json)."""
    return {
        "DCGM Diagnostic": {
            "test_categories": [{"category": "Hardware", "tests": list(tests)}],
        },
        "entity_groups": [
            {
                "entity_group": "GPU",
                "entity_group_id": 1,
                "entities": [
                    {"entity_id": i, "device_id": "2330", "serial_num": f"16543{i}"}
                    for i in range(8)
                ],
            }
        ],
        "metadata": {"version": "4.1.1", "Driver Version Detected": "570.124.06"},
    }


def real_diagnostic_test() -> dict[str, object]:
    """The real 4.x test object from NVIDIA/DCGM#215 (fixture is the excerpt, minus its
    trailing comma)."""
    value: dict[str, object] = json.loads(
        read("dcgm4-r3-diagnostic-test-excerpt.txt").rstrip(",\n ")
    )
    return value


def test_dcgm3_real_output_with_nulls_and_junk_prefix() -> None:
    result = parse_dcgm_diag(read("dcgm3-r1-8gpu-from-dcgm-test.txt"))
    assert result.top_key == "DCGM GPU Diagnostic" and result.version == "3.1.0"
    assert result.passed and result.complete
    assert [t.name for t in result.tests][:3] == ["Denylist", "NVML Library", "CUDA Main Library"]
    assert len(result.tests) == 10  # 9 deployment tests (nulls skipped) + software
    assert result.tests[0].results[0].gpu_indices == tuple(range(8))  # "0,1,...,7"
    software = result.tests[-1]
    assert software.category == "Custom"
    assert [r.gpu_indices for r in software.results] == [(i,) for i in range(8)]  # numbers
    assert result.gpu_indices == tuple(range(8))
    assert result.tests[0].results[0].status_raw == "PASS"


def test_dcgm3_level3_virtualclient() -> None:
    result = parse_dcgm_diag(read("dcgm3-r3-1gpu-virtualclient.json"))
    assert result.passed and result.failed_tests == ()
    by_name = {t.name: t for t in result.tests}
    assert by_name["EUD Test"].status is DcgmStatus.SKIP
    assert by_name["Diagnostic"].category == "Hardware"
    assert "11103.02 gigaflops" in by_name["Diagnostic"].results[0].info[0]  # info as a string
    assert by_name["Denylist"].results[0].gpu_indices == ()  # no gpu_ids: the whole node
    assert result.gpu_indices == (0,)


def test_dcgm3_malformed_document_still_fails_its_failed_test() -> None:
    result = parse_dcgm_diag(read("dcgm3-malformed-virtualclient-variant.json"))
    assert result.failed_tests == ("CUDA Main Library",)
    (res,) = next(t for t in result.tests if t.name == "CUDA Main Library").results
    assert "libcuda.so" in res.warnings[0].message  # warnings as a plain string
    assert not result.passed


def test_dcgm4_real_gb10_persistence_mode() -> None:
    result = parse_dcgm_diag(read("dcgm4-r1-gb10-persistence-mode-fail.json"))
    assert result.top_key == "DCGM Diagnostic"
    assert (result.version, result.driver_version) == ("4.2.3", "580.82.09")
    assert result.failed_tests == ("software",) and not result.passed
    (test,) = result.tests
    assert test.summary_status is DcgmStatus.FAIL
    (res,) = test.results
    assert (res.gpu_indices, res.entity_group, res.status) == ((0,), "GPU", DcgmStatus.FAIL)
    (warning,) = res.warnings
    assert (warning.error_id, warning.error_category, warning.error_severity) == (29, 8, 5)
    assert warning.describe().endswith("(PERSISTENCE_MODE, SOFTWARE_OTHER, severity CONFIG)")
    assert result.gpu_serials == {0: "<<<NOT_SUPPORTED>>>"}


def test_dcgm4_per_gpu_failure_maps_to_the_gpu_index() -> None:
    failing = {
        "name": "memory",
        "results": [
            *({"entity_group": "GPU", "entity_group_id": 1, "entity_id": i, "status": "Pass"}
              for i in range(8) if i != 3),
            {"entity_group": "GPU", "entity_group_id": 1, "entity_id": 3, "status": "Fail",
             "warnings": [{"warning": "GPU 3 has uncorrectable memory errors and row "
                           "remappings are pending", "error_id": 85, "error_category": 10,
                           "error_severity": 6}]},
        ],
        "test_summary": {"status": "Fail"},
    }  # fmt: skip
    doc = dcgm4_document(real_diagnostic_test(), failing)
    result = parse_dcgm_diag(json.dumps(doc, indent=2))
    assert result.failed_tests == ("memory",)
    memory = result.tests[1]
    bad = [r for r in memory.results if r.status is DcgmStatus.FAIL]
    assert [r.gpu_indices for r in bad] == [(3,)]
    assert (
        bad[0]
        .warnings[0]
        .describe()
        .endswith("(PENDING_ROW_REMAP, HARDWARE_MEMORY, severity RESET)")
    )
    assert result.gpu_indices == tuple(range(8))
    assert result.gpu_serials[3] == "165433"
    diagnostic = result.tests[0]
    assert diagnostic.status is DcgmStatus.PASS
    assert diagnostic.results[0].info[2].endswith("859.08 gigaflops during this test")


def test_assembled_reference_layout() -> None:
    result = parse_dcgm_diag(read("dcgm4-r3-gpu3-row-remap-assembled-variant.json"))
    assert result.failed_tests == ("memory",)
    assert result.runtime_error == "<only present on failure to run>"
    assert not result.finished  # a runtime_error means the diagnostic did not run through


def test_iterations_layout() -> None:
    run = dcgm4_document(real_diagnostic_test())
    doc = {"iterations": [run, run], "Overall Result": "Pass"}
    result = parse_dcgm_diag(json.dumps(doc))
    assert result.iterations == 2 and [t.iteration for t in result.tests] == [0, 1]
    assert result.passed
    doc["Overall Result"] = "Fail"
    doc["Warning"] = "Diagnostic failed on iteration 2"
    failed = parse_dcgm_diag(json.dumps(doc))
    assert not failed.passed
    assert failed.errors == ("Overall Result: Fail", "Diagnostic failed on iteration 2")


def test_truncated_document_is_incomplete_not_garbage() -> None:
    result = parse_dcgm_diag(read("dcgm4-r1-truncated-variant.json"))
    assert not result.complete and not result.finished and not result.passed
    assert result.top_key == "DCGM Diagnostic"


def test_dcgmi_error_text_is_an_error_result() -> None:
    result = parse_dcgm_diag(read("dcgm-hostengine-error-variant.txt"))
    assert result.tests == () and not result.passed
    assert result.errors == (
        "Error: unable to establish a connection to the specified host: localhost",
    )


def test_runtime_error_json() -> None:
    doc = {"DCGM Diagnostic": {"runtime_error": "Unable to get GPU list: host engine is busy"},
           "metadata": {"version": "4.2.3"}}  # fmt: skip
    result = parse_dcgm_diag("Successfully ran diagnostic for group.\n" + json.dumps(doc))
    assert result.runtime_error == "Unable to get GPU list: host engine is busy"
    assert not result.passed and result.version == "4.2.3"


def test_hoisted_tests_and_lowercase_statuses() -> None:
    doc = {"tests": [{"name": "memory", "results": [
        {"entity_group": "GPU", "entity_id": 0, "status": "pass"},
        {"entity_group": "GPU", "entity_id": 1, "status": "fail",
         "warnings": [{"warning": "Uncorrectable ECC error detected on GPU 1"}]}]}]}  # fmt: skip
    result = parse_dcgm_diag(json.dumps(doc))
    assert result.failed_tests == ("memory",)
    assert result.tests[0].results[1].gpu_indices == (1,)


def test_unknown_status_never_passes() -> None:
    doc = dcgm4_document({"name": "pcie", "results": [
        {"entity_group": "GPU", "entity_id": 0, "status": "Inconclusive"}]})  # fmt: skip
    result = parse_dcgm_diag(json.dumps(doc))
    assert result.tests[0].status is DcgmStatus.UNKNOWN
    assert result.failed_tests == ("pcie",) and not result.passed


@pytest.mark.parametrize(
    ("word", "status"),
    [("PASS", DcgmStatus.PASS), ("Pass", DcgmStatus.PASS), ("FAIL", DcgmStatus.FAIL),
     ("Warn", DcgmStatus.WARN), ("SKIPPED", DcgmStatus.SKIP), ("Not Run", DcgmStatus.NOT_RUN),
     ("", DcgmStatus.UNKNOWN), ("aborted", DcgmStatus.UNKNOWN), (None, DcgmStatus.UNKNOWN)],
)  # fmt: skip
def test_status_words(word: object, status: DcgmStatus) -> None:
    assert parse_status(word) is status


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no dcgmi diag JSON"),
        ("garbage\n", "no dcgmi diag JSON"),
        ('{"hello": "world"}', "not a dcgmi diag document"),
        ("[1, 2, 3]", "not a dcgmi diag document"),
    ],
)
def test_not_dcgm_output_raises(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_dcgm_diag(text)


def test_text_output_and_bare_test_object_are_refused() -> None:
    with pytest.raises(ParseError, match="run dcgmi diag with -j"):
        parse_dcgm_diag(read("dcgm-text-output-excerpt.txt"))
    with pytest.raises(ParseError, match="not a dcgmi diag document"):
        parse_dcgm_diag(read("dcgm4-r3-diagnostic-test-excerpt.txt"))


def test_malformed_document_is_refused_not_read_from_the_middle() -> None:
    # A syntax error inside a real document: reading on from an inner "{" would find
    # passing tests; the parser refuses the whole document instead.
    text = read("dcgm3-r3-1gpu-virtualclient.json").replace(
        '"Persistence Mode",', '"Persistence Mode"'
    )
    with pytest.raises(ParseError, match="malformed dcgmi diag JSON"):
        parse_dcgm_diag(text)
