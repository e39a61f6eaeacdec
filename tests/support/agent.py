"""Real `gpupool agent` processes against a real head on 127.0.0.1, with simulated GPUs and distinct names."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.backends.agent import AgentBackend
from gpupool.backends.base import InventoryNode
from gpupool.control import agents
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.store.db import Store
from tests.support.process import Clock
from tests.support.server import ServerProcess


def described(backend: AgentBackend, name: str, info: dict[str, Any]) -> Callable[[], InventoryNode]:
    """What POST /api/v1/agents/register hands `agents.register` once the node is admitted: the agent
    backend takes in the node's description (`info`), and the store is written as it says."""

    def describe() -> InventoryNode:
        backend.register(name, info, "127.0.0.1")
        return backend.registered(name)

    return describe


def in_process_head(
    store: Store, home: Path, clock: Clock, lease: float, nodes: tuple[str, ...] = ("a", "b")
) -> tuple[Reconciler, AgentBackend]:
    """A head's control loop in this process over agent nodes of one H100 each (`nodes`), registered as
    their agents would register them; the backend reads `clock`, so a test moves time past a lease."""
    backend = AgentBackend(lease=lease, clock=clock)
    for name in nodes:
        token = str(agents.create_join_token(store, 3600)["token"])
        joining = described(backend, name, {"cpus": 8, "memory_bytes": 1 << 34, "gpus": [["H100", 1]]})
        agents.register(store, name, join_token=token, credential=None, described=joining)
    return Reconciler(store, backend, None, ControlSettings(home=home, node_name="head")), backend


def _port_block(size: int = 20) -> str:
    """A random block of ports below Linux's ephemeral range, for one agent's --rendezvous-ports."""
    low = random.randrange(20000, 32000 - size, size)
    return f"{low}-{low + size - 1}"


# The node lease of a test's head: the product's default, so that a node is lost only when a test makes it
# so (SIGSTOP, kill -9 of its agent), not because a loaded machine delayed a heartbeat (3 s left a live
# agent 2 s of slack after its 1 s long-poll). Tests that lose a node on purpose pass LOSS_LEASE, short
# enough to wait for, long enough that a live agent does not miss it.
LEASE = "10s"
LOSS_LEASE = "6s"


def agent_head(home: Path, lease: str = LEASE, extra: list[str] | None = None) -> ServerProcess:
    """A head with no local node that schedules onto agents (`--gpus none`), with the node lease `lease`."""
    return ServerProcess(home=home, gpus="none", extra_args=["--node-lease", lease, *(extra or [])])


def join_token(server: ServerProcess, ttl: str = "10m") -> str:
    with server.http() as client:
        response = client.post("/api/v1/join-tokens", json={"ttl": ttl})
        assert response.status_code == 201, response.text
        return str(response.json()["token"])


@dataclass
class AgentProcess:
    server: ServerProcess
    name: str
    state_dir: Path
    token: str | None
    gpus: str = "sim:1xH100"
    labels: str = ""
    orphan_grace: str = "60s"
    proc: subprocess.Popen[bytes] | None = None
    extra_args: list[str] = field(default_factory=list)
    # Several agents share this machine (and other test runs): each gets its own rendezvous ports.
    rendezvous_ports: str = field(default_factory=lambda: _port_block())

    @property
    def log_path(self) -> Path:
        return self.state_dir.parent / f"{self.name}.log"

    def start(self) -> AgentProcess:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "gpupool.main", "agent",
            "--server", self.server.url, "--name", self.name, "--gpus", self.gpus,
            "--state-dir", str(self.state_dir), "--orphan-grace", self.orphan_grace,
            "--rendezvous-ports", self.rendezvous_ports,
        ]  # fmt: skip
        if self.token:
            argv += ["--join-token", self.token]
        if self.labels:
            argv += ["--labels", self.labels]
        argv += self.extra_args
        log = open(self.log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self.proc = subprocess.Popen(
            argv, env=self.server.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@dataclass
class Pool:
    """A head and N agents; `stop()` ends them all (and any work left in the agents' process groups)."""

    server: ServerProcess
    agents: list[AgentProcess]

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.server.stop()

    def agent(self, name: str) -> AgentProcess:
        return next(a for a in self.agents if a.name == name)

    def nodes(self) -> dict[str, dict[str, Any]]:
        with self.server.http() as client:
            return {n["name"]: n for n in client.get("/api/v1/nodes").json()}

    def wait_for_nodes(self, names: list[str], state: str = "ready", timeout: float = 30.0) -> None:
        deadline = time.time() + timeout
        while True:
            nodes = self.nodes()
            if all(nodes.get(n, {}).get("state") == state for n in names):
                return
            if time.time() > deadline:
                seen = {n: v["state"] for n, v in nodes.items()}
                logs = "\n".join(f"--- {a.name}\n{a.log()[-2000:]}" for a in self.agents)
                raise AssertionError(f"nodes {names} not {state} after {timeout}s (nodes: {seen})\n{logs}")
            time.sleep(0.2)


def start_pool(
    tmp_path: Path, count: int, *, lease: str = LEASE, gpus: str = "sim:1xH100", orphan_grace: str = "60s"
) -> Pool:
    server = agent_head(tmp_path / "home", lease).start()
    token = join_token(server)
    agents = []
    for i in range(count):
        name = f"agent-{i}"
        agent = AgentProcess(
            server, name, tmp_path / "agents" / name, token, gpus=gpus, orphan_grace=orphan_grace
        )
        agents.append(agent.start())
    pool = Pool(server, agents)
    try:
        pool.wait_for_nodes([a.name for a in agents])
    except BaseException:
        pool.stop()
        raise
    return pool
