"""The health loop's checks (control/health.py): a node's passive verdict from its telemetry, its active
checks as a check job, and the verdicts recorded (the phase above `HealthState`, control/health_state.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sqlalchemy import select

from gpupool.control.errors import Conflict
from gpupool.control.health_jobs import CheckJobFailed, require_free
from gpupool.control.health_state import ACTOR, HealthState, NodeHealth
from gpupool.control.inventory import BACK_FROM_LOST
from gpupool.health import checks
from gpupool.health.active import ActiveCheckError
from gpupool.health.checks import Baseline, Finding, Verdict
from gpupool.store.models import Event, Node

log = logging.getLogger("gpupool.health")

STALE_AFTER = 30.0  # seconds without samples after which a node's last samples are not judged


class Judging(HealthState):
    """Judging nodes: the passive and active checks of one node, and what their verdicts change."""

    # -- checks ---------------------------------------------------------------------------------------

    def can_check(self, name: str) -> bool:
        """Whether a check job can run on the node: the head's own node (its GPUs, the local backend) or a
        connected agent's node (the agent backend). Slurm nodes are checked by Slurm's own health checks."""
        if name == self.local_node and self.local_gpus is not None:
            return True
        return self.agents is not None and self.agents.knows(name)

    def _check_later(self, name: str, level: str, *, backs_off: bool = False) -> None:
        """Run the checks of one node in a thread of its own, unless they run already or PARALLEL_CHECKS
        others do (a later pass starts it: many idle nodes fall due at once). `backs_off`: `_check_held`'s."""
        lock = self._running.setdefault(name, threading.Lock())
        if lock.locked() or not self._parallel.acquire(blocking=False):
            return

        def run() -> None:
            try:
                if not lock.acquire(blocking=False):
                    return
                try:
                    self._check_locked(name, level, backs_off=backs_off)
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

    def _no_gpus(self, name: str, now: float) -> Verdict | None:
        """A node whose join token declares GPUs but that has registered none (its driver lists none: all
        fell off the bus) sends no samples to judge. Once this head has seen it so for STALE_AFTER (an agent
        registers its GPUs with its first heartbeats), the count alone is its verdict: unhealthy."""
        sampled = self.telemetry.age(name) is not None  # the cache's own lock, not under the monitor's
        with self._lock:
            if sampled or not self._declared_now.get(name) or self._gpus_now.get(name):
                self._bare_since.pop(name, None)
                return None
            declared = self._declared_now[name]
            since = self._bare_since.setdefault(name, now)
        if now - since < STALE_AFTER:
            return None
        return checks.passive(
            [], expected_gpus=0, models={}, config=self.config, baseline=self._baseline(name),
            declared_gpus=declared,
        )  # fmt: skip

    def _judge(self, name: str, baseline: Baseline, *, fresh: bool = False) -> Verdict | None:
        """The passive checks of the node's latest samples of the GPUs it has registered now (rows of a GPU
        it no longer lists stay in the telemetry cache), against the GPUs it is expected to have."""
        if fresh:
            with self._lock:
                models, uuids = self._gpus_now.get(name, {}), self._uuids_now.get(name, {})
                count = self._expected_now.get(name)
                declared = self._declared_now.get(name)
        else:
            models, uuids, listed, declared = self._inventory(name)
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
            declared_gpus=declared,
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

    def _inventory(
        self, name: str
    ) -> tuple[dict[int, str], dict[int, str], list[dict[str, Any]] | None, int | None]:
        """The node's GPUs now (index -> model, index -> UUID), the GPUs it is expected to have, and how many
        its join token declares."""
        with self.store.read() as s:
            node = s.scalar(select(Node).where(Node.name == name))
            if node is None:
                return {}, {}, None, None
            return (
                {g.index: g.model for g in node.gpus},
                {g.index: g.uuid for g in node.gpus},
                node.expected_gpus,
                node.declared_gpus,
            )

    def _check_locked(self, name: str, level: str, *, backs_off: bool = False) -> dict[str, Any]:
        try:
            return self._check_held(name, level, backs_off=backs_off)
        finally:
            with self._lock:
                self._checks_done[name] += 1

    def _check_held(self, name: str, level: str, *, backs_off: bool = False) -> dict[str, Any]:
        """The checks of one node, its lock held (`check`, `_check_later`). `backs_off`: a scheduled recheck
        of an unhealthy node that was checked since it fell; its failure doubles the node's recheck interval
        (`HealthMonitor._recheck_interval`). A check on demand (`gpupool health run`) never backs off the
        loop's schedule: the loop's next recheck comes `recheck_interval` after it, as after any check."""
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
        # A node that passes is judged with what it shows now acknowledged (old Xids, ECC counts), and that
        # baseline is kept. One that fails keeps its baseline and is judged with it: the verdict names every
        # fault still counted against it (an ECC error acknowledged in a verdict that failed for a pending
        # row remap would read as gone, then come back once the remap was cleared).
        tentative = Baseline()
        tentative.acknowledge(self.telemetry.node_samples(name))
        if_kept = checks.combine(self._judge(name, tentative) or passive, active)
        overall = self._with_bench(name, if_kept, began) or if_kept
        passed = overall.health != checks.UNHEALTHY
        if not passed:
            judged = checks.combine(self._judge(name, self._baseline(name)) or passive, active)
            overall = self._with_bench(name, judged, began) or judged
        with self._lock:
            entry = self._nodes.setdefault(name, NodeHealth(overall, began))
            entry.active, entry.active_at, entry.active_verdict = active_view, began, active
        self._record(name, state, overall, began)
        if not passed:
            with self._lock:
                if state == "unhealthy" and backs_off:
                    self._failed_rechecks[name] = self._failed_rechecks.get(name, 0) + 1
                self._unhealthy_since.setdefault(name, began)  # one it takes out: out since it began
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


def _conditions(verdict: Verdict) -> tuple[str, frozenset[tuple[str, int | None, str]]]:
    """What a verdict says is wrong, without the readings that move from sample to sample: its health and
    each finding that sets it as (check, GPU, and for an Xid its message, which names the code). A GPU at
    86, 87, 86 C is one warm GPU, not three verdicts (an event and a count each, every second)."""
    return verdict.health, frozenset(
        (f.check, f.gpu, f.message if f.check == "xid" else "")
        for f in verdict.findings
        if f.severity == verdict.health
    )
