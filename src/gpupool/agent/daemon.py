"""The node agent (`gpupool agent`): joins the head, then long-polls it for what this node should run.

All connections go from the node to the head (no inbound port on the node). One thread long-polls
`POST /api/v1/agents/heartbeat` (each call is a heartbeat: what runs here, log chunks, GPU samples; the
answer is what should run here); a second sends the same report at once when a process ends, so the head
learns of it without waiting for the poll. If the head cannot be reached for `orphan_grace` seconds, the
agent kills its work (the head has moved it elsewhere by then; see docs/agents.md).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from gpupool import __version__
from gpupool.agent.attempts import NodeAttempts
from gpupool.client.client import tls_for
from gpupool.gpu import GpuProvider, GpuSample
from gpupool.gpu.catalog import lookup_model
from gpupool.gpu.errors import UnknownGpuModel
from gpupool.health.node_tasks import NodeTasks

log = logging.getLogger("gpupool.agent")

API = "/api/v1/agents"
RETRY_DELAY = 1.0  # seconds between attempts to reach an unreachable head
NAME_HELD_RETRY = 5.0  # seconds between registrations while another agent holds this node's name


class AgentRefused(RuntimeError):
    """The head refused this agent (bad or revoked join token, a name taken by another backend): fatal."""


class NameHeld(AgentRefused):
    """Another agent holds this node's name and is not lost: at the first registration the agent waits for
    it (this machine may replace it), later it is fatal (this agent was lost and its name taken over)."""


@dataclass
class AgentSettings:
    server: str
    state_dir: Path
    name: str
    join_token: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    orphan_grace: float = 60.0
    telemetry_interval: float = 1.0  # seconds between GPU samples sent (at most one per heartbeat)
    address: str | None = None  # what other nodes dial for this one (rank 0 is MASTER_ADDR); default: as
    # the head sees it
    rendezvous_ports: tuple[int, int] = (29500, 29999)  # kept free here for MASTER_PORT of gangs' rank 0


class Agent:
    def __init__(self, settings: AgentSettings, gpus: GpuProvider | None) -> None:
        self.settings = settings
        self.gpus = gpus
        settings.state_dir.mkdir(parents=True, exist_ok=True)
        self._exited = threading.Event()
        self.attempts = NodeAttempts(settings.state_dir, on_exit=self._exited.set)
        self.attempts.load()
        # The head's instructions (active health checks, fault injection); a reply is sent at once.
        self.tasks = NodeTasks(gpus, settings.name, on_done=self._exited.set)
        self._credential = self._load_credential()
        head, tls = settings.server.rstrip("/"), tls_for(settings.server)
        self._http = httpx.Client(base_url=head, timeout=30.0, verify=tls)
        self._report_http = httpx.Client(base_url=head, timeout=10.0, verify=tls)
        self._send_lock = threading.Lock()
        self.interval = 1.0
        self.last_contact = time.monotonic()
        self._sampled_at = float("-inf")  # when GPU samples were last sent
        self._orphaned = False
        self._stop = threading.Event()
        # The head's version of the newest answer applied (-1: none since joining). The long-poll and the
        # exit report are two heartbeats that may be answered in one order and applied in the other.
        self._applied_version = -1

    # -- credentials -----------------------------------------------------------------------------------

    @property
    def _credential_path(self) -> Path:
        return self.settings.state_dir / "credential.json"

    def _load_credential(self) -> str | None:
        try:
            data = json.loads(self._credential_path.read_text())
        except (OSError, ValueError):
            return None
        if data.get("name") != self.settings.name:
            return None
        return str(data.get("credential") or "") or None

    def _save_credential(self, credential: str) -> None:
        path = self._credential_path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(
                {"server": self.settings.server, "name": self.settings.name, "credential": credential}, fh
            )
        self._credential = credential

    # -- talking to the head ---------------------------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        devices = self.gpus.devices() if self.gpus is not None else []
        for device in devices:
            kind = _catalog_kind(device.model, device.memory_bytes)
            counts[kind] = counts.get(kind, 0) + 1
        info: dict[str, Any] = {
            "cpus": float(psutil.cpu_count() or 1),
            "memory_bytes": int(psutil.virtual_memory().total),
            "gpus": sorted(counts.items()),
            "devices": [{**d.to_dict(), "kind": _catalog_kind(d.model, d.memory_bytes)} for d in devices],
            "rendezvous_ports": list(self.settings.rendezvous_ports),
            "labels": self.settings.labels,
            "agent_version": __version__,
        }
        if self.settings.address:
            info["address"] = self.settings.address
        return info

    def register(self) -> None:
        body = {
            "name": self.settings.name,
            "join_token": self.settings.join_token,
            "credential": self._credential,
            "info": self.describe(),
        }
        response = self._http.post(f"{API}/register", json=body)
        if response.status_code == 409 and _code(response) == "node_name_taken":
            raise NameHeld(_message(response))
        if response.status_code in (401, 403, 409, 422):
            raise AgentRefused(_message(response))
        response.raise_for_status()
        answer = response.json()
        if answer.get("credential"):
            self._save_credential(str(answer["credential"]))
        self.interval = float(answer.get("interval") or 1.0)
        with self._send_lock:
            self._applied_version = -1  # a restarted head counts its versions from 0 again
        log.info("event=agent_joined node=%s server=%s", self.settings.name, self.settings.server)

    def _heartbeat(self, client: httpx.Client, wait: float) -> None:
        with self._send_lock:
            attempts, logs = self.attempts.report()
        body: dict[str, Any] = {"attempts": attempts, "logs": logs, "wait": wait}
        now = time.monotonic()
        # 0.9: heartbeats come about a second apart, a little early or late; 1 s means every heartbeat.
        if self.gpus is not None and now - self._sampled_at >= 0.9 * self.settings.telemetry_interval:
            self._sampled_at = now
            held = self.attempts.pids_by_gpu()
            for device in self.gpus.devices():
                self.gpus.attach(device.index, held.get(device.index, []))
            body["telemetry"] = telemetry_rows(self.gpus.sample())
        replies = self.tasks.results()
        if replies:
            body["instruction_results"] = replies
        headers = {"Authorization": f"Bearer {self._credential}"}
        response = client.post(f"{API}/heartbeat", json=body, headers=headers, timeout=wait + 10.0)
        if response.status_code == 409:
            self.register()  # the head restarted and does not know this node yet
            return
        if response.status_code == 401:
            # The head knows this node's credential no more (another agent took the name once this one was
            # lost, the node was removed, the store replaced): what runs here is not the head's work now.
            stopped = self.attempts.stop_all("the head no longer knows this node's credential")
            log.warning("event=credential_refused node=%s stopped=%d", self.settings.name, stopped)
            raise AgentRefused(_message(response))
        response.raise_for_status()
        answer = response.json()
        if self.take_answer(answer):
            self.tasks.take(answer.get("instructions") or [])
        self.last_contact = time.monotonic()
        if self._orphaned:
            self._orphaned = False
            log.info("event=head_reachable_again node=%s", self.settings.name)

    def take_answer(self, answer: dict[str, Any]) -> bool:
        """Run what a heartbeat answer lists, unless the head wrote it before an answer already applied
        (False): applying it would kill a rank started since, and the next heartbeat would start it again."""
        version = answer.get("version")
        with self._send_lock:
            if isinstance(version, int):
                if version < self._applied_version:
                    log.info(
                        "event=stale_answer_ignored node=%s version=%d applied=%d",
                        self.settings.name, version, self._applied_version,
                    )  # fmt: skip
                    return False
                self._applied_version = version
            self.attempts.apply(answer)
        return True

    # -- the loops -------------------------------------------------------------------------------------

    def run(self) -> None:
        """Join, then heartbeat until stopped; AgentRefused ends it (a fix is needed on the head)."""
        while not self._stop.is_set():
            try:
                self.register()
                break
            except httpx.TransportError as exc:
                log.warning("event=head_unreachable server=%s error=%r", self.settings.server, str(exc))
                self._check_orphans()
                self._stop.wait(RETRY_DELAY)
            except NameHeld as exc:  # this machine may replace a node the head has not yet seen lost
                log.warning("event=node_name_held node=%s error=%r", self.settings.name, str(exc))
                self._check_orphans()
                self._stop.wait(NAME_HELD_RETRY)
        reporter = threading.Thread(target=self._report_exits, name="agent-report", daemon=True)
        reporter.start()
        while not self._stop.is_set():
            try:
                self._heartbeat(self._http, self.interval)
            except AgentRefused:
                raise
            except (httpx.TransportError, httpx.HTTPStatusError) as exc:
                log.warning("event=heartbeat_failed server=%s error=%r", self.settings.server, str(exc))
                self._check_orphans()
                self._stop.wait(RETRY_DELAY)
            except OSError as exc:  # its state dir's disk (full, gone): heartbeats go on, and say it
                log.error("event=agent_state_dir_error node=%s error=%r", self.settings.name, str(exc))
                self._stop.wait(RETRY_DELAY)

    def _report_exits(self) -> None:
        while not self._stop.is_set():
            if not self._exited.wait(0.5):
                continue
            self._exited.clear()
            # On failure the long-poll reports it too.
            try:
                self._heartbeat(self._report_http, 0.0)
            except (httpx.TransportError, httpx.HTTPStatusError, AgentRefused):
                pass
            except OSError as exc:  # its state dir's disk (full, gone): the thread must live on
                log.error("event=agent_state_dir_error node=%s error=%r", self.settings.name, str(exc))

    def _check_orphans(self) -> None:
        silent = time.monotonic() - self.last_contact
        if silent >= self.settings.orphan_grace and not self._orphaned:
            stopped = self.attempts.stop_all(
                f"no answer from the head for {silent:.0f}s (the agent's orphan grace, "
                f"{self.settings.orphan_grace:g}s)"
            )
            self._orphaned = True
            log.warning(
                "event=orphan_grace_expired node=%s silent=%.1f stopped=%d",
                self.settings.name, silent, stopped,
            )  # fmt: skip

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._http.close()
        self._report_http.close()
        if self.gpus is not None:
            self.gpus.close()


def telemetry_rows(samples: Iterable[GpuSample]) -> list[dict[str, object]]:
    """Samples as a heartbeat carries them: `GpuSample.to_dict()` rows without their empty lists (no Xid
    error, no throttling, second after second), which every reader takes as empty. A row with no list
    is cheaper for the head to take in: its kept copy is no object the garbage collector tracks."""
    return [{k: v for k, v in s.to_dict().items() if v != []} for s in samples]


def _catalog_kind(model: str, memory_bytes: int) -> str:
    """The catalog's name for a GPU (the head looks it up to know its memory): "A100-80GB" or "H100"."""
    sized = f"{model}-{round(memory_bytes / (1 << 30))}GB"
    for kind in (sized, model):
        try:
            info = lookup_model(kind)
        except UnknownGpuModel:
            continue
        if abs(info.memory_bytes - memory_bytes) <= 0.1 * max(memory_bytes, 1) or kind == model:
            return kind
    return model


def _code(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return ""


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"
