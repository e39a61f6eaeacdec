"""The running server's parts, wired once at start: store, GPUs, backend, reconcile loop."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpupool.api.ratelimit import DEFAULT_BURST, DEFAULT_RATE
from gpupool.backends.base import Backend
from gpupool.backends.local import LocalBackend
from gpupool.control import queues, secrets
from gpupool.control.accounting import load_prices
from gpupool.control.autoscale import Autoscaler, Load
from gpupool.control.health import HealthMonitor
from gpupool.control.health_state import AgentNodes
from gpupool.control.loop import Reconciler
from gpupool.control.metrics import Metrics
from gpupool.control.notify import Notifier
from gpupool.control.readiness import ReadinessProber
from gpupool.control.restarts import DEFAULT_BASE
from gpupool.control.secret_keys import key_path, open_keys
from gpupool.control.settings import ControlSettings
from gpupool.control.telemetry import SAVED_FROM, StoreAllocations, TelemetryCache
from gpupool.control.telemetry_log import open_log, save_loop
from gpupool.gpu import GpuProvider, open_provider
from gpupool.health.thresholds import load_config
from gpupool.store.db import Store, StoreError
from gpupool.store.head_lock import HeadLock

log = logging.getLogger("gpupool.server")

BACKENDS = ("local", "slurm", "agent")  # `gpupool server --backend`: where attempts run


@dataclass(frozen=True)
class ServerSettings:
    db_url: str
    home: Path
    gpus: str = "auto"
    node_name: str = field(default_factory=socket.gethostname)
    tick: float = 0.5
    telemetry_interval: float = 1.0
    usage_weight: float = 0.0  # fair share by decayed history: 0 off (see control.loop.ControlSettings)
    usage_half_life: float = 7 * 86400.0
    restart_backoff: float = DEFAULT_BASE  # seconds to wait after a quick exit (control/restarts.py)
    backend: str = "local"
    partition: str | None = None  # slurm: the partition whose nodes gpupool schedules (None: every node)
    node_lease: float = 10.0  # agent: a node with no heartbeat for this long is lost (docs/agents.md)
    rate_limit: float = DEFAULT_RATE  # API calls a second per token, sustained (api/ratelimit.py); 0: none
    rate_burst: int = DEFAULT_BURST  # API calls at once per token
    notify_hosts: frozenset[str] = frozenset()  # hosts workloads' notifications may go to; "*": any
    private_logs: bool = False  # a workload's output is read by its owner and admins only (--private-logs)
    # The file of the keys of users' secrets (--secrets-key-file, control/secret_keys.py); None:
    # $GPUPOOL_HOME/secrets.key, made at the first start.
    secrets_key_file: Path | None = None


class Runtime:
    def __init__(
        self, settings: ServerSettings, store: Store | None = None, head_lock: HeadLock | None = None
    ) -> None:
        self.settings = settings
        # The store's head lock this head holds (store/head_lock.py); None: not taken (tests, tools).
        self.head_lock = head_lock
        self.fenced = ""  # why this head stopped acting: another head took the store over
        self.on_fenced: Callable[[], None] = lambda: None  # what else stops then (the API's server)
        self.store = store or Store(settings.db_url)
        queues.ensure_default_queue(self.store)
        # SecretKeyError (a ValueError) names the key file and the fix; then what is still plain text in the
        # store is encrypted, before the API serves (control/secrets.py).
        self.secret_keys = open_keys(
            key_path(settings.home, settings.secrets_key_file), create=settings.secrets_key_file is None
        )
        secrets.encrypt_stored(self.store, self.secret_keys)
        self.telemetry = TelemetryCache(allocations=StoreAllocations(self.store), saved_from=SAVED_FROM)
        self.telemetry_log = open_log(settings.home)  # history on disk, bounded (control/telemetry_log.py)
        health_config = load_config(settings.home)  # HealthConfigError (a ValueError) names the file and key
        self.prices = load_prices(settings.home)  # PricesConfigError likewise; None: reports without costs
        if settings.backend not in BACKENDS:
            raise ValueError(f"--backend {settings.backend}: unknown backend; one of {', '.join(BACKENDS)}")
        if settings.partition is not None and settings.backend != "slurm":
            raise ValueError("--partition applies to --backend slurm only; add --backend slurm or drop it")
        # With slurm, Slurm's inventory describes the nodes; the head's own GPUs (if any) are not in the pool.
        self.gpus: GpuProvider | None = open_provider(settings.gpus) if settings.backend == "local" else None
        self.backend: Backend = self._open_backend()
        self.reconciler = Reconciler(
            self.store,
            self.backend,
            self.gpus,
            ControlSettings(
                home=settings.home,
                node_name=settings.node_name,
                tick=settings.tick,
                telemetry_interval=settings.telemetry_interval,
                usage_weight=settings.usage_weight,
                usage_half_life=settings.usage_half_life,
                restart_backoff=settings.restart_backoff,
                secret_keys=self.secret_keys,
            ),
            self.telemetry,
        )
        self.health = HealthMonitor(
            self.store,
            self.telemetry,
            health_config,
            local_node=settings.node_name,
            local_gpus=self.gpus,
            agents=self._agent_nodes(),
            wake=self._wake,
        )
        self.readiness = ReadinessProber(self.store)
        self.load = Load()  # what the proxy carries per service (control/autoscale.py)
        self.autoscaler = Autoscaler(
            self.store,
            self.load,
            self.reconciler.wake,
            readiness=lambda: self.readiness.state,  # a scale-down removes replicas that serve least first
            live=lambda: self.reconciler.explanations,
        )
        self.reconciler.draining = self.load.draining  # a replica being removed answers what it was given
        self.notifier = Notifier(self.store, settings.notify_hosts)  # control/notify.py
        self.metrics = Metrics(
            self.store,
            self.telemetry,
            self.health,
            lambda: self.reconciler.fair_shares,
            lambda: self.reconciler.explanations,
            lambda: self.readiness.state,
            lambda: self.autoscaler.words,
            lambda: self.reconciler.budgets.state,
        )
        self.reconciler.cycle_observer = self.metrics.cycle_seconds.observe
        self.reconciler.direct_binds = self.health.jobs.binds  # check jobs (control/health_jobs.py)
        self.reconciler.head_lock_lost = self._head_lock_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._health_thread: threading.Thread | None = None
        self._save_thread: threading.Thread | None = None
        self._readiness_thread: threading.Thread | None = None
        self._autoscale_thread: threading.Thread | None = None
        self._notify_thread: threading.Thread | None = None

    def _open_backend(self) -> Backend:
        if self.settings.backend == "agent":
            from gpupool.backends.agent import AgentBackend
            from gpupool.control.agents import agent_node_names, record_heartbeats

            return AgentBackend(
                lease=self.settings.node_lease,
                on_change=self._wake,
                on_telemetry=self.telemetry.put,
                known_nodes=agent_node_names(self.store),
                on_heartbeats=lambda seen: record_heartbeats(self.store, seen),
            )
        if self.settings.backend == "slurm":
            from gpupool.backends.slurm import SlurmBackend

            return SlurmBackend(partition=self.settings.partition, on_change=self._wake)
        return LocalBackend(on_exit=self._wake)

    def _agent_nodes(self) -> AgentNodes | None:
        """The agent backend, through which health checks and faults reach agent nodes."""
        from gpupool.backends.agent import AgentBackend

        return self.backend if isinstance(self.backend, AgentBackend) else None

    def _head_lock_lost(self) -> str:
        """Before each pass: "" while this head holds the store's head lock, else why the pass is not made.
        Taken by another head (this one's connection to the store was lost meanwhile): this head stops."""
        if self.head_lock is None:
            return ""
        standing = self.head_lock.check()
        if standing == "retaken":
            log.warning(
                "event=head_lock_retaken: its connection to the store was lost; no other head took it"
            )
            self.reconciler.failures.clear()  # the store answers again: /readyz need not wait
        if standing in ("held", "retaken"):
            return ""
        if standing == "unreachable":
            return "the store is out of reach: this head cannot tell that it still holds its head lock"
        if not self.fenced:
            try:
                holder = self.head_lock.holder() or "unknown"
            except StoreError:
                holder = "unknown (the store went out of reach again)"
            self.fenced = f"another head took the store over: {holder}"
            log.critical("event=head_fenced reason=%r: this head stops acting and exits", self.fenced)
            self._stop.set()  # every loop of this head ends at its next wait
            self.on_fenced()
        return self.fenced

    def _wake(self) -> None:
        """What the backend and the health monitor call when they observe a change."""
        self.reconciler.wake(observed=True)

    def start(self) -> None:
        self.reconciler.register_node()
        self.reconciler.sync_inventory()
        self.reconciler.recover()
        self.notifier.prepare()
        watch = getattr(self.backend, "watch", None)
        if watch is not None:
            watch()
        self._thread = threading.Thread(
            target=self.reconciler.run, args=(self._stop,), name="reconcile", daemon=True
        )
        self._thread.start()
        self._health_thread = threading.Thread(
            target=self.health.run, args=(self._stop,), name="health", daemon=True
        )
        self._health_thread.start()
        self._save_thread = threading.Thread(
            target=save_loop, args=(self.telemetry, self.telemetry_log, self._stop), name="telemetry-save",
            daemon=True,
        )  # fmt: skip
        self._save_thread.start()
        self._readiness_thread = threading.Thread(
            target=self.readiness.run, args=(self._stop,), name="readiness", daemon=True
        )
        self._readiness_thread.start()
        self._autoscale_thread = threading.Thread(
            target=self.autoscaler.run, args=(self._stop,), name="autoscale", daemon=True
        )
        self._autoscale_thread.start()
        self._notify_thread = threading.Thread(
            target=self.notifier.run, args=(self._stop,), name="notify", daemon=True
        )
        self._notify_thread.start()
        log.info(
            "event=control_started backend=%s node=%s gpus=%s",
            self.backend.name,
            self.settings.node_name,
            self.settings.gpus,
        )

    def wake(self) -> None:
        self.reconciler.wake()

    def stop(self) -> None:
        """Stop the loop; running jobs keep running and are re-adopted by the next start."""
        self._stop.set()
        self.reconciler.wake()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._health_thread is not None:
            self._health_thread.join(timeout=10)
        if self._save_thread is not None:
            self._save_thread.join(timeout=10)
        if self._readiness_thread is not None:
            self._readiness_thread.join(timeout=10)
        if self._autoscale_thread is not None:
            self._autoscale_thread.join(timeout=10)
        if self._notify_thread is not None:
            self._notify_thread.join(timeout=10)
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()
        if self.gpus is not None:
            self.gpus.close()
        self.store.close()
