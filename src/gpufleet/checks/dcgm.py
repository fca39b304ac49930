"""Pure parser for ``dcgmi diag -r 1..4 -j`` (DCGM 3.x and 4.x JSON).

Layouts (``shared/reference/failure-signatures.md`` §3.3; DCGM ``dcgm_diag_schema.json``,
``NvvsJsonStrings.h``):

* DCGM 4.x: ``{"DCGM Diagnostic": {"test_categories": [{"category", "tests": [{"name",
  "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 3, "status",
  "warnings": [{"warning", "error_id", "error_category", "error_severity"}], "info": [..]}],
  "test_summary": {"status"}}]}], "runtime_error"?}, "entity_groups": [..],
  "metadata": {"version", "Driver Version Detected"}}``.
* DCGM 3.x: ``{"DCGM GPU Diagnostic": {"test_categories": [.. "results": [{"gpu_ids":
  "0,1,2" | 3, "status": "PASS", "warnings": [..] | "..", "info": ".." | [..]}] ..],
  "version": "3.1.0"}}``; the test list may hold ``null`` entries (seen in real output).
* ``--iterations N``: ``{"iterations": [<one of the above> ...], "Overall Result": ..}``.

Statuses are matched case-insensitively (``PASS``/``Pass``); a word this parser does not
know is ``UNKNOWN`` and never counts as a pass. Text before the JSON (``Successfully ran
diagnostic for group.``, ``WARNING: ...``) is skipped; ``Error: ...`` lines are kept as
errors. A document cut off before its end is a run that did not finish, not a parse
error, so the verdict says "did not finish".
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpufleet.checks._text import split_lines
from gpufleet.checks.dcgm_codes import CATEGORY_NAMES, FR_NAMES, SEVERITY_NAMES
from gpufleet.checks.models import ParseError

DIAG_KEYS = ("DCGM Diagnostic", "DCGM GPU Diagnostic")  # 4.x, 3.x
_MAX_DOCUMENT_TRIES = 64  # '{' positions tried before giving up on a garbage file
_ERROR_LINE = re.compile(r"^\s*(?:Error|ERROR)\b[:\s]")
_TEXT_TABLE = re.compile(r"^\s*[|+][-=+|]*\s*(?:Deployment|Integration|Hardware|Stress|"
                         r"Diagnostic|Performance|Metadata)\b", re.M)  # fmt: skip


class DcgmStatus(StrEnum):
    PASS = "pass"  # noqa: S105 (a status, not a password)
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"
    NOT_RUN = "not-run"
    UNKNOWN = "unknown"  # a word DCGM never used: not a pass


_STATUS_WORDS = {
    "pass": DcgmStatus.PASS, "passed": DcgmStatus.PASS,
    "fail": DcgmStatus.FAIL, "failed": DcgmStatus.FAIL, "error": DcgmStatus.FAIL,
    "warn": DcgmStatus.WARN, "warning": DcgmStatus.WARN,
    "skip": DcgmStatus.SKIP, "skipped": DcgmStatus.SKIP, "not applicable": DcgmStatus.SKIP,
    "not run": DcgmStatus.NOT_RUN, "notrun": DcgmStatus.NOT_RUN, "not_run": DcgmStatus.NOT_RUN,
}  # fmt: skip
# Worst first: how one test's per-GPU statuses fold into the test's status.
_SEVERITY_ORDER = (DcgmStatus.FAIL, DcgmStatus.UNKNOWN, DcgmStatus.WARN, DcgmStatus.NOT_RUN,
                   DcgmStatus.SKIP, DcgmStatus.PASS)  # fmt: skip


def parse_status(raw: object) -> DcgmStatus:
    if not isinstance(raw, str):
        return DcgmStatus.UNKNOWN
    return _STATUS_WORDS.get(" ".join(raw.lower().split()), DcgmStatus.UNKNOWN)


def worst_status(statuses: list[DcgmStatus]) -> DcgmStatus | None:
    for status in _SEVERITY_ORDER:
        if status in statuses:
            return status
    return None


@dataclass(frozen=True, slots=True)
class DcgmWarning:
    message: str
    error_id: int | None = None  # DCGM_FR_* code
    error_category: int | None = None  # DCGM_FR_EC_*
    error_severity: int | None = None  # DCGM_ERROR_*

    def describe(self) -> str:
        """``message`` plus the codes by name, e.g. ``(PENDING_ROW_REMAP, HARDWARE_MEMORY,
        severity RESET)``."""
        parts = []
        if self.error_id is not None:
            parts.append(FR_NAMES.get(self.error_id, f"error {self.error_id}"))
        if self.error_category is not None:
            parts.append(CATEGORY_NAMES.get(self.error_category, f"category {self.error_category}"))
        if self.error_severity is not None:
            name = SEVERITY_NAMES.get(self.error_severity, str(self.error_severity))
            parts.append(f"severity {name}")
        return f"{self.message} ({', '.join(parts)})" if parts else self.message


@dataclass(frozen=True, slots=True)
class DcgmEntityResult:
    """One test's result for one entity (4.x), or for a list of GPUs (3.x ``gpu_ids``)."""

    status: DcgmStatus
    status_raw: str
    gpu_indices: tuple[int, ...]  # empty: the result is for the node, not named GPUs
    entity_group: str | None = None  # "GPU", "CPU", ... (4.x)
    warnings: tuple[DcgmWarning, ...] = ()
    info: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class DcgmTest:
    name: str
    category: str | None
    results: tuple[DcgmEntityResult, ...]
    summary_status: DcgmStatus | None = None  # 4.x test_summary
    iteration: int | None = None  # with --iterations

    @property
    def status(self) -> DcgmStatus:
        statuses = [r.status for r in self.results]
        if self.summary_status is not None:
            statuses.append(self.summary_status)
        return worst_status(statuses) or DcgmStatus.UNKNOWN


@dataclass(frozen=True, slots=True)
class DcgmDiagResult:
    top_key: str | None  # "DCGM Diagnostic" (4.x) or "DCGM GPU Diagnostic" (3.x)
    version: str | None
    driver_version: str | None
    tests: tuple[DcgmTest, ...]
    complete: bool  # False: the JSON document was cut off, or never came
    runtime_error: str | None = None
    errors: tuple[str, ...] = ()  # "Error: ..." lines, a failed "Overall Result", ...
    iterations: int | None = None
    gpu_serials: Mapping[int, str] = field(default_factory=dict)
    truncated: bool = False  # a document began but was cut off (dcgmi killed mid-write)

    @property
    def finished(self) -> bool:
        return self.complete and self.runtime_error is None and not self.errors and bool(self.tests)

    @property
    def failed_tests(self) -> tuple[str, ...]:
        """Names of tests that failed (or reported a status DCGM never uses)."""
        names = (t.name for t in self.tests if t.status in (DcgmStatus.FAIL, DcgmStatus.UNKNOWN))
        return tuple(dict.fromkeys(names))

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        seen = {i for t in self.tests for r in t.results for i in r.gpu_indices}
        return tuple(sorted(seen | set(self.gpu_serials)))

    @property
    def passed(self) -> bool:
        """Finished and no test failed; warnings, skips and not-run tests do not fail."""
        return self.finished and not self.failed_tests


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _strings(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list):
        return tuple(v for v in value if isinstance(v, str) and v)
    return ()


def _warnings(value: object) -> tuple[DcgmWarning, ...]:
    items = value if isinstance(value, list) else [value]
    found: list[DcgmWarning] = []
    for item in items:
        if isinstance(item, str) and item:
            found.append(DcgmWarning(item))
        elif isinstance(item, dict):
            message = _text(item.get("warning")) or _text(item.get("message")) or ""
            found.append(
                DcgmWarning(
                    message=message or json.dumps(item, ensure_ascii=False)[:500],
                    error_id=_int(item.get("error_id")),
                    error_category=_int(item.get("error_category")),
                    error_severity=_int(item.get("error_severity")),
                )
            )
    return tuple(found)


def _gpu_indices(result: Mapping[str, object]) -> tuple[tuple[int, ...], str | None]:
    group = _text(result.get("entity_group"))
    if "entity_id" in result:
        entity = _int(result.get("entity_id"))
        is_gpu = group == "GPU" or (
            group is None and _int(result.get("entity_group_id")) in (1, None)
        )
        return ((entity,) if is_gpu and entity is not None else ()), group
    for key in ("gpu_ids", "gpu_id"):
        value = result.get(key)
        if isinstance(value, str):
            return tuple(i for part in value.split(",") if (i := _int(part)) is not None), "GPU"
        if (single := _int(value)) is not None:
            return (single,), "GPU"
    return (), group


def _result(value: object) -> DcgmEntityResult | None:
    if not isinstance(value, dict):
        return None
    raw = value.get("status")
    gpus, group = _gpu_indices(value)
    return DcgmEntityResult(
        status=parse_status(raw),
        status_raw=raw if isinstance(raw, str) else json.dumps(raw),
        gpu_indices=gpus,
        entity_group=group,
        warnings=_warnings(value.get("warnings", [])) + _warnings(value.get("errors", [])),
        info=_strings(value.get("info")),
    )


def _test(value: object, category: str | None, iteration: int | None) -> DcgmTest | None:
    if not isinstance(value, dict):
        return None  # 3.x writes null entries into the test list
    name = _text(value.get("name")) or _text(value.get("test_name")) or "unnamed test"
    results = value.get("results")
    summary = value.get("test_summary")
    summary_status = parse_status(summary.get("status")) if isinstance(summary, dict) else None
    return DcgmTest(
        name=name,
        category=category,
        results=tuple(
            r for v in (results if isinstance(results, list) else []) if (r := _result(v))
        ),
        summary_status=summary_status,
        iteration=iteration,
    )


@dataclass(slots=True)
class _Doc:
    top_key: str | None = None
    version: str | None = None
    driver: str | None = None
    tests: list[DcgmTest] = field(default_factory=list)
    runtime_error: str | None = None
    errors: list[str] = field(default_factory=list)
    serials: dict[int, str] = field(default_factory=dict)


def _read_root(doc: dict[str, object], out: _Doc, iteration: int | None) -> bool:
    """Collect one (non-iterations) document into ``out``; False when it is not one."""
    top_key = next((k for k in DIAG_KEYS if k in doc), None)
    body: object = doc[top_key] if top_key else doc
    if isinstance(body, list):  # categories straight under the top key
        body = {"test_categories": body}
    if not isinstance(body, dict):
        return False
    categories = body.get("test_categories")
    hoisted = body.get("tests")
    if top_key is None and not isinstance(categories, list) and not isinstance(hoisted, list):
        return False
    out.top_key = out.top_key or top_key
    for cat in categories if isinstance(categories, list) else []:
        if isinstance(cat, dict):
            name = _text(cat.get("category"))
            tests = cat.get("tests")
            for t in tests if isinstance(tests, list) else []:
                if (test := _test(t, name, iteration)) is not None:
                    out.tests.append(test)
    for t in hoisted if isinstance(hoisted, list) else []:
        if (test := _test(t, None, iteration)) is not None:
            out.tests.append(test)
    metadata = doc.get("metadata")
    meta = metadata if isinstance(metadata, dict) else {}
    for source in (meta, body, doc):
        out.version = out.version or _text(source.get("version"))
        out.driver = (
            out.driver
            or _text(source.get("Driver Version Detected"))
            or _text(source.get("driver_version_detected"))
        )
    for source in (body, doc):
        if (err := _text(source.get("runtime_error"))) is not None and err.strip():
            out.runtime_error = err.strip()
        if (warn := _text(source.get("Warning"))) is not None and warn.strip():
            out.errors.append(warn.strip())
    groups = doc.get("entity_groups")
    for group in groups if isinstance(groups, list) else []:
        if isinstance(group, dict) and group.get("entity_group") == "GPU":
            entities = group.get("entities")
            for e in entities if isinstance(entities, list) else []:
                if isinstance(e, dict) and (i := _int(e.get("entity_id"))) is not None:
                    out.serials[i] = _text(e.get("serial_num")) or ""
    return True


def _is_diag(value: object) -> bool:
    if not isinstance(value, dict):
        return False
    if isinstance(value.get("iterations"), list) or any(k in value for k in DIAG_KEYS):
        return True
    return isinstance(value.get("test_categories"), list) or isinstance(value.get("tests"), list)


def _closes(text: str, start: int) -> bool:
    """Whether the JSON value opened at ``start`` is closed before the text ends."""
    depth, in_string, escaped = 0, False, False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return True
    return False


def _find_document(text: str) -> tuple[dict[str, object] | None, int, int, bool]:
    """The first JSON object in ``text`` that is a dcgmi diag document: ``(value, start,
    end, False)``; ``(None, start, len(text), True)`` for one that began at ``start`` but
    was cut off; ``(None, -1, -1, False)`` when there is none.

    Raises:
        ParseError: a diag document that is complete but not valid JSON. (Reading on
            from a ``{`` inside it could find one passing test and pass a broken file.)
    """
    decoder = json.JSONDecoder()
    start = text.find("{")
    tries = 0
    while start != -1 and tries < _MAX_DOCUMENT_TRIES:
        tries += 1
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as exc:
            head = text[start : start + 4096]
            if any(f'"{k}"' in head for k in (*DIAG_KEYS, "test_categories", "iterations")):
                if not _closes(text, start):
                    return None, start, len(text), True  # cut off inside a diag document
                raise ParseError(
                    f"malformed dcgmi diag JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
                ) from None
            start = text.find("{", start + 1)
            continue
        if _is_diag(value):
            return value, start, end, False
        start = text.find("{", end)
    return None, -1, -1, False


def parse_dcgm_diag(text: str) -> DcgmDiagResult:
    """Parse the saved output of ``dcgmi diag -r N -j``.

    Raises:
        ParseError: no dcgmi diag JSON document and no dcgmi error line in ``text`` (also
            for dcgmi's box-drawn text output: run it with ``-j``).
    """
    value, start, end, truncated = _find_document(text)
    outside = text if start < 0 else text[:start] + "\n" + text[end:]
    error_lines = [line.strip() for line in split_lines(outside) if _ERROR_LINE.match(line)]
    out = _Doc(errors=error_lines)
    iterations: int | None = None
    if truncated:
        return DcgmDiagResult(
            top_key=next((k for k in DIAG_KEYS if f'"{k}"' in text[start : start + 200]), None),
            version=None,
            driver_version=None,
            tests=(),
            complete=False,
            errors=tuple(error_lines),
            truncated=True,
        )
    if value is not None:
        runs = value.get("iterations")
        if isinstance(runs, list):
            iterations = len(runs)
            for i, run in enumerate(runs):
                if isinstance(run, dict):
                    _read_root(run, out, i)
            overall = value.get("Overall Result")
            if isinstance(overall, str) and parse_status(overall) is not DcgmStatus.PASS:
                out.errors.append(f"Overall Result: {overall}")
            if isinstance(warn := value.get("Warning"), str) and warn.strip():
                out.errors.append(warn.strip())
        else:
            _read_root(value, out, None)
    elif not error_lines:
        if _TEXT_TABLE.search(text):
            raise ParseError("dcgmi diag text output (box-drawn table); run dcgmi diag with -j")
        if text.lstrip().startswith(("{", "[")):
            raise ParseError("JSON, but not a dcgmi diag document (no 'DCGM Diagnostic' key)")
        raise ParseError("no dcgmi diag JSON document found (run dcgmi diag with -j)")
    return DcgmDiagResult(
        top_key=out.top_key,
        version=out.version,
        driver_version=out.driver,
        tests=tuple(out.tests),
        complete=value is not None,
        runtime_error=out.runtime_error,
        errors=tuple(out.errors),
        iterations=iterations,
        gpu_serials=dict(out.serials),
    )
