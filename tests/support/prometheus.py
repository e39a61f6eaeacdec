"""A real Prometheus server (Debian's `prometheus` package) on loopback, scraping a gpupool head."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import plain_http
from tests.support.server import free_port

CI_MESSAGE = "Prometheus is not installed; .ci/run installs Debian's prometheus package"


def promtool() -> str:
    """Debian's promtool; a test without it is skipped, or fails under CI (which installs it)."""
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail(CI_MESSAGE)
        pytest.skip("promtool not installed (Debian's prometheus package)")
    return found


def find_prometheus() -> str | None:
    return shutil.which("prometheus") or next(
        (p for p in ("/usr/bin/prometheus", "/usr/local/bin/prometheus") if os.access(p, os.X_OK)), None
    )


@dataclass
class PrometheusProcess:
    base: Path
    target: str  # host:port of the head
    token: str
    binary: str
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> PrometheusProcess:
        self.base.mkdir(parents=True, exist_ok=True)
        config = self.base / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: gpupool\n"
            "    metrics_path: /metrics\n"
            f"    authorization: {{type: Bearer, credentials: '{self.token}'}}\n"
            f"    static_configs: [{{targets: ['{self.target}']}}]\n"
        )
        argv = [
            self.binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={self.base / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]
        log = open(self.base / "prometheus.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if plain_http.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"prometheus was not ready in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        path = self.base / "prometheus.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector of `promql`, through Prometheus' HTTP API (/api/v1/query)."""
        response = plain_http.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=10)
        response.raise_for_status()
        body = response.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def wait_for(self, promql: str, timeout: float = 30.0, count: int = 1) -> list[dict[str, Any]]:
        """Query until at least `count` series answer."""
        deadline = time.time() + timeout
        while True:
            result = self.query(promql)
            if len(result) >= count:
                return result
            if time.time() > deadline:
                targets = plain_http.get(f"{self.url}/api/v1/targets", timeout=10).text[:2000]
                raise AssertionError(f"{promql}: {len(result)} series after {timeout}s; targets: {targets}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
