"""The health loop: judges every node from its telemetry, drains unhealthy nodes, and lets them back only
after they pass the active checks.

Each pass (every second, in its own thread): the passive checks read the latest samples of every node
(`health.checks.passive`); an `unhealthy` verdict moves the node to state `unhealthy` (no new work) and asks
the reconcile loop to stop its attempts (`stop_reason` "drain": SIGTERM, SIGKILL after the grace period,
requeued to resume from the checkpoint). An unhealthy node gets the active checks every
`schedule.recheck_interval` seconds; it returns to `ready` when they pass and no passive fault remains.
Idle ready nodes get the active checks every `schedule.idle_interval` seconds. An agent node back from
`lost` comes back cordoned (control/inventory.py, BACK_FROM_LOST) and returns to `ready` when it passes the
`schedule.after_lost_level` checks. A node with fewer GPUs than it is expected to have (`Node.expected_gpus`:
those of its first registration, or as an operator accepted them, `accept_gpus`) is unhealthy.
Checks the loop schedules run in a thread of their own, so a slow node never holds up the others.
Every change of state or verdict is an `Event` on the node (actor "health").

The active checks run as a gpupool job on the node, holding all its GPUs (control/health_jobs.py), on the
head's own node and on agent nodes alike. Faults are injected by the head into its own simulated GPUs, and
for an agent node by its agent when asked (`AgentNodes.ask`, carried by the heartbeats;
health/node_tasks.py is the agent's side).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy import func, select

from gpupool.control.bench import BenchBook
from gpupool.control.errors import Conflict, Invalid, NotFound
from gpupool.control.health_jobs import SYSTEM_QUEUE, CheckJobFailed, CheckJobs, require_free
from gpupool.control.inventory import BACK_FROM_LOST
from gpupool.control.telemetry import TelemetryCache
from gpupool.gpu import GpuProvider, SimulatedProvider
from gpupool.health import checks, faults, simulated_state
from gpupool.health.active import ActiveCheckError
from gpupool.health.checks import Baseline, Finding, Verdict
from gpupool.health.thresholds import LEVELS, HealthConfig
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Event, Gpu, Node, Workload
from gpupool.timeutil import as_utc, utcnow

log = logging.getLogger("gpupool.health")

ACTOR = "health"
STOP_DRAIN = "drain"  # the reconcile loop's stop reason for work leaving a node (control.observe.STOP_DRAIN)
CHECKING = "health: active checks running"  # state_reason of a node cordoned for its checks (older heads)
# state_reason of an unhealthy node that older heads cordoned while its check job ran (their scheduler
# restarted any work on an unhealthy node), then "; " and its reason as unhealthy: such a node goes back to
# unhealthy. An unhealthy node now stays so while its check job runs (the scheduler leaves single-pod work).
RECHECKING = "health: unhealthy, active checks running"
STALE_AFTER = 30.0  # seconds without samples after which a node's last samples are not judged
FAULTS = faults.FAULTS
FAULT_TIMEOUT = 15.0  # seconds an agent node has to apply an injected fault and say so
HELD_OUT = " (not back in service until it passes the active checks)"  # ends a held-out node's evidence
PARALLEL_CHECKS = 64  # scheduled checks running at once (each a thread, mostly waiting on a node)


class AgentNodes(Protocol):
    """The agent nodes this head hears from, and a way to ask their agents (backends.agent.AgentBackend)."""

    def knows(self, name: str) -> bool: ...

    def ask(self, name: str, instruction: dict[str, Any], timeout: float) -> dict[str, Any]: ...


@dataclass
class NodeHealth:
    verdict: Verdict
    checked_at: float  # unix time of the verdict
    active: dict[str, Any] | None = None  # the last active run: result and verdict
    active_at: float | None = None


class HealthMonitor:
    def __init__(
        self,
        store: Store,
        telemetry: TelemetryCache,
        config: HealthConfig,
        *,
        local_node: str,
        local_gpus: GpuProvider | None,
        agents: AgentNodes | None = None,
        wake: Callable[[], None] = lambda: None,
        interval: float = 1.0,
        jobs: CheckJobs | None = None,
    ) -> None:
        self.store, self.telemetry, self.config = store, telemetry, config
        self.local_node, self.local_gpus, self.agents = local_node, local_gpus, agents
        self.wake, self.interval = wake, interval
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeHealth] = {}
        self._baselines: dict[str, Baseline] = {}
        self._running: dict[str, threading.Lock] = {}
        self._unhealthy_since: dict[str, float] = {}
        self._failed_rechecks: dict[str, int] = {}  # node -> rechecks failed in a row (see _recheck_interval)
        self._checks_done: Counter[str] = Counter()  # node -> active checks ended (see _left_to_its_checks)
        # Nodes taken out and not yet back through passing checks, with the evidence: one that left state
        # `unhealthy` another way (lost, then its agent came back) is taken out again. Read back from the
        # node events at the first pass (`_restore_held_out`), so a restart of the head lets none back.
        self._held_out: dict[str, str] = {}
        self._restored = False
        # As the last pass read them: node -> GPU index -> model, node -> GPU index -> UUID, and node -> how
        # many GPUs it is expected to have (None: not remembered yet; `Node.expected_gpus` read only when
        # the GPUs that answer differ, to name them: decoding it for every node each second costs).
        self._gpus_now: dict[str, dict[int, str]] = {}
        self._uuids_now: dict[str, dict[int, str]] = {}
        self._expected_now: dict[str, int | None] = {}
        self._back_since: dict[str, float] = {}  # node back from lost -> when this head first saw it so
        self._parallel = threading.BoundedSemaphore(PARALLEL_CHECKS)
        self._started = time.time()
        self.verdicts_total: Counter[tuple[str, str]] = Counter()  # (node, health) -> verdicts that changed
        self.failed_checks_total: Counter[str] = Counter()  # check -> findings that set a verdict
        self.bench = BenchBook(store)  # stored bench results, judged with the other checks (docs/bench.md)
        # The active checks as jobs; the reconcile loop starts them (Reconciler.direct_binds = jobs.binds).
        self.jobs = jobs or CheckJobs(store, wake=wake)
        self._publish()

    # -- the loop -------------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.tick()
            except Exception:  # one bad pass must not stop health checking; the next pass retries
                log.exception("event=health_pass_failed")
            stop.wait(self.interval)

    def tick(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        schedule = self.config.schedule
        self.bench.refresh()
        self.jobs.sweep(now)
        self.jobs.prune(now, self.config.check_jobs, named=self._named_jobs())
        if not self._restored:
            self._restore_held_out()
            self._restored = True
        checking = self._checks_now()  # before the nodes are read: see _left_to_its_checks
        nodes = self._nodes_now()
        self._remember_expected()
        for name, state, reason, busy in nodes:
            if state == "lost":
                continue
            if _rechecking(state, reason) and not self._busy(name):  # cordoned for a check by an older head
                self._set_state(name, "unhealthy", _reason_before_recheck(reason), only_from="cordoned")
                state = "unhealthy"
            back = state == "cordoned" and reason == BACK_FROM_LOST
            if back and not schedule.after_lost:
                why = "health: back from lost; in service at once (health.yaml schedule.after_lost: false)"
                self._set_state(name, "ready", why, only_from="cordoned")
                state, back = "ready", False
            if not back:
                self._back_since.pop(name, None)
            if (state == "unhealthy" or back) and self._left_to_its_checks(name, checking):
                continue
            verdict = self._with_bench(name, self._passive(name, fresh=True), now)
            if verdict is not None:
                self._record(name, state, verdict, now)
                if verdict.health == checks.UNHEALTHY:
                    self._mark_unhealthy(name, verdict)
                    state = "unhealthy"
            with self._lock:
                held = self._held_out.get(name)
            if held is not None and (state == "ready" or back):
                evidence = f"{held}{HELD_OUT}"
                finding = Finding("active", checks.UNHEALTHY, evidence)
                self._mark_unhealthy(name, checks.verdict([finding], []))
                state = "unhealthy"
            if state == "unhealthy":
                self._drain(name)
                # Rechecked once its work has left and the interval has passed since it fell (or was last
                # checked), so a drain is never raced and a flapping GPU is not retried every second.
                with self._lock:
                    since = self._unhealthy_since.setdefault(name, now)
                if not busy and self._due(name, now, self._recheck_interval(name), since=since):
                    self._check_later(name, schedule.recheck_level)
            elif back:
                # Checked at once, and again each pass until a check gives a verdict (one that could not
                # run, the node busy with work still settling, gives none).
                since = self._back_since.setdefault(name, now)
                if not busy and not self._checked_since(name, since) and self.can_check(name):
                    self._check_later(name, schedule.after_lost_level)
            elif state == "ready" and not busy and schedule.idle_interval > 0:
                # A node never checked counts from the monitor's start: a restart does not test them all.
                due = self._due(name, now, schedule.idle_interval, since=self._started)
                if due and self.can_check(name):
                    self._check_later(name, schedule.idle_level)
            elif state == "cordoned" and reason == CHECKING and not self._busy(name):
                self._set_state(name, "ready", "health: active checks interrupted; back in service")

    def _restore_held_out(self) -> None:
        """The nodes an earlier head took out that have not passed their active checks since: the health
        loop's last change of their state was to `unhealthy` (the node events keep it)."""
        last: dict[str, str | None] = {}  # node -> evidence while held out; None once back
        with self.store.read() as s:
            for node, to_state, reason in s.execute(
                select(Event.object_id, Event.to_state, Event.reason)
                .where(
                    Event.object_kind == "node",
                    Event.actor == ACTOR,
                    Event.to_state.in_(("unhealthy", "ready")),
                    Event.from_state != Event.to_state,
                )
                .order_by(Event.id)
            ):
                evidence = reason.removeprefix("health: ").removesuffix(HELD_OUT)
                last[node] = evidence if to_state == "unhealthy" else None
        with self._lock:
            for node, held in last.items():
                if held is not None:
                    self._held_out.setdefault(node, held)

    def _checks_now(self) -> tuple[set[str], Counter[str]]:
        """The nodes whose active checks run now, and how many checks of each node have ended."""
        with self._lock:
            return {n for n, lock in self._running.items() if lock.locked()}, self._checks_done.copy()

    def _left_to_its_checks(self, name: str, before: tuple[set[str], Counter[str]]) -> bool:
        """Whether the node's active checks ran when the pass began (`before`: `_checks_now`), run now, or
        ended since: an unhealthy node is then left to their verdict this pass. The state the pass read may
        be stale (a passing check returns the node to ready), and its passive verdict is still judged
        against the baseline a passing check replaces: acting on it would take the node out again."""
        running, done = before
        with self._lock:
            ended = self._checks_done[name] != done[name]
        return name in running or ended or self._busy(name)

    def _named_jobs(self) -> set[int]:
        """The check jobs the nodes' health views name (their last active checks): kept by the pruning."""
        with self._lock:
            entries = list(self._nodes.values())
        return {int(e.active["job"]) for e in entries if e.active and e.active.get("job") is not None}

    def _recheck_interval(self, name: str) -> float:
        """`recheck_interval`, doubled after each recheck the node failed, up to `recheck_max_interval`:
        a node that stays broken until someone repairs it is not checked (one more check job each time)
        every minute for days."""
        schedule = self.config.schedule
        with self._lock:
            failed = self._failed_rechecks.get(name, 0)
        longest = max(schedule.recheck_interval, schedule.recheck_max_interval)
        return min(schedule.recheck_interval * 2.0 ** min(failed, 32), longest)

    def _due(self, name: str, now: float, interval: float, *, since: float | None = None) -> bool:
        """Whether `interval` seconds passed since the node's last active checks and since `since`."""
        with self._lock:
            entry = self._nodes.get(name)
            last = entry.active_at if entry is not None else None
        marks = [t for t in (last, since) if t is not None]
        return not marks or now - max(marks) >= interval

    def _checked_since(self, name: str, since: float) -> bool:
        """Whether active checks that gave a verdict began at or after `since`."""
        with self._lock:
            entry = self._nodes.get(name)
            return entry is not None and entry.active_at is not None and entry.active_at >= since

    def _remember_expected(self) -> None:
        """Nodes with GPUs and no expected GPUs yet (first registration) are expected to keep those."""
        with self._lock:
            unknown = [
                n for n, listed in self._expected_now.items() if listed is None and self._gpus_now.get(n)
            ]
        if not unknown:
            return
        with self.store.session() as s:
            for node in s.scalars(select(Node).where(Node.name.in_(unknown))):
                if node.expected_gpus is None and node.gpus:
                    node.expected_gpus = _listing(node.gpus)
                    log.info("event=node_expected_gpus node=%s gpus=%d", node.name, len(node.gpus))
                    with self._lock:
                        self._expected_now[node.name] = len(node.gpus)

    def _busy(self, name: str) -> bool:
        lock = self._running.get(name)
        return lock is not None and lock.locked()

    # -- checks ---------------------------------------------------------------------------------------

    def _publish(self) -> None:
        """Where this head's check jobs find its simulated GPUs as faults left them (simulated_state.py)."""
        if isinstance(self.local_gpus, SimulatedProvider):
            try:
                simulated_state.publish(self.local_gpus, self.local_node)
            except OSError as exc:  # its check jobs then fail and say why; the head goes on
                log.warning("event=simulated_state_unwritable node=%s error=%r", self.local_node, str(exc))

    def can_check(self, name: str) -> bool:
        """Whether a check job can run on the node: the head's own node (its GPUs, the local backend) or a
        connected agent's node (the agent backend). Slurm nodes are checked by Slurm's own health checks."""
        if name == self.local_node and self.local_gpus is not None:
            return True
        return self.agents is not None and self.agents.knows(name)

    def _check_later(self, name: str, level: str) -> None:
        """Run the checks of one node in a thread of its own, unless they run already or PARALLEL_CHECKS
        others do (a later pass starts it: many idle nodes fall due at once)."""
        lock = self._running.setdefault(name, threading.Lock())
        if lock.locked() or not self._parallel.acquire(blocking=False):
            return

        def run() -> None:
            try:
                if not lock.acquire(blocking=False):
                    return
                try:
                    self._check_locked(name, level)
                except Conflict as exc:  # work started there, or the job was stopped: the next pass decides
                    log.info("event=health_check_skipped node=%s level=%s why=%r", name, level, exc.message)
                except Exception:  # the next due pass retries; the API's `health run` shows the error
                    log.exception("event=health_check_failed node=%s level=%s", name, level)
                finally:
                    lock.release()
            finally:
                self._parallel.release()

        threading.Thread(target=run, name=f"health-{name}", daemon=True).start()

    def _passive(self, name: str, *, fresh: bool = False) -> Verdict | None:
        """The passive verdict from the node's latest samples; `fresh`: its GPUs as `_nodes_now` just read
        them (the loop's pass), rather than from the store."""
        age = self.telemetry.age(name)
        if age is None or age > STALE_AFTER:
            return None
        return self._judge(name, self._baseline(name), fresh=fresh)

    def _judge(self, name: str, baseline: Baseline, *, fresh: bool = False) -> Verdict | None:
        """The passive checks of the node's latest samples of the GPUs it has registered now (rows of a GPU
        it no longer lists stay in the telemetry cache), against the GPUs it is expected to have."""
        if fresh:
            with self._lock:
                models, uuids = self._gpus_now.get(name, {}), self._uuids_now.get(name, {})
                count = self._expected_now.get(name)
        else:
            models, uuids, listed = self._inventory(name)
            count = len(listed) if listed is not None else None
        samples = [row for row in self.telemetry.node_samples(name) if uuids.get(row["index"]) == row["uuid"]]
        if not samples:
            return None
        expected: dict[str, int] = {}  # UUID -> index of the expected GPUs, to name the missing or new ones
        if count is None:  # not remembered yet: the GPUs it has
            count, expected = len(uuids), {uuid: index for index, uuid in uuids.items()}
        elif sum(1 for row in samples if not row.get("lost")) != count:
            listed = self._inventory(name)[2] or []
            expected = {str(g["uuid"]): int(g["index"]) for g in listed}
        return checks.passive(
            samples,
            expected_gpus=count,
            expected_uuids=expected,
            models=models,
            config=self.config,
            baseline=baseline,
        )

    def _with_bench(self, name: str, verdict: Verdict | None, now: float) -> Verdict | None:
        """The verdict with the node's stored bench results judged in (None stays None if none are)."""
        judged = self.bench.verdict(name, self.config, now)
        if not judged.checks:
            return verdict
        return judged if verdict is None else checks.combine(verdict, judged)

    def _baseline(self, name: str) -> Baseline:
        with self._lock:
            return self._baselines.setdefault(name, Baseline())

    def _inventory(self, name: str) -> tuple[dict[int, str], dict[int, str], list[dict[str, Any]] | None]:
        """The node's GPUs now (index -> model, index -> UUID) and the GPUs it is expected to have."""
        with self.store.read() as s:
            node = s.scalar(select(Node).where(Node.name == name))
            if node is None:
                return {}, {}, None
            return (
                {g.index: g.model for g in node.gpus},
                {g.index: g.uuid for g in node.gpus},
                node.expected_gpus,
            )

    def check(self, name: str, level: str) -> dict[str, Any]:
        """Passive and active checks of one node now (its check job runs and is waited for); acts on the
        verdict; returns the report. Conflict when the node runs other work (the job holds every GPU)."""
        if level not in LEVELS:
            raise Invalid(f"level {level!r}: one of {', '.join(LEVELS)}", field="level", example="quick")
        lock = self._running.setdefault(name, threading.Lock())
        with lock:
            return self._check_locked(name, level)

    def check_many(self, names: list[str], level: str) -> list[dict[str, Any]]:
        """`check` of several nodes at once (up to PARALLEL_CHECKS together), reports in the order given; a
        node that cannot be checked now (it runs work) is reported as skipped, with why."""
        if len(names) <= 1:
            return [self.check(name, level) for name in names]

        def one(name: str) -> dict[str, Any]:
            try:
                return self.check(name, level)
            except Conflict as exc:
                return {"node": name, "level": level, **self.views().get(name, {}), "skipped": exc.message,
                        "state": self._node_state(name)}  # fmt: skip

        with ThreadPoolExecutor(min(PARALLEL_CHECKS, len(names)), thread_name_prefix="health-run") as pool:
            return list(pool.map(one, names))

    def _check_locked(self, name: str, level: str) -> dict[str, Any]:
        try:
            return self._check_held(name, level)
        finally:
            with self._lock:
                self._checks_done[name] += 1

    def _check_held(self, name: str, level: str) -> dict[str, Any]:
        """The checks of one node, its lock held (`check`, `_check_later`)."""
        state, reason = self._node_state_and_reason(name)
        back = state == "cordoned" and reason == BACK_FROM_LOST
        passive = self._passive(name) or checks.verdict([], [])
        if not self.can_check(name):
            raise Conflict(
                f"node {name}: no check job can run there: not the head's own node ({self.local_node}) and "
                "no agent connected for it (`gpupool nodes` shows its state)"
            )
        require_free(self.store, name)  # at once, rather than when the control loop would refuse the job
        began = time.time()
        try:
            job = self.jobs.run(name, level)
            active = checks.active(job.result, self.config)
            active_view: dict[str, Any] = {
                "job": job.workload_id, "result": job.result.to_dict(), **active.to_dict()
            }  # fmt: skip
        except ActiveCheckError as exc:
            active = checks.verdict([Finding("active", checks.UNHEALTHY, str(exc))], ["active"])
            job_id = exc.workload_id if isinstance(exc, CheckJobFailed) else None
            active_view = {"job": job_id, "result": None, **active.to_dict()}
        # A node that passes is judged with what it shows now acknowledged (old Xids, ECC counts).
        tentative = Baseline()
        tentative.acknowledge(self.telemetry.node_samples(name))
        after = self._judge(name, tentative) or passive
        overall = checks.combine(after if active.health != checks.UNHEALTHY else passive, active)
        overall = self._with_bench(name, overall, began) or overall
        with self._lock:
            entry = self._nodes.setdefault(name, NodeHealth(overall, began))
            entry.active, entry.active_at = active_view, began
        self._record(name, state, overall, began)
        if overall.health == checks.UNHEALTHY:
            if state == "unhealthy":
                with self._lock:
                    self._failed_rechecks[name] = self._failed_rechecks.get(name, 0) + 1
            self._mark_unhealthy(name, overall)
        else:
            with self._lock:
                self._baselines[name] = tentative
            with self._lock:
                self._unhealthy_since.pop(name, None)
                self._held_out.pop(name, None)
                self._failed_rechecks.pop(name, None)
            if state == "unhealthy" or back:
                level_text = ("back from lost, " if back else "") + f"passed the {level} active checks"
                self._set_state(name, "ready", f"health: {level_text} ({overall.health})", only_from=None)
                self.wake()
        log.info(
            "event=health_checked node=%s level=%s job=%s health=%s evidence=%r",
            name, level, active_view["job"], overall.health, overall.evidence,
        )  # fmt: skip
        return {
            "node": name,
            "level": level,
            **overall.to_dict(),
            "active": active_view,
            "state": self._node_state(name),
        }

    def _record(self, name: str, state: str, verdict: Verdict, now: float) -> None:
        """Keep the verdict; a changed one is counted and logged, and warnings (and their end) are events.
        Changed: another health, or other conditions setting it (`_conditions`), not other readings."""
        with self._lock:
            previous = self._nodes.get(name)
            was = previous.verdict.health if previous is not None else None  # before it is replaced below
            changed = previous is None or _conditions(previous.verdict) != _conditions(verdict)
            if previous is None:
                self._nodes[name] = NodeHealth(verdict, now)
            else:
                previous.verdict, previous.checked_at = verdict, now
            if not changed:
                return
            self.verdicts_total[(name, verdict.health)] += 1
            for finding in verdict.findings:
                if finding.severity == verdict.health:
                    self.failed_checks_total[finding.check] += 1
        log.info("event=health_verdict node=%s health=%s evidence=%r", name, verdict.health, verdict.evidence)
        if checks.WARNING in (verdict.health, was):
            with self.store.session() as s:
                s.add(
                    Event(
                        object_kind="node", object_id=name, from_state=state, to_state=state,
                        reason=f"health {verdict.health}: {verdict.evidence}", actor=ACTOR,
                    )
                )  # fmt: skip

    # -- acting on verdicts ---------------------------------------------------------------------------

    def _mark_unhealthy(self, name: str, verdict: Verdict) -> None:
        reason = f"health: {verdict.evidence}"
        changed = self._set_state(name, "unhealthy", reason, only_from=None)
        with self._lock:
            self._unhealthy_since.setdefault(name, time.time())
            self._held_out.setdefault(name, verdict.evidence)
        if changed:
            log.warning("event=node_unhealthy node=%s evidence=%r", name, verdict.evidence)
        self._drain(name)

    def _drain(self, name: str) -> None:
        """Ask the reconcile loop to stop every attempt with a pod on the node (it requeues them)."""
        marked = 0
        with self.store.session() as s:
            for attempt in s.scalars(
                select(Attempt)
                .join(Workload, Attempt.workload_id == Workload.id)
                .where(
                    Attempt.state == "running",
                    Attempt.stop_requested_at.is_(None),
                    Workload.queue != SYSTEM_QUEUE,  # a check job is what lets the node back
                )
            ):
                pods = attempt.pods or [{"node": attempt.node_name}]
                if attempt.stop_reason != STOP_DRAIN and any(p["node"] == name for p in pods):
                    attempt.stop_reason = STOP_DRAIN
                    marked += 1
        if marked:
            log.info("event=node_drain_requested node=%s attempts=%d", name, marked)
            self.wake()

    def _set_state(self, name: str, state: str, reason: str, *, only_from: str | None = None) -> bool:
        with self.store.session() as s:
            node = s.scalar(select(Node).where(Node.name == name))
            if node is None or node.state == state or (only_from is not None and node.state != only_from):
                return False
            if node.state == "lost":  # the backend's to lift; a node taken out stays held out when back
                return False
            if state == "ready" and node.state not in ("unhealthy", "cordoned"):
                return False
            if state == "ready" and node.state == "cordoned" and not _health_cordon(node.state_reason):
                return False  # an operator's cordon is the operator's to lift
            return node.change_state(state, reason, ACTOR)

    def _node_state(self, name: str) -> str:
        return self._node_state_and_reason(name)[0]

    def _node_state_and_reason(self, name: str) -> tuple[str, str]:
        with self.store.read() as s:
            node = s.scalar(select(Node).where(Node.name == name))
            if node is None:
                names = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
                raise NotFound(f"no node named {name!r} (nodes: {names})")
            return node.state, node.state_reason

    def _nodes_now(self) -> list[tuple[str, str, str, bool]]:
        """Every node: (name, state, state reason, whether work runs on it); its GPUs go to `_gpus_now`."""
        with self.store.read() as s:
            busy: set[str] = set()  # nodes with running work; a check job counts too (one at a time)
            for node_name, pods in s.execute(
                select(Attempt.node_name, Attempt.pods).where(Attempt.state == "running")
            ):
                busy.update(str(p["node"]) for p in pods or [{"node": node_name}])
            # Plain rows, not ORM objects (this runs every second over every node and GPU).
            gpus: dict[str, dict[int, str]] = {}
            uuids: dict[str, dict[int, str]] = {}
            for node_name, index, model, uuid in s.execute(
                select(Node.name, Gpu.index, Gpu.model, Gpu.uuid).join(Gpu, Gpu.node_id == Node.id)
            ):
                gpus.setdefault(node_name, {})[index] = model
                uuids.setdefault(node_name, {})[index] = uuid
            # How many GPUs each node is expected to have, counted by the database (SQLite and PostgreSQL
            # both have json_array_length): the list itself is read only where it is needed (_judge).
            expected = func.json_array_length(Node.expected_gpus)
            rows = s.execute(
                select(Node.name, Node.state, Node.state_reason, expected).order_by(Node.name)
            ).all()
        with self._lock:
            self._gpus_now, self._uuids_now = gpus, uuids
            self._expected_now = {name: count for name, _, _, count in rows}
        return [(name, state, reason, name in busy) for name, state, reason, _ in rows]

    # -- expected GPUs ---------------------------------------------------------------------------------

    def accept_gpus(self, name: str, *, actor: str = "admin") -> dict[str, Any]:
        """An operator accepts the GPUs the node has registered now as the ones it is expected to have (a
        node that lost a GPU for good, or got one more). Conflict when nothing differs, or the node is lost.
        The node's state is not changed: one held out returns once it passes the active checks."""
        with self.store.session() as s:
            node = s.scalar(select(Node).where(Node.name == name))
            if node is None:
                names = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
                raise NotFound(f"no node named {name!r} (nodes: {names})", field="node")
            if node.state == "lost":
                raise Conflict(
                    f"node {name} is lost; accept its GPUs once its agent is back and has registered them",
                    field="node",
                )
            now, before = _listing(node.gpus), node.expected_gpus
            if before is not None and {g["uuid"] for g in before} == {g["uuid"] for g in now}:
                silent = [
                    f"GPU {int(row['index'])}"
                    for row in self.telemetry.node_samples(name)
                    if row.get("lost") and str(row["uuid"]) in {g["uuid"] for g in now}
                ]
                hint = (
                    f"; {', '.join(silent)} still listed but not answering: reboot the node (its agent then "
                    "registers the GPUs the driver lists) or repair the GPU"
                    if silent
                    else ""
                )
                raise Conflict(
                    f"node {name} already has the GPUs it is expected to have ({len(now)}); nothing to accept"
                    f"{hint}",
                    field="node",
                )
            was = len(before) if before is not None else None
            old = {g["uuid"]: g for g in before or []}
            gone = [g for g in before or [] if g["uuid"] not in {n["uuid"] for n in now}]
            added = [g for g in now if g["uuid"] not in old]
            parts = [f"expected GPUs {was if was is not None else 'unknown'} -> {len(now)}"]
            if gone:
                parts.append(
                    "no longer expected: " + ", ".join(f"GPU {g['index']} {g['uuid']}" for g in gone)
                )
            if added:
                parts.append("newly expected: " + ", ".join(f"GPU {g['index']} {g['uuid']}" for g in added))
            text = "; ".join(parts)
            node.expected_gpus = now
            s.add(
                Event(
                    object_kind="node", object_id=name, from_state=node.state, to_state=node.state,
                    reason=f"accepted by {actor}: {text}", actor=actor,
                )
            )  # fmt: skip
        with self._lock:
            self._expected_now[name] = len(now)
            self._failed_rechecks.pop(name, None)  # its next recheck comes at the shortest interval
        log.warning("event=node_gpus_accepted node=%s actor=%s change=%r", name, actor, text)
        return {"node": name, "expected_gpus": len(now), "was": was, "gpus": now, "result": text}

    # -- fault injection (simulated GPUs) ------------------------------------------------------------

    def inject_fault(self, name: str, gpu: int, fault: str, value: Any = None) -> str:
        """Inject a fault into a simulated GPU of the head's own node or of an agent node (its agent applies
        it); anything else is refused with the reason. Returns what was done, in words."""
        if fault not in FAULTS:
            raise Invalid(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}", field="fault")
        if name == self.local_node and self.local_gpus is not None:
            try:
                done = faults.inject(self.local_gpus, name, gpu, fault, value)
            except faults.FaultRefused as exc:
                raise _service_error(exc.message, exc.kind, exc.field) from exc
            self._publish()
            return done
        if self.agents is None or not self.agents.knows(name):
            self._node_state(name)  # NotFound (naming the nodes) for a node that does not exist
            where = f"the head's own node ({self.local_node})" if self.local_gpus is not None else "none here"
            raise Conflict(
                f"node {name}: faults go into simulated GPUs of the head's own node or of a connected agent "
                f"node; {name} is neither ({where})",
                field="node",
            )
        instruction = {"kind": "inject_fault", "gpu": gpu, "fault": fault, "value": value}
        try:
            reply = self.agents.ask(name, instruction, FAULT_TIMEOUT)
        except (TimeoutError, LookupError) as exc:
            raise Conflict(f"node {name}: its agent did not apply the fault: {exc}", field="node") from exc
        if reply.get("error"):
            raise _service_error(str(reply["error"]), str(reply.get("kind")), reply.get("field"))
        log.warning("event=fault_injected node=%s gpu=%d fault=%s value=%r", name, gpu, fault, value)
        return str(reply.get("result"))

    # -- what the API shows ---------------------------------------------------------------------------

    def view(self, name: str, state: str, state_reason: str) -> dict[str, Any]:
        """The health of one node as the API shows it (a node marked unhealthy before a restart stays so)."""
        with self._lock:
            entry = self._nodes.get(name)
            expected = self._expected_now.get(name)  # GPUs it is expected to have; None: not known yet
        if entry is None:
            if state == "unhealthy":
                return {
                    "health": checks.UNHEALTHY,
                    "evidence": state_reason,
                    "findings": [],
                    "checked_at": None,
                    "expected_gpus": expected,
                }
            return {
                "health": checks.UNKNOWN,
                "evidence": "no telemetry yet",
                "findings": [],
                "checked_at": None,
                "expected_gpus": expected,
            }
        out = state == "unhealthy" or _rechecking(state, state_reason)
        health = checks.UNHEALTHY if out else entry.verdict.health
        evidence = (
            state_reason if out and entry.verdict.health != checks.UNHEALTHY else entry.verdict.evidence
        )
        return {
            "health": health,
            "evidence": evidence,
            "findings": [f.to_dict() for f in entry.verdict.findings],
            "checked_at": entry.checked_at,
            "active": entry.active,
            "active_at": entry.active_at,
            "expected_gpus": expected,
        }

    def views(self) -> dict[str, dict[str, Any]]:
        """Health of every node, by name."""
        return {name: self.view(name, state, reason) for name, state, reason, _ in self._nodes_now()}


def node_events(store: Store, name: str, limit: int = 50) -> list[dict[str, Any]]:
    """The latest events of a node (state changes and health verdicts), oldest first."""
    with store.read() as s:
        rows = s.scalars(
            select(Event)
            .where(Event.object_kind == "node", Event.object_id == name)
            .order_by(Event.id.desc())
            .limit(limit)
        ).all()
        return [
            {
                "at": (as_utc(e.at) or utcnow()).isoformat(),
                "from": e.from_state,
                "to": e.to_state,
                "reason": e.reason,
                "actor": e.actor,
            }
            for e in reversed(rows)
        ]


def _conditions(verdict: Verdict) -> tuple[str, frozenset[tuple[str, int | None, str]]]:
    """What a verdict says is wrong, without the readings that move from sample to sample: its health and
    each finding that sets it as (check, GPU, and for an Xid its message, which names the code). A GPU at
    86, 87, 86 C is one warm GPU, not three verdicts (an event and a count each, every second)."""
    return verdict.health, frozenset(
        (f.check, f.gpu, f.message if f.check == "xid" else "")
        for f in verdict.findings
        if f.severity == verdict.health
    )


def _rechecking(state: str, reason: str) -> bool:
    return state == "cordoned" and reason.startswith(RECHECKING)


def _reason_before_recheck(reason: str) -> str:
    return reason.partition("; ")[2] or "health: unhealthy"


def _health_cordon(reason: str) -> bool:
    return reason in (CHECKING, BACK_FROM_LOST) or reason.startswith(RECHECKING)


def _listing(gpus: list[Gpu]) -> list[dict[str, Any]]:
    """GPUs as `Node.expected_gpus` keeps them."""
    return [{"index": g.index, "uuid": g.uuid, "model": g.model} for g in sorted(gpus, key=lambda g: g.index)]


def _service_error(message: str, kind: str, field: str | None) -> Invalid | Conflict:
    """A refused fault as the API shows it: 409 when the GPUs cannot take faults, 422 for bad input."""
    if kind == "conflict":
        return Conflict(message, field=field)
    return Invalid(message, field=field)
