"""The health loop: judges every node from its telemetry, drains unhealthy nodes, and lets them back only
after they pass the active checks.

Each pass (every second, in its own thread): the passive checks read the latest samples of every node
(`health.checks.passive`); an `unhealthy` verdict moves the node to state `unhealthy` (no new work) and asks
the reconcile loop to stop its attempts (`stop_reason` "drain": SIGTERM, SIGKILL after the grace period,
requeued to resume from the checkpoint). An unhealthy node gets the active checks as soon as its work has
left, then every `schedule.recheck_interval` seconds (doubled after each failed recheck; a check on demand
never backs them off); it returns to `ready` when they pass and no passive fault remains.
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

`HealthMonitor` is the top of a chain of classes, a phase per module: `HealthState` (control/health_state.py:
what the loop knows of each node; reading, setting and draining node states) -> `Judging`
(control/health_judge.py: the passive and active checks and their verdicts) -> `HealthMonitor` (this file:
the loop's pass, checks on demand, expected GPUs, fault injection, what the API shows).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import select

from gpupool.control.errors import Conflict, Invalid, NotFound
from gpupool.control.health_judge import Judging
from gpupool.control.health_state import ACTOR, CHECKING, PARALLEL_CHECKS, RECHECKING
from gpupool.control.inventory import BACK_FROM_LOST
from gpupool.health import checks, faults
from gpupool.health.checks import Finding
from gpupool.health.thresholds import LEVELS
from gpupool.store.db import Store
from gpupool.store.models import Event, Gpu, Node
from gpupool.timeutil import as_utc, utcnow

log = logging.getLogger("gpupool.health")

FAULTS = faults.FAULTS
FAULT_TIMEOUT = 15.0  # seconds an agent node has to apply an injected fault and say so
HELD_OUT = " (not back in service until it passes the active checks)"  # ends a held-out node's evidence


class HealthMonitor(Judging):
    """The health loop of one head: see the module's docstring."""

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
        with self._lock:
            accepted = self._accepted
        checking = self._checks_now()  # before the nodes are read: see _left_to_its_checks
        nodes = self._nodes_now(accepted)
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
            verdict = self._with_bench(name, self._passive(name, fresh=True) or self._no_gpus(name, now), now)
            with self._lock:
                if self._accepted != accepted:  # an admin accepted a node's GPUs meanwhile: judge next pass
                    return
                entry = self._nodes.get(name)
                failed = entry.active_verdict if entry is not None and state == "unhealthy" else None
            if verdict is not None and failed is not None and failed.health == checks.UNHEALTHY:
                verdict = checks.combine(verdict, failed)  # what its last active checks found stands
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
                # Rechecked as soon as its work has left (a drain is never raced), then every recheck
                # interval after its last active checks, also when they ran just before it fell (a flapping
                # GPU is not retried every second). Only a recheck after the first since it fell backs off.
                with self._lock:
                    since = self._unhealthy_since.setdefault(name, now)
                if not busy and self._due(name, now, self._recheck_interval(name)) and self.can_check(name):
                    backs_off = self._checked_since(name, since)
                    self._check_later(name, schedule.recheck_level, backs_off=backs_off)
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

    # -- checks on demand (the API's `health run`) ----------------------------------------------------

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
        node that cannot be checked now (it runs work) is reported as skipped, with why (a node named alone
        is `check`ed, and refused)."""

        def one(name: str) -> dict[str, Any]:
            try:
                return self.check(name, level)
            except Conflict as exc:
                return {"node": name, "level": level, **self.views().get(name, {}), "skipped": exc.message,
                        "state": self._node_state(name)}  # fmt: skip

        if len(names) <= 1:
            return [one(name) for name in names]
        with ThreadPoolExecutor(min(PARALLEL_CHECKS, len(names)), thread_name_prefix="health-run") as pool:
            return list(pool.map(one, names))

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
            now, before, declared = _listing(node.gpus), node.expected_gpus, node.declared_gpus
            short = declared is not None and declared > len(now)  # joined short of what its token declares
            if not short and before is not None and {g["uuid"] for g in before} == {g["uuid"] for g in now}:
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
            if short:
                was = max(was or 0, declared or 0)
            old = {g["uuid"]: g for g in before or []}
            gone = [g for g in before or [] if g["uuid"] not in {n["uuid"] for n in now}]
            added = [g for g in now if g["uuid"] not in old]
            parts = [f"expected GPUs {was if was is not None else 'unknown'} -> {len(now)}"]
            if short:
                parts.append(f"its join token declared {declared}, it registered {len(now)}")
            if gone:
                parts.append(
                    "no longer expected: " + ", ".join(f"GPU {g['index']} {g['uuid']}" for g in gone)
                )
            if added:
                parts.append("newly expected: " + ", ".join(f"GPU {g['index']} {g['uuid']}" for g in added))
            text = "; ".join(parts)
            node.expected_gpus = now
            node.declared_gpus = None  # what the admin accepted is what is expected from now on
            s.add(
                Event(
                    object_kind="node", object_id=name, from_state=node.state, to_state=node.state,
                    reason=f"accepted by {actor}: {text}", actor=actor,
                )
            )  # fmt: skip
        with self._lock:
            self._accepted += 1
            self._expected_now[name] = len(now)
            self._declared_now.pop(name, None)
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
            raise Conflict(
                f"node {name}: its agent did not answer that it applied the fault ({exc}); the instruction "
                "may still reach it and be applied when it is back: `gpupool node show` says, `inject-fault "
                "--clear` undoes it",
                field="node",
            ) from exc
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
            declared = self._declared_now.get(name)  # at least these, as its join token declares
        if declared is not None and (expected is None or declared > expected):
            expected = declared
        if entry is None:
            if state == "unhealthy":
                return {
                    "health": checks.UNHEALTHY,
                    "evidence": state_reason,
                    "findings": [],
                    "checked_at": None,
                    "expected_gpus": expected,
                    "declared_gpus": declared,
                }
            return {
                "health": checks.UNKNOWN,
                # lost before this head heard from it (it restarted since): nothing judged it
                "evidence": "node lost: no telemetry since the head started"
                if state == "lost"
                else "no telemetry yet",
                "findings": [],
                "checked_at": None,
                "expected_gpus": expected,
                "declared_gpus": declared,
            }
        out = state == "unhealthy" or _rechecking(state, state_reason)
        health = checks.UNHEALTHY if out else entry.verdict.health
        evidence = (
            state_reason if out and entry.verdict.health != checks.UNHEALTHY else entry.verdict.evidence
        )
        if state == "lost":  # nothing judged it since: what it was is history, not its health now
            age = self.telemetry.age(name)
            silent = f"no telemetry for {age:.0f}s" if age is not None else "no telemetry"
            health, evidence = checks.UNKNOWN, f"node lost: {silent} (last judged {health}: {evidence})"
        return {
            "health": health,
            "evidence": evidence,
            "findings": [f.to_dict() for f in entry.verdict.findings],
            "checked_at": entry.checked_at,
            "active": entry.active,
            "active_at": entry.active_at,
            "expected_gpus": expected,
            "declared_gpus": declared,
        }

    def views(self) -> dict[str, dict[str, Any]]:
        """Health of every node, by name."""
        with self._lock:
            accepted = self._accepted
        return {name: self.view(name, state, reason) for name, state, reason, _ in self._nodes_now(accepted)}


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


def _rechecking(state: str, reason: str) -> bool:
    return state == "cordoned" and reason.startswith(RECHECKING)


def _reason_before_recheck(reason: str) -> str:
    return reason.partition("; ")[2] or "health: unhealthy"


def _listing(gpus: list[Gpu]) -> list[dict[str, Any]]:
    """GPUs as `Node.expected_gpus` keeps them."""
    return [{"index": g.index, "uuid": g.uuid, "model": g.model} for g in sorted(gpus, key=lambda g: g.index)]


def _service_error(message: str, kind: str, field: str | None) -> Invalid | Conflict:
    """A refused fault as the API shows it: 409 when the GPUs cannot take faults, 422 for bad input."""
    if kind == "conflict":
        return Conflict(message, field=field)
    return Invalid(message, field=field)
