"""A real Prometheus for tests (Debian's ``prometheus`` package), on a loopback port.

Start one per test session (``tests/conftest.py``'s ``prometheus`` fixture) and give
each test its scrape jobs with ``configure()``, which reloads the running server
(``POST /-/reload``, ``--web.enable-lifecycle``): a fresh Prometheus costs seconds.
Either way the first sample of a new target is queryable only after ~6 s (the discovery
manager throttles target updates to one per 5 s), so ``wait_for()`` polls.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from gpufleet.testing.processes import free_port

INSTALL_HINT = (
    "apt-get install -y --no-install-recommends prometheus (Debian's package: "
    "prometheus and promtool; .ci/run installs it)"
)
Result = list[dict[str, Any]]


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: ``target`` is host:port; ``token_file`` holds a bearer token."""

    name: str
    target: str
    token_file: Path | None = None
    metrics_path: str = "/metrics"
    interval_s: float = 1.0
    # Target labels every scraped series gets (as a service discovery would set them).
    labels: tuple[tuple[str, str], ...] = ()
    # More targets in the same job (one job of many nodes, as a fleet's agents are).
    more_targets: tuple[str, ...] = ()

    def as_config(self) -> dict[str, Any]:
        job: dict[str, Any] = {
            "job_name": self.name,
            "metrics_path": self.metrics_path,
            "scrape_interval": f"{self.interval_s:g}s",
            "scrape_timeout": f"{self.interval_s:g}s",
            "static_configs": [
                {"targets": [self.target, *self.more_targets], "labels": dict(self.labels)}
            ],
        }
        if self.token_file is not None:
            job["authorization"] = {"type": "Bearer", "credentials_file": str(self.token_file)}
        return job


class PrometheusServer:
    """``prometheus`` in a child process; its data and log under ``workdir``."""

    def __init__(self, *, workdir: Path, port: int | None = None) -> None:
        self.workdir = workdir
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config_path = workdir / "prometheus.yml"
        self.log_path = workdir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, jobs: Sequence[ScrapeJob] = (), *, rule_files: Sequence[Path] = ()) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            raise RuntimeError(f"prometheus is not on PATH: {INSTALL_HINT}")
        self._write_config(jobs, rule_files)
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",  # default is 0.0.0.0:9090
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        log.close()
        self._wait_ready(timeout_s=20)

    def configure(self, jobs: Sequence[ScrapeJob], *, rule_files: Sequence[Path] = ()) -> None:
        """Replace the scrape jobs and rule files, and reload; raises if the reload fails."""
        self._write_config(jobs, rule_files)
        response = httpx.post(f"{self.url}/-/reload", timeout=10)
        if response.status_code != 200:
            raise RuntimeError(f"reload failed: {response.status_code} {response.text}")

    def query(self, expr: str) -> Result:
        """An instant query's result vector; raises on a query error."""
        response = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = response.json()
        if body.get("status") != "success":
            raise RuntimeError(f"query {expr!r} failed: {body}")
        result: Result = body["data"]["result"]
        return result

    def wait_for(
        self,
        expr: str,
        *,
        until: Callable[[Result], bool] = bool,
        timeout_s: float = 20.0,
    ) -> Result:
        """Poll ``expr`` until ``until(result)`` holds (default: a non-empty result)."""
        deadline = time.monotonic() + timeout_s
        result: Result = []
        while time.monotonic() < deadline:
            self._check_running()
            result = self.query(expr)
            if until(result):
                return result
            time.sleep(0.25)
        raise TimeoutError(
            f"{expr!r} not as expected after {timeout_s} s; last result {result}; targets:\n"
            + json.dumps(self.targets(), indent=1)[:4000]
        )

    def targets(self) -> Result:
        """The active targets, with their health and last scrape error."""
        body = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()
        active: Result = body["data"]["activeTargets"]
        return active

    def rules(self) -> Result:
        """The loaded rule groups (each rule with its health and last error)."""
        body = httpx.get(f"{self.url}/api/v1/rules", timeout=10).json()
        groups: Result = body["data"]["groups"]
        return groups

    def alerts(self) -> Result:
        """The alerts pending or firing now (each with its labels, state and activeAt)."""
        body = httpx.get(f"{self.url}/api/v1/alerts", timeout=10).json()
        alerts: Result = body["data"]["alerts"]
        return alerts

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def _write_config(self, jobs: Sequence[ScrapeJob], rule_files: Sequence[Path]) -> None:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [job.as_config() for job in jobs],
        }
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(json.dumps(config, indent=1))  # JSON is YAML

    def _wait_ready(self, *, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self._check_running()
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"prometheus not ready after {timeout_s} s:\n{self.output()}")

    def _check_running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise RuntimeError(f"prometheus is not running (exit {code}):\n{self.output()}")
