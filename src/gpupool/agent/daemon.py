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
from collections.abc import Callable, Iterable
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
from gpupool.home import make_private

log = logging.getLogger("gpupool.agent")

API = "/api/v1/agents"
RETRY_DELAY = 1.0  # seconds between attempts to reach an unreachable head
NAME_HELD_RETRY = 5.0  # seconds between registrations while another agent holds this node's name
OUTAGE_LOG_EVERY = 60.0  # seconds between the lines that say the head still cannot be reached


class AgentRefused(RuntimeError):
    """The head refused this agent (bad or revoked join token, a name taken by another backend): fatal."""


class NameHeld(AgentRefused):
    """Another agent holds this node's name and is not lost: at the first registration the agent waits for
    it (this machine may replace it), later it is fatal (this agent was lost and its name taken over)."""


@dataclass
class AgentSettings:
    servers: tuple[str, ...]  # the heads' URLs: the active one and its standbys (tried in turn)
    state_dir: Path
    name: str
    join_token: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    orphan_grace: float = 60.0
    telemetry_interval: float = 1.0  # seconds between GPU samples sent (at most one per heartbeat)
    address: str | None = None  # what other nodes dial for this one (rank 0 is MASTER_ADDR); default: as
    # the head sees it
    rendezvous_ports: tuple[int, int] = (29500, 29999)  # kept free here for MASTER_PORT of gangs' rank 0


class Outage:
    """Failed calls to the head, said in the log without a line a second: the first failure, then one line
    a minute with how long it has lasted, and a line when the head answers again."""

    def __init__(self, node: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.node, self._clock = node, clock
        self._lock = threading.Lock()
        self._since: float | None = None  # when the first call of this outage failed (None: no outage)
        self._said = 0.0  # when the log last said so
        self._failures = 0

    def failed(self, event: str, server: str, error: str) -> None:
        now = self._clock()
        with self._lock:
            self._failures += 1
            first = self._since is None
            if self._since is None:
                self._since = now
            elif now - self._said < OUTAGE_LOG_EVERY:
                return
            self._said, since, failures = now, self._since, self._failures
        if first:
            log.warning("event=%s node=%s server=%s error=%r", event, self.node, server, error)
        else:
            log.warning(
                "event=%s node=%s server=%s failing_for=%.0fs failures=%d error=%r",
                event, self.node, server, now - since, failures, error,
            )  # fmt: skip

    def answered(self) -> None:
        with self._lock:
            since, failures = self._since, self._failures
            self._since, self._failures = None, 0
        if since is not None:
            log.info(
                "event=head_reachable_again node=%s after=%.1fs failures=%d",
                self.node, self._clock() - since, failures,
            )  # fmt: skip


class Agent:
    def __init__(self, settings: AgentSettings, gpus: GpuProvider | None) -> None:
        self.settings = settings
        self.gpus = gpus
        # Its user's only (as the head's home): it holds the node credential and the ranks' fencing tokens.
        make_private(settings.state_dir)
        self._exited = threading.Event()
        self.attempts = NodeAttempts(settings.state_dir, on_exit=self._exited.set)
        self.attempts.load()
        # The head's instructions (active health checks, fault injection); a reply is sent at once.
        self.tasks = NodeTasks(gpus, settings.name, on_done=self._exited.set)
        self._credential = self._load_credential()
        self._head = 0  # which of settings.servers is called now
        self._http, self._report_http = self._clients()
        self._send_lock = threading.Lock()
        self.interval = 1.0
        self.last_contact = time.monotonic()
        self._sampled_at = float("-inf")  # when GPU samples were last sent
        self._orphaned = False
        self._outage = Outage(settings.name)
        self._lease_warned: float | None = None  # the head's node lease last warned about
        self._stop = threading.Event()
        self._stopped_by = ""  # what asked the agent to stop (a signal's name)
        # The head's version of the newest answer applied (-1: none since joining). The long-poll and the
        # exit report are two heartbeats that may be answered in one order and applied in the other.
        self._applied_version = -1

    @property
    def server(self) -> str:
        """The head's URL this agent calls now."""
        return self.settings.servers[self._head]

    def _clients(self) -> tuple[httpx.Client, httpx.Client]:
        """The long-poll's client and the exit reporter's, to the head called now."""
        head, tls = self.server.rstrip("/"), tls_for(self.server)
        return (
            httpx.Client(base_url=head, timeout=30.0, verify=tls),
            httpx.Client(base_url=head, timeout=10.0, verify=tls),
        )

    def _next_head(self) -> None:
        """Call the next of several heads (a standby takes over the store when the active head dies, and
        listens only then): after a call to this one could not connect."""
        if len(self.settings.servers) < 2:
            return
        self._head = (self._head + 1) % len(self.settings.servers)
        old = self._http
        # The reporter thread may be in a call on its client: that one is left to the garbage collector.
        self._http, self._report_http = self._clients()
        old.close()
        log.info("event=head_tried node=%s server=%s", self.settings.name, self.server)

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
            json.dump({"server": self.server, "name": self.settings.name, "credential": credential}, fh)
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
        self._check_lease(answer.get("lease"))
        self._outage.answered()
        with self._send_lock:
            self._applied_version = -1  # a restarted head counts its versions from 0 again
        log.info("event=agent_joined node=%s server=%s", self.settings.name, self.server)

    def _check_lease(self, lease: object) -> None:
        """Say once (per lease the head answers) when the orphan grace is shorter than the head's node lease:
        a head outage between the two would stop work the head keeps waiting for."""
        grace = self.settings.orphan_grace
        if not isinstance(lease, int | float) or grace >= lease or lease == self._lease_warned:
            return
        self._lease_warned = lease
        log.warning(
            "event=orphan_grace_below_lease node=%s: --orphan-grace %gs is shorter than the head's node "
            "lease of %gs: a head outage longer than %gs stops this node's work, which the head would not "
            "have moved (it waits a lease before it sees a node lost); give --orphan-grace longer than the "
            "lease, e.g. --orphan-grace %gs",
            self.settings.name, grace, lease, grace, max(60.0, 2 * lease),
        )  # fmt: skip

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
        # The agent's clock when it sent the report: the head measures this node's clock against its own by
        # it and keeps the samples on its own clock (an agent's clock may be hours off).
        body["sent_at"] = time.time()
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
        self._orphaned = False
        self._outage.answered()

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
                self._outage.failed("head_unreachable", self.server, str(exc))
                self._check_orphans()
                self._next_head()
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
                self._outage.failed("heartbeat_failed", self.server, str(exc))
                self._check_orphans()
                if isinstance(exc, httpx.TransportError):  # no answer; a head that answers an error is alive
                    self._next_head()
                self._stop.wait(RETRY_DELAY)
            except OSError as exc:  # its state dir's disk (full, gone): heartbeats go on, and say it
                log.error("event=agent_state_dir_error node=%s error=%r", self.settings.name, str(exc))
                self._stop.wait(RETRY_DELAY)
        self._say_stopping()

    def _say_stopping(self) -> None:
        """The agent stops, its ranks do not (an agent restart must not stop work): say how many run on."""
        running = self.attempts.running_count()
        line = "event=agent_stopping node=%s by=%s running_ranks=%d"
        if not running:
            log.info(line, self.settings.name, self._stopped_by or "stop", running)
            return
        log.warning(
            line + ": they run on (by design); an agent started again on this node re-adopts them, or kills "
            "them if the head has moved their work meanwhile (no orphan grace applies until then)",
            self.settings.name, self._stopped_by or "stop", running,
        )  # fmt: skip

    def _report_exits(self) -> None:
        while not self._stop.is_set():
            if not self._exited.wait(0.5) or self._stop.is_set():
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

    def stop(self, by: str = "") -> None:
        """End `run` after the call to the head under way (`by`: what asked, for the log: SIGTERM)."""
        self._stopped_by = by
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
