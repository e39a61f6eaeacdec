"""The reconcile loop: compares desired state in the store with what runs, and acts idempotently.

Each pass: (1) observe every running attempt and carry out stops (cancel, max_duration, grace expiry),
(2) schedule pending workloads through the pure scheduler, (3) sample GPUs. Killing the server at any
instant loses nothing: `recover()` re-reads the store at start and re-adopts or settles every attempt.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import bindparam, or_, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from gpupool import scheduler
from gpupool.backends.base import Backend, Handle, Launch, LaunchError, Phase, Pod, Status
from gpupool.control import contract, inventory
from gpupool.control.lifecycle import CANCELLED, FAILED, PENDING, RUNNING, SUCCEEDED, transition
from gpupool.control.node_views import NodeViews
from gpupool.control.policy import BandedPass, BandNotes, load_policy, reword_preemptions
from gpupool.control.telemetry import TelemetryCache
from gpupool.control.usage import AttainedService, attempt_gpus, queue_usage
from gpupool.gpu import GpuProvider
from gpupool.spec import parse_gpu_request
from gpupool.spec.views import queue_view
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Event, Gpu, Node, Queue, Workload
from gpupool.timeutil import age_seconds, as_utc, utcnow

log = logging.getLogger("gpupool.control")

STOP_CANCEL, STOP_TIMEOUT = "cancelled", "max_duration"
STOP_DRAIN = "drain"  # set by service.drain_node on the attempts of a draining node; the loop stops them
EVICTIONS = frozenset({"reclaim", "preempt", "consolidate", "stale-gang"})
EVICTED = "evicted"
PID_GRACE = 10.0  # seconds an attempt may exist without a pid before it counts as never started
MIN_PASS_INTERVAL = 0.02  # seconds between the starts of two passes, however many events arrive
EXPLAIN_PERSIST_INTERVAL = 5.0  # seconds between writes of changed reason codes to the store
EXPLAIN_BATCH = 200
PASS_DUTY = 4.0  # after a pass of t seconds, the next starts no sooner than PASS_DUTY * t later
USAGE_REFRESH = 30.0  # seconds between recomputations of the queues' decayed usage
USAGE_HORIZON_HALF_LIVES = 10  # attempts that ended longer ago than this many half-lives are ignored
BY_SERVICE = ("attained", "las")  # orderings that rank pending work by the service it already received


@dataclass(frozen=True)
class ControlSettings:
    home: Path
    node_name: str = socket.gethostname()
    node_address: str = "127.0.0.1"
    tick: float = 0.5
    telemetry_interval: float = 1.0
    # Fair share by history: 0 ignores it; 1 halves the over-quota weight of a queue that used twice its
    # share (see scheduler/fairshare.py). Usage decays with this half-life (Slurm's default: 7 days).
    usage_weight: float = 0.0
    usage_half_life: float = 7 * 86400.0
    # The scheduling policy; None: $GPUPOOL_HOME/scheduling.yaml, else gpupool's default (control/policy.py).
    policy: scheduler.SchedulerConfig | None = None


class Reconciler:
    def __init__(
        self,
        store: Store,
        backend: Backend,
        gpus: GpuProvider | None,
        settings: ControlSettings,
        telemetry: TelemetryCache | None = None,
    ) -> None:
        self.store = store
        self.backend = backend
        self.gpus = gpus
        self.settings = settings
        self.telemetry = telemetry or TelemetryCache()
        self._wake = threading.Event()
        self._prompt = threading.Event()  # an observed change: cut the pacing pause short (see run)
        self._stopping: threading.Event | None = None
        self._last_sample = 0.0
        self._reasons: dict[int, scheduler.Explanation] = {}
        self._attached: dict[int, tuple[int, ...]] = {}
        self._views: dict[int, scheduler.WorkloadView] = {}
        self._resumable: set[int] = set()  # cached workloads whose spec declares a checkpoint
        # Answers an unchanged snapshot from memory (views above are reused, so comparing is cheap).
        self._scheduler = scheduler.Scheduler()
        policy = settings.policy if settings.policy is not None else load_policy(settings.home)
        self._config = replace(policy, usage_weight=settings.usage_weight)
        self._band_notes = BandNotes(self._config)  # "why pending" in words, for work in a lower band
        self._usage_cache: tuple[float, dict[str, float]] | None = None
        self._attained = AttainedService()  # earlier attempts' GPU-seconds, for least-attained-service order
        self._node_views: dict[str, scheduler.NodeView] = {}
        self._nodes = NodeViews()  # read again only where a node changed (control/node_views.py)
        self.fair_shares: dict[str, dict[str, float]] = {}
        # The queues as the last pass weighed them (young-work weights applied): `gpupool queues` shows them.
        self.pass_queues: tuple[scheduler.QueueView, ...] = ()
        self.explanations: dict[int, scheduler.Explanation] = {}
        self._explained_at = 0.0
        self._inventory_generation = 0  # of the backend inventory last applied; 0: none (local backend)
        # Held while an inventory is taken from the backend and applied, and while a node joins (its store
        # row, then the backend's record): an inventory taken before the join but applied after it would say
        # the new node is gone (`lost`, then back from lost: cordoned until it passes the active checks).
        self.inventory_lock = threading.Lock()
        self.cycle_observer: Callable[[float], None] | None = None  # metrics: seconds of each schedule()
        # Binds decided outside the scheduler (the health loop's check jobs, control/health_jobs.py), started
        # before each pass schedules, so its snapshot sees them as running work.
        self.direct_binds: Callable[[], list[scheduler.Bind]] | None = None

    # -- lifecycle of the loop ------------------------------------------------------------------------

    def wake(self, *, observed: bool = False) -> None:
        """Ask for a pass: for new desired state (a submit), the next paced one; for a change a backend
        or the health checks observed (an attempt exited, a node changed), one as soon as the CPU the
        last pass used allows (see run)."""
        self._wake.set()
        if observed or (self._stopping is not None and self._stopping.is_set()):
            self._prompt.set()

    def run(self, stop: threading.Event) -> None:
        self._stopping = stop
        while not stop.is_set():
            started, cpu = time.monotonic(), time.thread_time()
            try:
                self.tick()
            except Exception:  # one bad pass must not stop the pool; the next pass retries
                log.exception("event=reconcile_failed")
            took, used = time.monotonic() - started, time.thread_time() - cpu
            self._wake.wait(self.settings.tick)
            self._wake.clear()
            # A burst of events (many submits) is served by one pass, not one pass per event; and a long
            # pass (many pending workloads) is followed by a proportionate pause so the API keeps the CPU.
            # An observed change (an attempt exited: its GPUs wait for the next job) cuts the pause down
            # to PASS_DUTY times the CPU the pass used: the time it spent waiting (on Slurm's sbatch, on
            # the API's threads) took no CPU from the API.
            spare = max(MIN_PASS_INTERVAL, PASS_DUTY * used) - (time.monotonic() - started)
            if spare > 0:
                stop.wait(spare)
            spare = max(MIN_PASS_INTERVAL, PASS_DUTY * took) - (time.monotonic() - started)
            if spare > 0 and not self._prompt.is_set():
                self._prompt.wait(spare)
            self._prompt.clear()

    def tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.sync_inventory()
        self.observe(now)
        # A node whose lease ran out since the inventory above had its attempts ended as node-lost just
        # now: it leaves the store's ready nodes before this pass places their retries (back on it).
        self.sync_inventory()
        for bind in self.direct_binds() if self.direct_binds is not None else ():
            self._start(bind)
        started = time.perf_counter()
        self.schedule(now)
        if self.cycle_observer is not None:
            self.cycle_observer(time.perf_counter() - started)
        # A backend that holds on to what this pass settled until its successors are started (Slurm's
        # hand-off) lets the rest go now.
        pass_finished = getattr(self.backend, "pass_finished", None)
        if pass_finished is not None:
            pass_finished()
        if self.gpus is not None and now - self._last_sample >= self.settings.telemetry_interval:
            self._last_sample = now
            self.sample_gpus(now)

    # -- node registration ----------------------------------------------------------------------------

    def register_node(self) -> None:
        """Create or refresh this machine's node row from what the GPU provider discovers."""
        if self.gpus is None:
            return
        devices = self.gpus.devices()
        with self.store.session() as s:
            node = s.scalar(select(Node).where(Node.name == self.settings.node_name))
            if node is None:
                node = Node(name=self.settings.node_name, state="ready", labels={})
                s.add(node)
            node.address = self.settings.node_address
            node.backend = self.backend.name
            node.cpus = float(psutil.cpu_count() or 1)
            node.memory_bytes = int(psutil.virtual_memory().total)
            node.last_heartbeat = utcnow()
            by_index = {g.index: g for g in node.gpus}
            for device in devices:
                gpu = by_index.pop(device.index, None) or Gpu(index=device.index)
                gpu.uuid, gpu.model, gpu.product_name = device.uuid, device.model, device.name
                gpu.memory_bytes, gpu.nvlink_island = device.memory_bytes, device.nvlink_island
                gpu.simulated = device.simulated
                if gpu.id is None:
                    node.gpus.append(gpu)
            for gone in by_index.values():
                node.gpus.remove(gone)
        log.info("event=node_registered node=%s gpus=%d", self.settings.node_name, len(devices))

    def sync_inventory(self) -> None:
        """Bring the store's nodes and foreign jobs up to the backend's inventory, when it keeps one
        (Slurm) and it changed since the last pass."""
        with self.inventory_lock:
            current = self.backend.inventory()
            if current is None or current.generation == self._inventory_generation:
                return
            inventory.apply(self.store, self.backend.name, current)
            self._inventory_generation = current.generation
        # A GPU its node no longer lists (fell off the bus, node back without it) leaves the telemetry too.
        self.telemetry.keep_listed(
            {n.name: [d.index for d in n.devices] or range(sum(c for _, c in n.gpus)) for n in current.nodes}
        )

    # -- restart safety -------------------------------------------------------------------------------

    def recover(self) -> None:
        """At start: every attempt the store says is running is re-adopted or settled with a reason."""
        with self.store.session() as s:
            attempts = s.scalars(select(Attempt).where(Attempt.state == RUNNING)).all()
            for attempt in attempts:
                handle = self._handle(attempt)
                if handle is None:
                    continue
                state = self.backend.status(handle, Path(attempt.run_dir))
                if state.phase is Phase.RUNNING:
                    log.info(
                        "event=attempt_adopted workload=%d attempt=%d pid=%d",
                        attempt.workload_id,
                        attempt.number,
                        handle.pid,
                    )
                else:
                    self._finish(s, attempt, state, time.time())

    # -- observe --------------------------------------------------------------------------------------

    def observe(self, now: float) -> None:
        """Look at every running attempt read-only; write only for those that need something done."""
        with self.store.read() as s:
            rows = s.execute(
                select(Attempt, Workload.cancel_requested, Workload.spec)
                .join(Workload, Attempt.workload_id == Workload.id)
                .where(Attempt.state == RUNNING, self._observed())
            ).all()
            due = [attempt.id for attempt, cancel, spec in rows if self._needs_action(attempt, cancel, spec)]
        if not due:
            return
        with self.store.session() as s:
            for attempt_id in due:
                attempt = s.get(Attempt, attempt_id)
                if attempt is None or attempt.state != RUNNING:
                    continue
                try:
                    with s.begin_nested():
                        self._observe_one(s, attempt, now)
                except StaleDataError:
                    log.info("event=observe_conflict workload=%d", attempt.workload_id)

    def _observed(self) -> Any:
        """Which running attempts this head observes: those on its own node, or on the backend's nodes."""
        if not self._inventory_generation:
            return Attempt.node_name == self.settings.node_name
        return Attempt.node_name.in_(select(Node.name).where(Node.backend == self.backend.name))

    def _needs_action(self, attempt: Attempt, cancel_requested: bool, spec: dict[str, Any]) -> bool:
        if attempt.pid is None:
            return True
        handle = Handle(attempt.pid, attempt.pid_start_time or 0.0)
        if self.backend.status(handle, Path(attempt.run_dir)).phase is not Phase.RUNNING:
            return True
        if attempt.stop_requested_at is None:
            max_duration = spec.get("max_duration")
            return (
                cancel_requested
                or attempt.stop_reason == STOP_DRAIN
                or bool(max_duration and age_seconds(attempt.started_at) > float(max_duration))
            )
        if attempt.killed_at is None:
            return age_seconds(attempt.stop_requested_at) >= float(spec.get("grace_period", 30.0))
        return False

    def _observe_one(self, s: Session, attempt: Attempt, now: float) -> None:
        handle = self._handle(attempt)
        if handle is None:
            if age_seconds(attempt.started_at) > PID_GRACE:
                self._finish(s, attempt, Status(Phase.VANISHED, detail="the attempt never started"), now)
            return
        state = self.backend.status(handle, Path(attempt.run_dir))
        if state.phase is not Phase.RUNNING:
            self._finish(s, attempt, state, now)
            return
        workload = attempt.workload
        spec = workload.spec
        if attempt.stop_requested_at is None:
            max_duration = spec.get("max_duration")
            if workload.cancel_requested:
                self._request_stop(s, attempt, handle, STOP_CANCEL)
            elif max_duration and age_seconds(attempt.started_at) > float(max_duration):
                self._request_stop(s, attempt, handle, STOP_TIMEOUT)
            elif attempt.stop_reason == STOP_DRAIN:
                self._request_stop(s, attempt, handle, STOP_DRAIN)
        elif attempt.killed_at is None:
            grace = float(spec.get("grace_period", 30.0))
            if age_seconds(attempt.stop_requested_at) >= grace:
                self.backend.signal(handle, signal.SIGKILL)
                attempt.killed_at = utcnow()
                log.info(
                    "event=attempt_killed workload=%d attempt=%d grace=%s",
                    attempt.workload_id,
                    attempt.number,
                    grace,
                )

    def _request_stop(self, s: Session, attempt: Attempt, handle: Handle, why: str) -> None:
        self.backend.signal(handle, signal.SIGTERM)
        attempt.stop_requested_at = utcnow()
        attempt.stop_reason = why
        log.info(
            "event=attempt_stopping workload=%d attempt=%d why=%s", attempt.workload_id, attempt.number, why
        )

    def _handle(self, attempt: Attempt) -> Handle | None:
        if attempt.pid is not None:
            return Handle(attempt.pid, attempt.pid_start_time or 0.0)
        found = self.backend.find(Path(attempt.run_dir))
        if found is not None:
            attempt.pid, attempt.pid_start_time = found.pid, found.start_time
        return found

    def _finish(self, s: Session, attempt: Attempt, state: Status, now: float) -> None:
        """Settle an attempt that ended, and move its workload on (done, retry, or failed)."""
        del now
        handle = self._handle(attempt)
        if handle is not None:
            self.backend.cleanup(handle)
        workload = attempt.workload
        code = state.exit_code
        attempt.exit_code = code
        attempt.finished_at = utcnow()
        workload.exit_code = code
        killed = " (killed after the grace period)" if attempt.killed_at else ""
        if attempt.stop_reason == STOP_CANCEL or (workload.cancel_requested and code != 0):
            attempt.state = CANCELLED
            attempt.reason = f"cancelled; exit code {code}{killed}"
            transition(s, workload, CANCELLED, attempt.reason, actor="control")
            return
        if attempt.stop_reason == STOP_DRAIN:
            attempt.state = EVICTED
            attempt.reason = f"node drained; exit code {code}{killed}"
            transition(
                s, workload, PENDING, "node drained; requeued to resume from its checkpoint", actor="control"
            )
            return
        if attempt.stop_reason in EVICTIONS:
            attempt.state = EVICTED
            attempt.reason = f"{attempt.reason}; exit code {code}{killed}"
            cause = "node-failure" if attempt.stop_reason == "stale-gang" else "preemption"
            self._requeue_after_eviction(s, workload, attempt.stop_reason, cause)
            return
        if attempt.stop_reason == STOP_TIMEOUT:
            attempt.state = FAILED
            limit = workload.spec.get("max_duration")
            attempt.reason = f"exceeded max_duration ({limit:g}s); exit code {code}{killed}"
            transition(s, workload, FAILED, attempt.reason, actor="control")
            return
        if state.phase is Phase.EXITED and code == 0:
            attempt.state = SUCCEEDED
            attempt.reason = "exit code 0"
            transition(s, workload, SUCCEEDED, "exit code 0", actor="control")
            return
        attempt.state = FAILED
        attempt.reason = f"exit code {code}" if state.phase is Phase.EXITED else f"lost: {state.detail}"
        self._retry_or_fail(s, workload, attempt.reason, state.cause)

    def _requeue_after_eviction(self, s: Session, workload: Workload, code: str, cause: str) -> None:
        """Preempted work goes back to pending (it resumes from its checkpoint) unless its retry policy
        leaves `preemption` out; a preemption uses no restart from `max_restarts`, a node failure does."""
        retry = workload.spec.get("retry") or {}
        if cause == "preemption" and cause in (retry.get("on") or []):
            transition(
                s,
                workload,
                PENDING,
                f"evicted ({code}); requeued to resume from its checkpoint",
                actor="control",
            )
            return
        self._retry_or_fail(s, workload, f"evicted ({code})", cause)

    def _retry_or_fail(self, s: Session, workload: Workload, why: str, cause: str) -> None:
        retry = workload.spec.get("retry") or {}
        max_restarts = int(retry.get("max_restarts", 0))
        if cause in (retry.get("on") or []) and workload.restarts < max_restarts:
            verdict = transition(
                s,
                workload,
                PENDING,
                f"{why}; restarting ({workload.restarts + 1}/{max_restarts})",
                actor="control",
                is_retry=True,
            )
            if verdict.accepted:
                return
        transition(s, workload, FAILED, why, actor="control")

    # -- schedule -------------------------------------------------------------------------------------

    def schedule(self, now: float) -> None:
        with self.store.read() as s:
            snapshot = self._snapshot(s, now)
        if not snapshot.pending and not snapshot.running:
            self.fair_shares, self.pass_queues = {}, ()
            return
        decisions = self._scheduler.decide(snapshot, now)
        self.fair_shares, self.pass_queues = decisions.fair_shares, snapshot.queues
        self._band_notes.add(decisions.explanations, snapshot.pending, snapshot.queues)
        # Reasons first: starting many binds can take a while, and work left pending says why meanwhile.
        self._explain(decisions.explanations)
        if decisions.evictions:
            self._evict(
                reword_preemptions(decisions.evictions, snapshot.pending, snapshot.running, self._config)
            )
        for bind in decisions.binds:
            self._start(bind)

    def _snapshot(self, s: Session, now: float | None = None) -> scheduler.Snapshot:
        now = time.time() if now is None else now
        config = self._config
        pending = [
            (int(wid), int(priority))
            for wid, priority in s.execute(
                select(Workload.id, Workload.priority).where(Workload.state == PENDING).order_by(Workload.id)
            )
        ]
        attempts = s.execute(
            select(
                Attempt.workload_id,
                Workload.priority,
                Attempt.node_name,
                Attempt.gpu_indices,
                Attempt.gpu_fraction,
                Attempt.started_at,
                Attempt.stop_requested_at,
                Attempt.pods,
            )
            .join(Workload, Attempt.workload_id == Workload.id)
            .where(Attempt.state == RUNNING)
            .order_by(Attempt.workload_id)
        ).all()
        self._cache_views(s, [wid for wid, _ in pending] + [row[0] for row in attempts])
        queue_rows = s.scalars(select(Queue).order_by(Queue.name)).all()
        usage = self._usage(s, {q.name: q.parent for q in queue_rows})
        queues = tuple(replace(_queue_view(q), usage=usage.get(q.name, 0.0)) for q in queue_rows)
        # Attained service is read where something ranks or weighs by it: las / attained ordering, the
        # policy's bands and young-work weights (control/policy.py).
        by_service = (
            bool(config.young_weights)
            or config.ordering in BY_SERVICE
            or any(q.ordering in BY_SERVICE for q in queues)
        )
        bands = BandedPass(config, queues) if by_service else None
        started = [as_utc(row[5]) for row in attempts]
        keys = [
            (row[0], start.timestamp() if start else 0.0)
            for row, start in zip(attempts, started, strict=True)
        ]
        earlier = self._attained.of_running(s, keys) if bands is not None else {}
        running = []
        for row, start, key in zip(attempts, started, keys, strict=True):
            wid, priority, node, indices, fraction, _, stopping, pods = row
            placement = tuple(
                scheduler.PodPlacement(
                    p["node"], tuple(int(i) for i in p["gpu_indices"]), p.get("gpu_fraction") or 1.0
                )
                for p in pods or ()
            ) or (scheduler.PodPlacement(node, tuple(int(i) for i in indices), fraction or 1.0),)
            view = self._views[wid]
            if bands is not None:
                # The running attempt's GPU-seconds so far count: its band and weight change as it runs.
                ran = max(0.0, now - key[1]) * attempt_gpus(indices, fraction, pods) if start else 0.0
                priority = bands.priority(priority, earlier[key] + ran, view.queue, wid in self._resumable)
            running.append(
                replace(
                    view,
                    priority=priority,
                    placement=placement,
                    start_time=start.timestamp() if start else None,
                    stopping=stopping is not None,
                )
            )
        nodes = self._nodes.read(self.store)
        if self._inventory_generation:
            nodes = inventory.with_foreign_use(s, nodes, running)
        nodes = tuple(self._same_view(view) for view in nodes)
        if bands is not None:
            for wid, attained in self._attained.of(s, [wid for wid, _ in pending]).items():
                if self._views[wid].attained_service != attained:
                    self._views[wid] = replace(self._views[wid], attained_service=attained)
        # Priority is read fresh each pass: it is the one field an operator may change while work waits.
        views = []
        for wid, priority in pending:
            view = self._views[wid]
            if bands is not None:
                priority = bands.priority(priority, view.attained_service, view.queue)
            if view.priority != priority:
                view = self._views[wid] = replace(view, priority=priority)
            views.append(view)
        if bands is not None:
            queues = bands.queues(queues)
        return scheduler.Snapshot(nodes, tuple(views), queues, tuple(running), config)

    def _same_view(self, view: scheduler.NodeView) -> scheduler.NodeView:
        """The view of the last pass when nothing changed: the scheduler then recognises the node (and an
        unchanged snapshot) by identity, which is cheaper than by value."""
        last = self._node_views.get(view.name)
        if last is view or (last is not None and last == view):
            return last
        self._node_views[view.name] = view
        return view

    def _usage(self, s: Session, parents: dict[str, str | None]) -> dict[str, float]:
        """Decayed GPU-seconds per queue, recomputed from the attempts at most every USAGE_REFRESH s or a
        hundredth of the half-life (it changes slowly; an unchanged snapshot lets the scheduler answer from
        memory)."""
        settings = self.settings
        if settings.usage_weight <= 0:
            return {}
        now = time.time()
        refresh = min(USAGE_REFRESH, settings.usage_half_life / 100.0)
        if self._usage_cache is not None and now - self._usage_cache[0] < refresh:
            return self._usage_cache[1]
        horizon = datetime.fromtimestamp(now - USAGE_HORIZON_HALF_LIVES * settings.usage_half_life, UTC)
        rows = s.execute(
            select(Workload.queue, Attempt.gpu_indices, Attempt.gpu_fraction, Attempt.pods,
                   Attempt.started_at, Attempt.finished_at)
            .join(Workload, Attempt.workload_id == Workload.id)
            .where(or_(Attempt.finished_at.is_(None), Attempt.finished_at >= horizon))
        ).all()  # fmt: skip
        intervals = []
        for queue, indices, fraction, pods, started, finished in rows:
            start, end = as_utc(started), as_utc(finished)
            gpus = attempt_gpus(indices, fraction, pods)
            if start is not None:
                intervals.append((queue, gpus, start.timestamp(), end.timestamp() if end else now))
        usage = queue_usage(intervals, parents, now, settings.usage_half_life)
        self._usage_cache = (now, usage)
        return usage

    def _cache_views(self, s: Session, ids: list[int]) -> None:
        """Views of workloads by id; a spec never changes, so each is parsed once and kept."""
        missing = [wid for wid in ids if wid not in self._views]
        for chunk in range(0, len(missing), 500):
            rows = s.execute(
                select(
                    Workload.id,
                    Workload.queue,
                    Workload.nodes,
                    Workload.created_at,
                    Workload.preemptible,
                    Workload.spec,
                    Workload.priority,
                ).where(Workload.id.in_(missing[chunk : chunk + 500]))
            ).all()
            for wid, queue, nodes, created_at, preemptible, spec, priority in rows:
                self._views[wid] = replace(
                    _workload_view(wid, queue, nodes, created_at, preemptible, spec), priority=priority
                )
                if (spec or {}).get("checkpoint"):
                    self._resumable.add(wid)
        if len(self._views) > 2 * len(ids) + 1000:
            wanted = set(ids)
            self._views = {wid: view for wid, view in self._views.items() if wid in wanted}
            self._resumable &= wanted

    def _evict(self, evictions: list[scheduler.Eviction]) -> None:
        """Stop evicted work gracefully (SIGTERM, SIGKILL after the grace period); it is requeued on exit."""
        with self.store.session() as s:
            for eviction in evictions:
                attempt = s.scalar(
                    select(Attempt).where(
                        Attempt.workload_id == eviction.workload_id, Attempt.state == RUNNING
                    )
                )
                if attempt is None or attempt.stop_requested_at is not None:
                    continue
                handle = self._handle(attempt)
                if handle is not None:
                    self.backend.signal(handle, signal.SIGTERM)
                attempt.stop_requested_at = utcnow()
                attempt.stop_reason = eviction.code
                attempt.reason = eviction.reason
                s.add(
                    Event(
                        object_kind="workload",
                        object_id=str(eviction.workload_id),
                        from_state=RUNNING,
                        to_state=RUNNING,
                        reason=f"{eviction.code}: {eviction.reason}",
                        actor="scheduler",
                    )
                )
                log.info(
                    "event=attempt_evicted workload=%d code=%s for=%s reason=%r",
                    eviction.workload_id,
                    eviction.code,
                    eviction.for_workload,
                    eviction.reason,
                )

    def _start(self, bind: scheduler.Bind) -> None:
        home = self.settings.home
        with self.store.session() as s:
            workload = s.get(Workload, bind.workload_id)
            if workload is None or workload.state != PENDING:
                return
            number = len(workload.attempts)
            run_dir = home / "runs" / str(workload.id) / str(number)
            resources = workload.spec.get("resources") or {}
            attempt = Attempt(
                workload_id=workload.id,
                number=number,
                state=RUNNING,
                node_name=bind.node,
                backend=self.backend.name,
                gpu_indices=list(bind.gpu_indices),
                gpu_fraction=bind.gpu_fraction,
                cpus=float(resources.get("cpu") or 0.0),
                memory_bytes=int(resources.get("memory") or 0),
                run_dir=str(run_dir),
                log_path=str(home / "logs" / str(workload.id) / f"attempt-{number}.log"),
                pods=[
                    {"node": p.node, "gpu_indices": list(p.gpu_indices), "gpu_fraction": p.gpu_fraction}
                    for p in bind.pods
                ],
            )
            gpus = ",".join(map(str, bind.gpu_indices)) or "none"
            verdict = transition(
                s, workload, RUNNING, f"started on {bind.node} gpus={gpus}", actor="scheduler"
            )
            if not verdict.accepted:
                return
            s.add(attempt)
            s.flush()
            launch = self._launch(workload, attempt, bind.pods)
        # The attempt is durable before its process exists; a crash here leaves a pid-less attempt that
        # observe() settles after PID_GRACE.
        try:
            handle = self.backend.start(launch)
        except LaunchError as exc:
            with self.store.session() as s:
                attempt = s.get(Attempt, launch.attempt_id)
                assert attempt is not None
                attempt.state, attempt.reason, attempt.finished_at = FAILED, str(exc), utcnow()
                transition(s, attempt.workload, FAILED, f"cannot start: {exc}", actor="control")
            return
        with self.store.session() as s:
            attempt = s.get(Attempt, launch.attempt_id)
            assert attempt is not None
            attempt.pid, attempt.pid_start_time = handle.pid, handle.start_time
        log.info(
            "event=attempt_started workload=%d attempt=%d node=%s gpus=%s pid=%d",
            bind.workload_id,
            launch.attempt_number,
            bind.node,
            gpus,
            handle.pid,
        )

    def _launch(
        self, workload: Workload, attempt: Attempt, pods: tuple[scheduler.PodPlacement, ...] = ()
    ) -> Launch:
        home = self.settings.home
        spec = workload.spec
        workdir = contract.workdir_for(spec, home, workload.id)
        if not spec.get("workdir"):
            workdir.mkdir(parents=True, exist_ok=True)
        checkpoint_dir = contract.checkpoint_dir_for(spec, workdir, home, workload.id)
        env = contract.job_environment(
            base=contract.server_environment(),
            spec=spec,
            workload_id=workload.id,
            workload_name=workload.name,
            queue=workload.queue,
            attempt_number=attempt.number,
            gpu_indices=[int(i) for i in attempt.gpu_indices],
            checkpoint_dir=checkpoint_dir,
            node_address=self.settings.node_address,
            master_port=contract.free_port(),
        )
        try:
            checkpoint_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("event=checkpoint_dir_unavailable workload=%d error=%s", workload.id, exc)
        return Launch(
            attempt_id=attempt.id,
            workload_id=workload.id,
            attempt_number=attempt.number,
            script="\n".join(spec.get("commands") or []) + "\n",
            env=env,
            workdir=workdir,
            run_dir=Path(attempt.run_dir),
            log_path=Path(attempt.log_path),
            pods=tuple(Pod(p.node, p.gpu_indices, p.gpu_fraction) for p in pods),
            cpus=attempt.cpus,
            memory_bytes=attempt.memory_bytes,
            fencing_token=attempt.fencing_token,
        )

    def _explain(self, explanations: dict[int, scheduler.Explanation]) -> None:
        """Keep every pending workload's latest explanation in memory (the API shows it), and store it when
        its code changes, so the store says why without being rewritten each pass as numbers move."""
        self.explanations = explanations
        if time.monotonic() - self._explained_at < EXPLAIN_PERSIST_INTERVAL:
            return
        self._explained_at = time.monotonic()
        changed = {
            wid: e
            for wid, e in explanations.items()
            if (stored := self._reasons.get(wid)) is None or stored.code != e.code
        }
        if not changed:
            return
        table = Workload.__table__
        statement = (
            update(table)
            .where(table.c.id == bindparam("wid"), table.c.state == PENDING)
            .values(reason=bindparam("message"), reason_code=bindparam("code"))
        )
        rows = [{"wid": wid, "message": e.message, "code": e.code} for wid, e in changed.items()]
        for start in range(0, len(rows), EXPLAIN_BATCH):
            # Small transactions: submits waiting for the write lock are served in between.
            with self.store.session() as s:
                s.execute(statement, rows[start : start + EXPLAIN_BATCH])
        self._reasons.update(changed)
        if len(self._reasons) > 2 * len(explanations) + 1000:
            self._reasons = {wid: e for wid, e in self._reasons.items() if wid in explanations}

    # -- telemetry ------------------------------------------------------------------------------------

    def sample_gpus(self, now: float) -> None:
        assert self.gpus is not None
        with self.store.read() as s:
            running = s.scalars(
                select(Attempt).where(Attempt.state == RUNNING, Attempt.node_name == self.settings.node_name)
            ).all()
            holders: dict[int, list[tuple[int, str]]] = {}
            for attempt in running:
                for index in attempt.gpu_indices:
                    holders.setdefault(int(index), []).append((attempt.pid or 0, str(attempt.workload_id)))
        for device in self.gpus.devices():
            pids = tuple(pid for pid, _ in holders.get(device.index, []) if pid)
            if self._attached.get(device.index) != pids:
                self.gpus.attach(device.index, pids)
                self._attached[device.index] = pids
        samples = []
        for sample in self.gpus.sample(now):
            row = sample.to_dict()
            row["workloads"] = [wid for _, wid in holders.get(sample.index, [])]
            samples.append(row)
        self.telemetry.put(self.settings.node_name, samples)


def _queue_view(queue: Queue) -> scheduler.QueueView:
    return queue_view(
        {**(queue.spec or {}), "name": queue.name, "parent": queue.parent, "priority": queue.priority}
    )


def _workload_view(
    workload_id: int, queue: str, nodes: int, created_at: datetime, preemptible: bool, spec: dict[str, Any]
) -> scheduler.WorkloadView:
    resources = spec.get("resources") or {}
    placement = spec.get("placement") or {}
    request = parse_gpu_request(resources.get("gpu", 0))
    created = as_utc(created_at) or utcnow()
    return scheduler.WorkloadView(
        id=workload_id,
        queue=queue,
        priority=0,
        submit_time=created.timestamp(),
        nodes=nodes,
        gpus=scheduler.GpuDemand(request.count, request.models, request.min_memory_bytes),
        cpus=float(resources.get("cpu") or 0.0),
        memory_bytes=int(resources.get("memory") or 0),
        preemptible=preemptible,
        topology=placement.get("topology"),
        topology_preferred=placement.get("topology_preferred"),
        node_names=frozenset(placement.get("nodes") or ()),
        max_duration=spec.get("max_duration"),
    )
