"""deploy/prometheus: the alert rules pass ``promtool check rules`` and their promtool unit
tests, every alert has a test that fires it and one that does not, and the example
Prometheus configuration passes ``promtool check config``.

promtool comes from Debian's ``prometheus`` package (.ci/run installs it); without it
these tests fail, they never skip.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpufleet.core.signatures.catalog import get_catalog

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = PROMETHEUS / "gpufleet-alerts.yml"
UNIT_TESTS = sorted((PROMETHEUS / "tests").glob("*.yml"))
SEVERITIES = {"critical", "warning", "info"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail(
            "promtool is not on PATH: install Debian's prometheus package "
            "(apt-get install -y --no-install-recommends prometheus, as .ci/run does)"
        )
    return found


def run_promtool(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *map(str, args)], capture_output=True, text=True, timeout=60, check=False
    )


@cache
def alerts() -> dict[str, dict[str, Any]]:
    """Every alerting rule of the rules file, by name."""
    found: dict[str, dict[str, Any]] = {}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                assert rule["alert"] not in found, f"two alerts named {rule['alert']}"
                found[rule["alert"]] = rule
    return found


def test_the_rules_pass_promtool_check() -> None:
    done = run_promtool("check", "rules", RULES)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_the_promtool_unit_tests_pass() -> None:
    assert UNIT_TESTS, "no promtool tests under deploy/prometheus/tests"
    done = run_promtool("test", "rules", *UNIT_TESTS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("SUCCESS") == len(UNIT_TESTS), done.stdout


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for path in UNIT_TESTS:
        document = yaml.safe_load(path.read_text())
        assert document["rule_files"] == ["../gpufleet-alerts.yml"], path.name
        for case in document["tests"]:
            for check in case.get("alert_rule_test", []):
                name = check["alertname"]
                assert name in alerts(), f"{path.name} tests {name}, which no rule defines"
                (fires if check.get("exp_alerts") else quiet).add(name)
    assert sorted(set(alerts()) - fires) == [], "alerts no test fires"
    assert sorted(set(alerts()) - quiet) == [], "alerts no test shows quiet (exp_alerts: [])"


@pytest.mark.parametrize("name", sorted(alerts()))
def test_every_alert_says_how_bad_what_and_for_how_long(name: str) -> None:
    rule = alerts()[name]
    assert name.startswith("Gpufleet"), name
    assert rule["labels"]["severity"] in SEVERITIES
    assert {"summary", "description"} <= set(rule["annotations"])
    assert "for" in rule, f"{name}: say how long it must hold (for: 0m if at once)"


def test_the_fell_off_the_bus_alert_names_the_catalog_s_xid_79_signatures() -> None:
    expr = alerts()["GpufleetGpuFellOffTheBus"]["expr"]
    match = re.search(r'signature=~"([^"]+)"', expr)
    assert match is not None, expr
    catalog = {s.id for s in get_catalog().signatures if s.id == "xid-79" or s.treat_as_xid == 79}
    assert "xid-79" in catalog and len(catalog) > 1
    assert set(match.group(1).split("|")) == catalog, "update the rule from the catalog"


def test_the_example_prometheus_config_checks(tmp_path: Path) -> None:
    """The example scrape configuration with its rule file, as an operator installs it
    (promtool also checks that the scrape token file exists)."""
    token = tmp_path / "gpufleet-metrics-token"
    token.write_text("x" * 64 + "\n")
    config = (PROMETHEUS / "prometheus.yml").read_text()
    assert "/etc/prometheus/secrets/gpufleet-metrics-token" in config
    (tmp_path / "prometheus.yml").write_text(
        config.replace("/etc/prometheus/secrets/gpufleet-metrics-token", str(token))
    )
    shutil.copy(RULES, tmp_path / RULES.name)
    done = run_promtool("check", "config", tmp_path / "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = {job["job_name"] for job in yaml.safe_load(config)["scrape_configs"]}
    used = set(re.findall(r'job="([^"]+)"', RULES.read_text()))
    assert used <= jobs, f"the rules name jobs the example does not scrape: {used - jobs}"
