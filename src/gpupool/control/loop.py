"""The reconcile loop: compares desired state in the store with what runs, and acts idempotently.

Each pass: (1) observe every running attempt and carry out stops (cancel, max_duration, grace expiry),
(2) schedule pending workloads through the pure scheduler, (3) sample GPUs. Killing the server at any
instant loses nothing: `recover()` re-reads the store at start and re-adopts or settles every attempt.

`Reconciler` is this file (the loop's pacing, node registration, inventory, each pass's schedule phase
from snapshot to decisions; GPU sampling) on three phases of its own: `Observation` (control/observe.py:
observe, stop, settle, requeue or retry; recover), `SnapshotBuilding` (control/snapshot_build.py: the
snapshot the scheduler decides on) and `CarryingOut` (control/carry_out.py, built on `Observation`: the
decisions carried out: explanations, evictions, starts, launches). Its settings: control/settings.py.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool import scheduler
from gpupool.backends.base import Backend, BackendUnavailable, Handle
from gpupool.control import changes, efficiency, inventory
from gpupool.control.budgets import Budgets
from gpupool.control.carry_out import BACKEND_RETRY, CarryingOut
from gpupool.control.dependencies import Dependencies, Dependency
from gpupool.control.efficiency import CHECK_INTERVAL as EFFICIENCY_CHECK_INTERVAL
from gpupool.control.efficiency import EfficiencyWatch
from gpupool.control.errors import ServiceError
from gpupool.control.idle import CHECK_INTERVAL as IDLE_CHECK_INTERVAL
from gpupool.control.idle import IdleWatch
from gpupool.control.lifecycle import CANCELLED, PENDING, RUNNING, note, transition
from gpupool.control.node_views import NodeViews
from gpupool.control.observe import ALIVE_INTERVAL
from gpupool.control.policy import BandNotes, load_policy, policy_file, reword_preemptions
from gpupool.control.restarts import Backoff, restart_explanation
from gpupool.control.secret_keys import key_path, open_keys
from gpupool.control.settings import ControlSettings
from gpupool.control.snapshot_build import SnapshotBuilding
from gpupool.control.telemetry import TelemetryCache
from gpupool.control.usage import AttainedService
from gpupool.gpu import GpuProvider
from gpupool.spec.scheduling import scheduling_fields
from gpupool.store.db import Store, driver_error_line
from gpupool.store.models import Attempt, Gpu, Node, Workload
from gpupool.timeutil import utcnow

log = logging.getLogger("gpupool.control")

MIN_PASS_INTERVAL = 0.02  # seconds between the starts of two passes, however many events arrive
PASS_DUTY = 4.0  # after a pass of t seconds, the next starts no sooner than PASS_DUTY * t later
TIME_LIMIT_INTERVAL = 1.0  # seconds between looks for changed max_durations (follow_time_limits)


class Reconciler(CarryingOut, SnapshotBuilding):
    """The reconcile loop of one head: see the module's docstring for its phases."""

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
        # The last two failed passes (when, by time.monotonic(), and the error): /readyz says not ready while
        # both are recent (a full disk under the store fails every write, some passes having none), not
        # after one bad pass.
        self.failures: deque[tuple[float, str]] = deque(maxlen=2)
        self._last_sample = 0.0
        self._alive_due = 0.0  # when this head next writes down that it is alive (Observation.recover)
        self._reasons: dict[int, scheduler.Explanation] = {}
        self._attached: dict[int, tuple[int, ...]] = {}
        self._views: dict[int, scheduler.WorkloadView] = {}
        self._resumable: set[int] = set()  # cached workloads whose spec declares a checkpoint
        # Answers an unchanged snapshot from memory (views above are reused, so comparing is cheap).
        self._scheduler = scheduler.Scheduler()
        # Stopping work -> the pending workload its GPUs are for (evicted for it, or promised to it), as the
        # last pass saw it: once such work has stopped, the next pass gives that workload as
        # `victims_stopped` (the GPUs just released are its room, served first). Kept in memory: after a
        # restart of the head, a gainer whose victims stopped meanwhile is served in the queues' order.
        self._released_for: dict[int, int] = {}
        # The room the last pass left each of those pending workloads waiting for (`Decisions.nominated`):
        # given back with it (`Snapshot.nominated`), it lands where its evictions made room.
        self._nominated: dict[int, tuple[scheduler.PodPlacement, ...]] = {}
        policy = settings.policy if settings.policy is not None else load_policy(settings.home)
        self._config = replace(policy, usage_weight=settings.usage_weight)
        # Where the policy came from (None: the default, or one given in code): `GET /api/v1/scheduling`.
        self.policy_source = None if settings.policy is not None else policy_file(settings.home)
        # What opens users' secrets for starting attempts (control/secret_keys.py).
        self.secret_keys = settings.secret_keys or open_keys(key_path(settings.home, None), create=True)
        self._band_notes = BandNotes(self._config)  # "why pending" in words, for work in a lower band
        self._usage_cache: tuple[float, dict[str, float]] | None = None
        self._attained = AttainedService()  # earlier attempts' GPU-seconds, for least-attained-service order
        self._node_views: dict[str, scheduler.NodeView] = {}
        self._nodes = NodeViews()  # read again only where a node changed (control/node_views.py)
        self._backoffs: dict[tuple[int, int], Backoff | None] = {}
        self.backing_off: dict[int, Backoff] = {}
        # (until, why) while starts wait for a backend that could not take work (`_backend_unavailable`)
        self._backend_down: tuple[float, str] | None = None
        self.held: dict[int, scheduler.Explanation] = {}
        self._after: dict[int, tuple[Dependency, ...]] = {}
        self.dependencies = Dependencies()
        self._array_limits: dict[int, tuple[int, int]] = {}
        self.array_held: dict[int, scheduler.Explanation] = {}
        self._users: dict[int, str] = {}
        self.user_held: dict[int, scheduler.Explanation] = {}
        self.budgets = Budgets()
        self.over_budget: dict[int, scheduler.Explanation] = {}
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
        self.idle = IdleWatch(self.telemetry)  # running work whose GPUs sit idle (control/idle.py)
        self._idle_due = 0.0
        # Each running attempt's mean GPU utilization and peak memory (control/efficiency.py).
        self.efficiency = EfficiencyWatch(self.telemetry)
        self._efficiency_due = 0.0
        # Running attempts' max_duration as last given to a backend with a time limit of its own (Slurm).
        self._time_limits: dict[int, float | None] = {}
        # A cancelled service replica's SIGTERM waits while the proxy has requests in flight to it
        # (observe.py `_drains`); the API's runtime gives the proxy's count, nothing drains without it.
        self.draining: Callable[[int], bool] = lambda _workload_id: False
        self._drains_since: dict[int, float] = {}
        # Whether this head may act now (it holds the store's head lock, store/head_lock.py): "" when it may,
        # else why not. The API's runtime gives it; without it (tests, tools) the loop always acts.
        self.head_lock_lost: Callable[[], str] = lambda: ""
        self._time_limits_due = 0.0

    # -- lifecycle of the loop ------------------------------------------------------------------------

    def scheduling(self) -> dict[str, Any]:
        """The policy each pass applies, as `GET /api/v1/scheduling` shows it: its scheduling.yaml fields
        (GPU-times in GPU-seconds), the file they came from (None: the default policy), and the server's
        fair share by history (`--usage-weight`, `--usage-half-life`)."""
        return {
            "source": None if self.policy_source is None else str(self.policy_source),
            "policy": scheduling_fields(self._config),
            "usage_weight": self._config.usage_weight,
            "usage_half_life_s": self.settings.usage_half_life,
        }

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
                lost = self.head_lock_lost()  # first: two heads acting on one store start the same work
                if lost:
                    log.warning("event=pass_skipped reason=%r", lost)
                    self.failures.append((time.monotonic(), lost))
                else:
                    self.tick()
            except Exception as exc:  # one bad pass must not stop the pool; the next pass retries
                log.exception("event=reconcile_failed")
                self.failures.append((time.monotonic(), driver_error_line(exc)))
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
        try:  # the running attempts' figures since the last write, so a restart resumes from them
            self.record_efficiency(time.time(), flush=True)
        except Exception:
            log.exception("event=efficiency_flush_failed")

    def tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.sync_inventory()
        # The running work of a used budget that says `when_spent: stop` (last pass's count): its stops are
        # written down now and carried out by this observe (control/budgets.py).
        self.budgets.stop_spent(self.store)
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
        if now >= self._idle_due:
            self._idle_due = now + IDLE_CHECK_INTERVAL
            self.stop_idle(now)
        if now >= self._efficiency_due:
            self._efficiency_due = now + EFFICIENCY_CHECK_INTERVAL
            self.record_efficiency(now)
        if now >= self._time_limits_due:
            self._time_limits_due = now + TIME_LIMIT_INTERVAL
            self.follow_time_limits(now)
        if now >= self._alive_due:
            self._alive_due = now + ALIVE_INTERVAL
            self.record_alive(now)
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

    # -- schedule -------------------------------------------------------------------------------------

    def schedule(self, now: float) -> None:
        with self.store.read() as s:
            snapshot = self._pass_snapshot(s, now)
        waiting = {wid: restart_explanation(b) for wid, b in self.backing_off.items()}
        waiting.update(self.dependencies.waiting)
        waiting.update(self.held)
        waiting.update(self.array_held)
        waiting.update(self.user_held)
        waiting.update(self.over_budget)
        if self.dependencies.never:
            self._cancel_unmeetable(self.dependencies.never)
        if not snapshot.pending and not snapshot.running:
            self.fair_shares, self.pass_queues, self._released_for, self._nominated = {}, (), {}, {}
            self._explain(waiting)
            return
        decisions = self._scheduler.decide(snapshot, now)
        self._remember_released(snapshot, decisions)
        self.fair_shares, self.pass_queues = decisions.fair_shares, snapshot.queues
        self._band_notes.add(decisions.explanations, snapshot.pending, snapshot.queues, snapshot.running)
        # Reasons first: starting many binds can take a while, and work left pending says why meanwhile.
        self._explain({**decisions.explanations, **waiting} if waiting else decisions.explanations)
        if decisions.evictions:
            self._evict(
                reword_preemptions(decisions.evictions, snapshot.pending, snapshot.running, self._config)
            )
        if decisions.released_to:
            self._promise(decisions.released_to)
        for bind in decisions.binds:
            if self._backend_down is not None and time.time() < self._backend_down[0]:
                self._explain_unstarted(decisions.binds, decisions.explanations, waiting)
                break
            self._start(bind)

    def stop_idle(self, now: float) -> None:
        """Hold or cancel the running work whose GPUs have sat idle for its spec's `idle.timeout`: stopped
        by the next observe, as `gpupool hold` or `cancel` would stop it (control/idle.py)."""
        with self.store.read() as s:
            watched = self.idle.watched(s)
        if not watched:
            return
        for idle in self.idle.look(watched, now):
            act = changes.hold if idle.action == "hold" else changes.cancel
            try:
                act(self.store, idle.workload_id, actor="idle", task=True, why=idle.reason)
            except ServiceError as exc:  # it ended, or someone stopped it, since it was read
                log.info("event=idle_not_stopped workload=%d why=%r", idle.workload_id, exc.message)
                continue
            log.info("event=idle_stopped workload=%d action=%s", idle.workload_id, idle.action)

    def record_efficiency(self, now: float, *, flush: bool = False) -> None:
        """Count the telemetry of running attempts' GPUs since the last look; write the figures of those
        that ended, and every 30 s (or when `flush`) of those that run (control/efficiency.py)."""
        with self.store.read() as s:
            running = self.efficiency.running(s)
            ended = self.efficiency.ended(s, running)
        writes = self.efficiency.look(running, ended, now, flush=flush)
        if writes:
            with self.store.session() as s:
                efficiency.write(s, writes)

    def follow_time_limits(self, now: float) -> None:
        """Give a backend with a time limit of its own (Slurm's TimeLimit; base.FollowsTimeLimits) each
        running attempt's max_duration where it changed (`gpupool update`), so that a raised limit is not
        cut short by the old one. What the backend refuses goes into the workload's history."""
        follow = getattr(self.backend, "follow_time_limit", None)
        if follow is None:
            return
        with self.store.read() as s:
            rows = s.execute(
                select(Attempt.id, Attempt.workload_id, Attempt.pid, Attempt.run_dir, Workload.spec)
                .join(Workload, Attempt.workload_id == Workload.id)
                .where(Attempt.state == RUNNING, Attempt.pid.is_not(None), self._observed())
            ).all()
        running = {attempt_id for attempt_id, *_ in rows}
        self._time_limits = {a: v for a, v in self._time_limits.items() if a in running}
        for attempt_id, workload_id, pid, run_dir, spec in rows:
            limit = spec.get("max_duration")
            if attempt_id in self._time_limits and self._time_limits[attempt_id] == limit:
                continue
            grace = float(spec.get("grace_period", 30.0))
            try:
                problem = follow(Handle(pid, 0.0), Path(run_dir), limit, grace)
            except BackendUnavailable as exc:  # each try could block a pass: the rest wait with it
                log.warning("event=time_limit_not_followed workload=%d error=%r", workload_id, str(exc))
                self._time_limits_due = now + BACKEND_RETRY
                return
            self._time_limits[attempt_id] = limit
            if problem:
                log.warning("event=time_limit_refused workload=%d error=%r", workload_id, problem)
                with self.store.session() as s:
                    workload = s.get(Workload, workload_id)
                    if workload is not None:
                        note(s, workload, problem, actor="control")

    def _cancel_unmeetable(self, never: dict[int, str]) -> None:
        """Cancel the pending work whose dependencies can no longer be met (control/dependencies.py)."""
        with self.store.session() as s:
            for wid, reason in never.items():
                workload = s.get(Workload, wid)
                if workload is None or workload.state != PENDING:
                    continue
                workload.cancel_requested = True
                transition(s, workload, CANCELLED, reason, actor="dependencies")
                log.info("event=dependency_never_met workload=%d reason=%r", wid, reason)

    def _pass_snapshot(self, s: Session, now: float) -> scheduler.Snapshot:
        """The snapshot a pass decides on: the store's, with the pending workloads whose victims (or the
        work whose GPUs were promised to them) stopped since the last pass given as `victims_stopped`, each
        with the room the last pass nominated for it."""
        snapshot = self._snapshot(s, now)
        last = self._released_for
        if not last:
            return snapshot
        running = {w.id for w in snapshot.running}
        owed = {gainer for victim, gainer in last.items() if victim not in running}
        if not owed:
            return snapshot
        pending = tuple(replace(w, victims_stopped=True) if w.id in owed else w for w in snapshot.pending)
        nominated = {gainer: self._nominated[gainer] for gainer in owed if gainer in self._nominated}
        return replace(snapshot, pending=pending, nominated=nominated)

    def _remember_released(self, snapshot: scheduler.Snapshot, decisions: scheduler.Decisions) -> None:
        """Which pending workload the GPUs of each stopping workload are for, once this pass's decisions are
        carried out: the snapshot's stopping work, the evictions decided now, the promises made now."""
        released = {w.id: w.evicted_for for w in snapshot.running if w.stopping and w.evicted_for is not None}
        for eviction in decisions.evictions:
            if eviction.for_workload is not None:
                released[eviction.workload_id] = eviction.for_workload
        released.update(decisions.released_to)
        self._released_for = released
        self._nominated = decisions.nominated

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
