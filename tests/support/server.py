"""Run a real `gpupool server` process for integration tests, and the real CLI against it."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support import plain_http

TERMINAL = ("succeeded", "failed", "cancelled")


PORT_TRIES = 3


class PortTaken(RuntimeError):
    """The server could not bind its port: another process took it after `free_port` chose it."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    home: Path
    db_url: str | None = None
    gpus: str = "sim:8xH100"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)  # more `gpupool server` options (--backend slurm)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env.update(
            {"GPUPOOL_HOME": str(self.home), "GPUPOOL_SERVER": self.url, "COLUMNS": "200", **self.extra_env}
        )
        return env

    @property
    def token(self) -> str:
        return str(json.loads((self.home / "credentials").read_text())["token"])

    def start(self, timeout: float = 30.0) -> ServerProcess:
        """Start the server and wait until it answers. A port from `free_port` can be taken by another
        test's server before this one binds it (the tests run in several processes): then that server
        would answer for this one, so the answer counts only once this process listens on the port, and
        a server that could not bind its port is started again on another."""
        for _ in range(PORT_TRIES - 1):
            try:
                return self._start(timeout)
            except PortTaken:
                self.port = free_port()
        return self._start(timeout)

    def _start(self, timeout: float) -> ServerProcess:
        logged = self.launch()
        return self.wait_healthy(timeout, logged)

    def launch(self) -> int:
        """Start the server process without waiting for it (a standby head waits before it listens); the
        length of its log before, for `wait_healthy`."""
        self.home.mkdir(parents=True, exist_ok=True)
        logged = len(self.log())  # what earlier starts wrote to the log
        argv = [
            sys.executable,
            "-m",
            "gpupool.main",
            "server",
            "--port",
            str(self.port),
            "--gpus",
            self.gpus,
            "--node-name",
            "node-1",
        ]
        if self.db_url:
            argv += ["--db", self.db_url]
        argv += self.extra_args
        log = open(self.home / "server.log", "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        return logged

    def wait_healthy(self, timeout: float, logged: int = 0) -> ServerProcess:
        """Wait until this server's own process answers on its port."""
        assert self.proc is not None
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                said = self.log()[logged:]
                if "address already in use" in said.lower():
                    raise PortTaken(said)
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{said}")
            try:
                if plain_http.get(f"{self.url}/healthz", timeout=1).status_code == 200 and self._listening():
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server did not become healthy in {timeout}s:\n{self.log()}")

    def _listening(self) -> bool:
        """Whether this server's own process listens on its port (not another that took the port)."""
        assert self.proc is not None
        try:
            sockets = psutil.Process(self.proc.pid).net_connections(kind="tcp")
        except psutil.Error:
            return False
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == self.port for c in sockets)

    def log(self) -> str:
        path = self.home / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    # -- talking to it ------------------------------------------------------------------------------------

    def http(self, token: str | None = "__default__") -> httpx.Client:
        headers = {}
        if token == "__default__":
            headers["Authorization"] = f"Bearer {self.token}"
        elif token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return plain_http.client(base_url=self.url, headers=headers, timeout=30)

    def cli(
        self, *args: str, cwd: Path | None = None, check: bool = False, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [sys.executable, "-m", "gpupool.main", *args],
            env=self.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            input=input,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"gpupool {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        with self.http() as client:
            response = client.post("/api/v1/workloads", json=spec)
            assert response.status_code == 201, response.text
            return dict(response.json())

    def workload(self, workload_id: int) -> dict[str, Any]:
        with self.http() as client:
            response = client.get(f"/api/v1/workloads/{workload_id}")
            assert response.status_code == 200, response.text
            return dict(response.json())

    def wait_for_reason(self, workload_id: int, timeout: float = 15.0) -> dict[str, Any]:
        """The workload once the scheduler has explained why it is pending."""
        deadline = time.time() + timeout
        while True:
            w = self.workload(workload_id)
            if w["state"] != "pending" or w["reason_code"]:
                return w
            if time.time() > deadline:
                raise AssertionError(f"workload {workload_id} was never explained: {w}")
            time.sleep(0.05)

    def wait_until(
        self, workload_id: int, ok: Callable[[dict[str, Any]], Any], timeout: float = 20.0
    ) -> dict[str, Any]:
        """The workload once `ok` holds for it (read again every 50 ms)."""
        deadline = time.time() + timeout
        while not ok(w := self.workload(workload_id)):
            if time.time() > deadline:
                raise AssertionError(f"workload {workload_id} never came to that in {timeout}s: {w}")
            time.sleep(0.05)
        return w

    def wait_for(
        self, workload_id: int, states: tuple[str, ...] = TERMINAL, timeout: float = 30.0
    ) -> dict[str, Any]:
        deadline = time.time() + timeout
        while True:
            w = self.workload(workload_id)
            if w["state"] in states:
                return w
            if time.time() > deadline:
                raise AssertionError(
                    f"workload {workload_id} still {w['state']} after {timeout}s: {w}\n{self.log()}"
                )
            time.sleep(0.1)
