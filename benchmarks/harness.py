"""What the benchmarks share: a throwaway `gpupool server`, a lean HTTP client, statistics and reports.

Not imported by the package or the tests, and importing nothing from tests/: each benchmark script puts
this folder on sys.path by being run as `python benchmarks/<name>.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import httpx
import psutil
from rich.console import Console
from rich.table import Table

RESULTS_DIR = Path(__file__).resolve().parent / "results"
REPO_ROOT = Path(__file__).resolve().parent.parent
GPUS = "sim:8xH100"
NODE = "bench-node"
HOST = "127.0.0.1"

# Wide enough for the tables when the output is a pipe or a file (make bench | tee).
DB_HELP = (
    "store URL passed to the server (default: SQLite in each run's fresh GPUPOOL_HOME); give an empty "
    "database: rows an earlier run left (a cordoned node, pending jobs) change the result"
)

console = Console(width=None if sys.stdout.isatty() else 160)


def add_replay_options(parser: argparse.ArgumentParser, name: str) -> None:
    """The options of the benchmarks that replay a trace window with one or more codes: --trace, --window,
    --cluster, --queues, --code (repeatable), --output."""
    parser.add_argument("--trace", default=f"philly:{REPO_ROOT.parent / 'shared/traces/philly/philly.csv'}")
    parser.add_argument("--window", default="2017-10-02..2017-10-09")
    parser.add_argument("--cluster", default="64x8")
    parser.add_argument("--queues", default="auto")
    parser.add_argument("--code", action="append", type=Path, help="a folder holding gpupool/ (repeatable)")
    parser.add_argument("--output", type=Path, help=f"JSON path (default benchmarks/results/{name}.json)")


def replay_codes(args: argparse.Namespace) -> list[Path]:
    """The codes given (default: this checkout's src/), each checked to hold the gpupool package."""
    codes: list[Path] = [c.resolve() for c in (args.code or [REPO_ROOT / "src"])]
    for code in codes:
        if not (code / "gpupool").is_dir():
            raise SystemExit(f"--code {code}: no gpupool/ package there (give a src/ folder)")
    return codes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def add_run_options(
    parser: argparse.ArgumentParser, name: str, *, max_seconds: float, max_seconds_help: str
) -> None:
    """The options every service benchmark takes: --repeat, --db, --max-seconds, --log-level, --output."""
    parser.add_argument("--repeat", type=int, default=1, help="runs, each with a fresh server (default 1)")
    parser.add_argument("--db", default=None, help=DB_HELP)
    parser.add_argument("--max-seconds", type=float, default=max_seconds, help=max_seconds_help)
    parser.add_argument("--log-level", default="info", help="server log level (default info, as deployed)")
    parser.add_argument("--output", type=Path, default=None, help=f"JSON path (default results/{name}.json)")


def warn_shared_db(db_url: str | None, repeat: int) -> None:
    if db_url and repeat > 1:
        console.print(
            "[yellow]warning:[/yellow] --db with --repeat: every run uses the same database and sees what "
            "the runs before it left (a cordoned node, pending jobs)"
        )


# -- the server under test ---------------------------------------------------------------------------------


@dataclass
class BenchServer:
    """A `gpupool server` child process on 127.0.0.1 with a fresh GPUPOOL_HOME (deleted on stop)."""

    db_url: str | None = None
    log_level: str = "info"
    keep_home: bool = False
    port: int = field(default_factory=free_port)
    home: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpupool-bench-")))
    proc: subprocess.Popen[bytes] | None = None
    token: str = ""
    extra_args: list[str] = field(default_factory=list)  # more server options (--backend slurm ...)
    extra_env: dict[str, str] = field(default_factory=dict)  # more environment (SLURM_CONF)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 60.0) -> BenchServer:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env.update({"GPUPOOL_HOME": str(self.home), "GPUPOOL_SERVER": self.url, **self.extra_env})
        # --new-admin-token so a reused --db (which already has an admin token) still writes credentials.
        argv = [
            sys.executable,
            "-m",
            "gpupool.main",
            "server",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--gpus",
            GPUS,
            "--node-name",
            NODE,
            "--log-level",
            self.log_level,
            "--new-admin-token",
            # the server's own capacity is measured, not the API's per-token limit (docs/operations.md)
            "--rate-limit",
            "0",
        ]
        if self.db_url:
            argv += ["--db", self.db_url]
        argv += self.extra_args
        with open(self.home / "server.log", "ab") as log:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.home)
        return self.wait_healthy(timeout)

    def launch(self) -> BenchServer:
        """Start it without waiting until it answers (a `--standby` head listens only once it takes over)."""
        return self.start(timeout=0.0)

    def wait_healthy(self, timeout: float = 60.0) -> BenchServer:
        """Wait until it answers /healthz, and read its admin token; timeout 0: do not wait."""
        if timeout <= 0:
            return self
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fail(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    self.token = str(json.loads((self.home / "credentials").read_text())["token"])
                    return self
            except (httpx.TransportError, OSError, ValueError):
                pass
            time.sleep(0.1)
        self._fail(f"server did not become healthy in {timeout}s")

    def _fail(self, what: str) -> NoReturn:
        tail = self.log_tail()
        self.stop()
        raise RuntimeError(f"{what}:\n{tail}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_seconds(self) -> float:
        """User+system CPU of the server and its children so far (children: job shims, when reaped)."""
        times = psutil.Process(self.pid).cpu_times()
        return float(times.user + times.system + times.children_user + times.children_system)

    def log_tail(self, lines: int = 40) -> str:
        path = self.home / "server.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def count_log_lines(self, needle: str) -> int:
        path = self.home / "server.log"
        if not path.exists():
            return 0
        return sum(1 for line in path.read_text(errors="replace").splitlines() if needle in line)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        # Jobs run in their own sessions; a cordoned benchmark starts none, a finished one leaves none.
        if not self.keep_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> BenchServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # -- small synchronous calls for setup and checks (not on the measured path) ----------------------

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)

    def cordon_all(self) -> list[str]:
        """Cordon every node so submitted jobs stay pending; returns the node names."""
        with self.http() as client:
            names = [n["name"] for n in client.get("/api/v1/nodes").raise_for_status().json()]
            for name in names:
                client.post(f"/api/v1/nodes/{name}/cordon", json={"reason": "benchmark"}).raise_for_status()
        return names


# -- a lean asyncio HTTP/1.1 client ------------------------------------------------------------------------


class HttpError(RuntimeError):
    pass


class RawConnection:
    """One keep-alive HTTP/1.1 connection speaking just enough of the protocol for JSON requests.

    Why not httpx: on a 2-core machine the client competes with the server for CPU, and httpx spends
    several times more CPU per request than this (see `submit_throughput.py --client`).
    """

    def __init__(self, host: str, port: int, token: str) -> None:
        self.host, self.port = host, port
        self._head = f"Host: {host}:{port}\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\n"
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        if self._writer is None:
            await self._connect()
        assert self._reader is not None and self._writer is not None
        head = f"{method} {path} HTTP/1.1\r\n{self._head}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self._writer.write((head + "\r\n").encode() + (body or b""))
        try:
            raw = await self._reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self.close()
            raise HttpError(f"connection lost: {exc!r}") from exc
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, close = None, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if length is None:
            await self.close()
            raise HttpError("response without Content-Length (chunked bodies are not supported)")
        data = await self._reader.readexactly(length)
        if close:
            await self.close()
        return status, data

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None


async def submit_jobs(
    server: BenchServer, body: bytes, count: int, clients: int, ids: list[int], errors: list[str]
) -> None:
    """POST `body` to /api/v1/workloads `count` times over `clients` connections; the ids of accepted
    workloads go to `ids` as they are answered, failures to `errors`."""
    remaining = iter(range(count))

    async def worker() -> None:
        conn = RawConnection(HOST, server.port, server.token)
        try:
            for _ in remaining:
                try:
                    status, data = await conn.request("POST", "/api/v1/workloads", body)
                except (HttpError, OSError) as exc:
                    errors.append(repr(exc))
                    continue
                if status == 201:
                    ids.append(int(json.loads(data)["id"]))
                else:
                    errors.append(f"http {status}")
        finally:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(clients)))


# -- statistics and reports --------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), linear interpolation between closest ranks; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    if len(ordered) == 1:
        return ordered[0]
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median_of_runs(runs: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, float]:
    return {k: statistics.median(float(r[k]) for r in runs) for k in keys}


def spread_of_runs(runs: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, list[float]]:
    return {k: [min(float(r[k]) for r in runs), max(float(r[k]) for r in runs)] for k in keys}


def machine() -> dict[str, Any]:
    cpu_model = ""
    cpu_mhz: float | None = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not cpu_model:
                cpu_model = line.split(":", 1)[1].strip()
            elif line.startswith("cpu MHz") and cpu_mhz is None:
                cpu_mhz = float(line.split(":", 1)[1])
    except (OSError, ValueError):
        pass
    code_root, commit, modified = code_under_test()
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu_model,
        "cpu_mhz": cpu_mhz,
        "memory_bytes": psutil.virtual_memory().total,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "loadavg_at_start": list(os.getloadavg()),
        "gpupool_code": str(code_root),
        "git_commit": commit,
        "src_modified": modified,
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def code_under_test() -> tuple[Path, str, bool | None]:
    """Where the server's `gpupool` package comes from (PYTHONPATH may point at an exported snapshot),
    its commit (git, or a COMMIT file beside src/), and whether its src/ differs from that commit."""
    spec = importlib.util.find_spec("gpupool")
    origin = Path(spec.origin) if spec is not None and spec.origin else REPO_ROOT / "src" / "gpupool" / "x"
    root = origin.parent.parent.parent
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if result.returncode == 0 and (root / ".git").exists():
            dirty = subprocess.run(
                ["git", "status", "--porcelain", "--", "src"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            return root, result.stdout.strip(), bool(dirty)
    except (OSError, subprocess.SubprocessError):
        pass
    marker = root / "COMMIT"
    return root, marker.read_text().strip() if marker.exists() else "", None


def write_results(name: str, payload: dict[str, Any], output: Path | None = None) -> Path:
    path = output or RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def write_run(name: str, args: argparse.Namespace, results: dict[str, Any]) -> Path:
    """`results` with the machine and the command's arguments, written to `args.output` (else the
    results folder); the path."""
    payload = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()}, **results}
    return write_results(name, payload, args.output)


@dataclass(frozen=True)
class Column:
    key: str
    title: str
    fmt: Callable[[float], str] = lambda v: f"{v:.1f}"


def save_report(
    name: str,
    args: argparse.Namespace,
    runs: list[dict[str, Any]],
    keys: Sequence[str],
    median: dict[str, float],
    target: dict[str, float],
    met: bool,
    **extra: Any,
) -> None:
    """Write a benchmark's JSON (options, machine, every run, median, spread, target) and say where."""
    payload = {
        "benchmark": name,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        **extra,
        "machine": machine(),
        "runs": runs,
        "median": median,
        "spread": spread_of_runs(runs, keys),
        "target": target,
        "target_met": met,
    }
    path = write_results(name, payload, args.output)
    console.print(f"[dim]wrote {path}[/dim]")


def print_runs(
    title: str, runs: list[dict[str, Any]], columns: Sequence[Column], median: dict[str, float] | None = None
) -> None:
    table = Table(title=title)
    table.add_column("run", justify="right")
    for col in columns:
        table.add_column(col.title, justify="right")
    for i, run in enumerate(runs, 1):
        table.add_row(str(i), *(col.fmt(float(run[col.key])) for col in columns))
    if median is not None and len(runs) > 1:
        table.add_row("median", *(col.fmt(median[col.key]) for col in columns), style="bold")
    console.print(table)


def verdict(met: bool) -> str:
    return "[green]met[/green]" if met else "[red]NOT met[/red]"
