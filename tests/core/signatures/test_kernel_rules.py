"""The kernel-log rules snapshot: current with the catalog, and never trusted when stale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.core.signatures import kernel_rules
from gpufleet.core.signatures.catalog import get_catalog
from gpufleet.core.signatures.kernel_rules import (
    catalog_digest,
    from_json,
    packaged_rules,
    rules_of,
    to_json,
)


def test_the_packaged_snapshot_is_current() -> None:
    snapshot = Path(kernel_rules.__file__).with_name(kernel_rules.SNAPSHOT_RESOURCE)
    digest, rules = from_json(snapshot.read_text(encoding="utf-8"))
    assert digest == catalog_digest(), (
        "catalog.toml changed: run python -m gpufleet.core.signatures.kernel_rules"
    )
    assert rules == rules_of(get_catalog())


def test_json_round_trip() -> None:
    rules = rules_of(get_catalog())
    assert from_json(to_json(rules, catalog_sha256="x")) == ("x", rules)
    assert any(r.multiline_start for r in rules)
    assert any(r.overrides for r in rules)


def test_a_stale_snapshot_is_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    packaged_rules.cache_clear()
    monkeypatch.setattr(kernel_rules, "catalog_digest", lambda: "not the snapshot's")
    try:
        assert packaged_rules() == rules_of(get_catalog())
    finally:
        packaged_rules.cache_clear()


def test_matching_with_the_packaged_catalog_does_not_import_pydantic() -> None:
    code = (
        "import sys\n"
        "from gpufleet.core.signatures.matcher import KernelLogMatcher\n"
        "m = KernelLogMatcher().feed('NVRM: Xid (PCI:0000:3b:00): 79, pid=1, x')\n"
        "assert m and m[0].signature == 'xid-79', m\n"
        "print('pydantic' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "False"
