"""The catalog's kernel-log rules as plain data, and a snapshot of them for a fast start.

The matcher needs only the kernel-log entries, and only a few fields of each. Loading
the catalog validates all of it with pydantic, which costs about a quarter of a second
before ``gpufleet scan`` reads its first byte (importing pydantic and building the
models is most of it). So the package also ships ``kernel_rules.json``: those fields,
with the SHA-256 of the ``catalog.toml`` they came from. :func:`packaged_rules` uses the
snapshot when the digest is that of the packaged catalog, and otherwise loads and
validates the catalog as before: an edit to the catalog is never missed, only slower
until the snapshot is written again::

    python -m gpufleet.core.signatures.kernel_rules   # rewrites kernel_rules.json

(tests/core/signatures/test_kernel_rules.py fails while the snapshot is stale).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.core.enums import RepairAction, Severity

if TYPE_CHECKING:
    from gpufleet.core.signatures.models import Catalog

SNAPSHOT_RESOURCE = "kernel_rules.json"
CATALOG_RESOURCE = "catalog.toml"  # as in catalog.py, which this module must not import


@dataclass(frozen=True, slots=True)
class KernelRuleSpec:
    """One kernel-log signature: what the matcher compiles (see ``KernelLogRule``)."""

    id: str
    title: str
    severity: Severity
    action: RepairAction
    pattern: str  # ``pattern_ref`` resolved
    prefilter: tuple[str, ...]
    codes: tuple[int, ...] = ()
    fallback: bool = False
    contains: tuple[str, ...] = ()
    excludes: tuple[str, ...] = ()
    multiline_start: str | None = None
    multiline_max_lines: int = 0
    overrides: tuple[tuple[str, Severity | None, RepairAction | None], ...] = ()


def rules_of(catalog: Catalog) -> tuple[KernelRuleSpec, ...]:
    """The kernel-log rules of a validated catalog, in catalog order."""
    out: list[KernelRuleSpec] = []
    for sig in catalog.signatures:
        rule = sig.match
        if rule.kind != "kernel-log":
            continue
        out.append(
            KernelRuleSpec(
                id=sig.id,
                title=sig.title,
                severity=sig.severity,
                action=sig.action,
                pattern=catalog.pattern_of(rule),
                prefilter=rule.prefilter,
                codes=rule.codes,
                fallback=rule.fallback,
                contains=rule.contains,
                excludes=rule.excludes,
                multiline_start=rule.multiline.start if rule.multiline else None,
                multiline_max_lines=rule.multiline.max_lines if rule.multiline else 0,
                overrides=tuple((o.pattern, o.severity, o.action) for o in rule.overrides),
            )
        )
    return tuple(out)


def to_json(rules: tuple[KernelRuleSpec, ...], *, catalog_sha256: str) -> str:
    data = {
        "catalog_sha256": catalog_sha256,
        "rules": [
            {
                "id": r.id,
                "title": r.title,
                "severity": r.severity.value,
                "action": r.action.value,
                "pattern": r.pattern,
                "prefilter": list(r.prefilter),
                "codes": list(r.codes),
                "fallback": r.fallback,
                "contains": list(r.contains),
                "excludes": list(r.excludes),
                "multiline_start": r.multiline_start,
                "multiline_max_lines": r.multiline_max_lines,
                "overrides": [
                    [p, s.value if s else None, a.value if a else None] for p, s, a in r.overrides
                ],
            }
            for r in rules
        ],
    }
    return json.dumps(data, indent=1, ensure_ascii=False) + "\n"


def from_json(text: str) -> tuple[str, tuple[KernelRuleSpec, ...]]:
    """(the catalog digest, the rules) of a snapshot."""
    data: dict[str, Any] = json.loads(text)
    rules = tuple(
        KernelRuleSpec(
            id=r["id"],
            title=r["title"],
            severity=Severity(r["severity"]),
            action=RepairAction(r["action"]),
            pattern=r["pattern"],
            prefilter=tuple(r["prefilter"]),
            codes=tuple(r["codes"]),
            fallback=r["fallback"],
            contains=tuple(r["contains"]),
            excludes=tuple(r["excludes"]),
            multiline_start=r["multiline_start"],
            multiline_max_lines=r["multiline_max_lines"],
            overrides=tuple(
                (p, Severity(s) if s else None, RepairAction(a) if a else None)
                for p, s, a in r["overrides"]
            ),
        )
        for r in data["rules"]
    )
    return str(data["catalog_sha256"]), rules


def _package_file(name: str) -> bytes:
    return resources.files("gpufleet.core.signatures").joinpath(name).read_bytes()


def catalog_digest() -> str:
    return hashlib.sha256(_package_file(CATALOG_RESOURCE)).hexdigest()


@cache
def packaged_rules() -> tuple[KernelRuleSpec, ...]:
    """The packaged catalog's kernel-log rules: from the snapshot when it is current."""
    try:
        digest, rules = from_json(_package_file(SNAPSHOT_RESOURCE).decode("utf-8"))
    except (OSError, ValueError, KeyError, TypeError):
        digest, rules = "", ()
    if digest == catalog_digest():
        return rules
    # Stale or missing: validate the catalog itself. Imported here, not at the top, so
    # that the snapshot path never imports pydantic (the point of the snapshot).
    from gpufleet.core.signatures.catalog import get_catalog

    return rules_of(get_catalog())


def write_snapshot(path: Path | None = None) -> Path:
    """Write the snapshot of the packaged catalog next to it (or to ``path``)."""
    from gpufleet.core.signatures.catalog import get_catalog

    target = path or Path(__file__).with_name(SNAPSHOT_RESOURCE)
    target.write_text(
        to_json(rules_of(get_catalog()), catalog_sha256=catalog_digest()), encoding="utf-8"
    )
    return target


if __name__ == "__main__":
    print(write_snapshot())
