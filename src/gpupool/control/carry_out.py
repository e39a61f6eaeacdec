"""The reconcile loop's schedule phase, second half (control/loop.py): the scheduler's decisions carried out.

Each pending workload's explanation is kept in memory and written to the store when its code changes;
evictions are put on record before their SIGTERMs go out; the GPUs of stopping work are promised to the
workload they are for; each bind is started: its attempt recorded, then launched on the backend. A backend
that cannot take work at all leaves the work pending at no cost, and no start is tried for BACKEND_RETRY
seconds.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from gpupool import scheduler
from gpupool.backends.base import HANDLE_ID, BackendUnavailable, Handle, Launch, LaunchError, Pod, Unrunnable
from gpupool.control import contract, secrets
from gpupool.control.lifecycle import CANCELLED, EVICTED, FAILED, PENDING, RUNNING, SERVICE, transition
from gpupool.control.observe import Observation, store_handle
from gpupool.control.secret_keys import SecretKeys
from gpupool.spec import format_gpu_indices
from gpupool.store.models import Attempt, Event, Gpu, Node, Workload
from gpupool.timeutil import utcnow

log = logging.getLogger("gpupool.control")

EXPLAIN_PERSIST_INTERVAL = 5.0  # seconds between writes of changed reason codes to the store
EXPLAIN_BATCH = 200
# After the backend could not take work at all (Slurm's controller unreachable), no start is tried for this
# long: each try can block a pass for the backend's own timeout.
BACKEND_RETRY = 15.0
BACKEND_UNAVAILABLE = "backend-unavailable"  # the reason code of work bound while starts wait for it


class CarryingOut(Observation):
    """The decisions carried out of `Reconciler` (control/loop.py), which sets these attributes; built on
    its observe phase, whose handles and retries it uses."""

    secret_keys: SecretKeys
    # (until, why) while starts wait for a backend that could not take work (`_backend_unavailable`)
    _backend_down: tuple[float, str] | None
    _reasons: dict[int, scheduler.Explanation]  # the explanations last written to the store
    explanations: dict[int, scheduler.Explanation]  # every pending workload's latest, for the API
    _explained_at: float

    def _explain_unstarted(
        self,
        binds: Sequence[scheduler.Bind],
        explanations: Mapping[int, scheduler.Explanation],
        waiting: Mapping[int, scheduler.Explanation],
    ) -> None:
        """Why the work this pass bound waits, while starts wait for the backend: it would start now."""
        assert self._backend_down is not None
        until, why = self._backend_down
        at = time.strftime("%H:%M:%S UTC", time.gmtime(until))
        said = scheduler.Explanation(
            BACKEND_UNAVAILABLE,
            f"it would start now, but the {self.backend.name} backend could not take work ({why}); the next "
            f"start is tried at {at}",
        )
        pending = {b.workload_id for b in binds}
        with self.store.read() as s:  # those that the passes started before the backend failed are running
            pending &= set(
                s.scalars(select(Workload.id).where(Workload.id.in_(pending), Workload.state == PENDING))
            )
        self._explain({**explanations, **waiting, **dict.fromkeys(pending, said)})

    def _evict(self, evictions: list[scheduler.Eviction]) -> None:
        """Stop evicted work gracefully (SIGTERM, SIGKILL after the grace period); it is requeued on exit.
        The SIGTERMs go out once the evictions are on record (see `observe`): work that heard one before a
        head died could otherwise end with 143 and be failed as if it had ended on its own."""
        stopping: list[Handle] = []
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
                    stopping.append(handle)
                attempt.stop_requested_at = utcnow()
                attempt.stop_reason = eviction.code
                attempt.stop_for_workload = eviction.for_workload
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
        for handle in stopping:
            self.backend.signal(handle, signal.SIGTERM)

    def _promise(self, released_to: dict[int, int]) -> None:
        """Keep the pending workload that the GPUs of stopping work were promised to (cancelled or drained
        work, or work whose gainer has gone: see `Decisions.released_to`) on the stopping attempt, as an
        eviction's gainer is kept: the next snapshot gives it as that work's `evicted_for`."""
        with self.store.session() as s:
            for workload_id, waiting in released_to.items():
                attempt = s.scalar(
                    select(Attempt).where(Attempt.workload_id == workload_id, Attempt.state == RUNNING)
                )
                if attempt is None or attempt.stop_requested_at is None:
                    continue  # it has stopped since the snapshot: its GPUs are free for the next pass
                attempt.stop_for_workload = waiting
                log.info("event=release_promised workload=%d to=%d", workload_id, waiting)

    def _start(self, bind: scheduler.Bind) -> None:
        """Record and launch one bind. Each pod keeps its GPUs' model for accounting (control/accounting.py),
        which prices an attempt as it ran, whatever its node holds later."""
        home = self.settings.home
        with self.store.session() as s:
            workload = s.get(Workload, bind.workload_id)
            if workload is None or workload.state != PENDING or workload.held:
                return  # ended, started, or held since the pass read its snapshot
            try:  # read now, so that a secret set again reaches the next attempt
                values = secrets.resolve(
                    s, self.secret_keys, workload.user, workload.spec.get("secrets") or ()
                )
            except secrets.SecretUnavailable as exc:
                transition(s, workload, FAILED, f"cannot start: {exc}", actor="control")
                return
            number = len(workload.attempts)
            run_dir = home / "runs" / str(workload.id) / str(number)
            log_path = home / "logs" / str(workload.id) / f"attempt-{number}.log"
            for left in (
                run_dir,
                log_path,
                *log_path.parent.glob(f"{log_path.stem}.rank-*{log_path.suffix}"),
            ):
                _set_aside(left)
            resources = workload.spec.get("resources") or {}
            models = _gpu_models(s, bind.pods)
            attempt = Attempt(
                workload_id=workload.id,
                number=number,
                state=RUNNING,
                node_name=bind.node,
                queue=workload.queue,
                backend=self.backend.name,
                gpu_indices=list(bind.gpu_indices),
                gpu_fraction=bind.gpu_fraction,
                cpus=float(resources.get("cpu") or 0.0),
                memory_bytes=int(resources.get("memory") or 0),
                run_dir=str(run_dir),
                log_path=str(log_path),
                pods=[
                    {
                        "node": p.node,
                        "gpu_indices": list(p.gpu_indices),
                        "gpu_fraction": p.gpu_fraction,
                        "model": _pod_model(models, p),
                    }
                    for p in bind.pods
                ],
            )
            gpus = ",".join(map(str, bind.gpu_indices)) or "none"  # for the log line below
            verdict = transition(
                s,
                workload,
                RUNNING,
                "started on " + ", ".join(f"{p.node} {format_gpu_indices(p.gpu_indices)}" for p in bind.pods),
                actor="scheduler",
            )
            if not verdict.accepted:
                return
            s.add(attempt)
            s.flush()
            launch = self._launch(workload, attempt, bind.pods, values)
        # The attempt is durable before its process exists; a crash here leaves a pid-less attempt that
        # observe() settles after PID_GRACE.
        try:
            handle = self.backend.start(launch)
        except BackendUnavailable as exc:
            self._backend_unavailable(launch, str(exc))
            return
        except LaunchError as exc:
            # As an attempt that failed on its node: a service starts again (after its restart backoff),
            # a job as its retry policy says for `node-failure`, else it fails with the reason; work the
            # backend can never run fails at once. It ran nothing, so it costs nothing.
            with self.store.session() as s:
                failed = s.get(Attempt, launch.attempt_id)
                assert failed is not None
                failed.state, failed.reason, failed.finished_at = FAILED, str(exc), failed.started_at
                if isinstance(exc, Unrunnable):
                    why = f"cannot run on the {self.backend.name} backend: {exc}"
                    transition(s, failed.workload, FAILED, why, actor="control")
                else:
                    self._retry_or_fail(s, failed.workload, f"cannot start: {exc}", "node-failure")
            return
        with self.store.session() as s:
            started = s.get(Attempt, launch.attempt_id)
            assert started is not None
            store_handle(started, handle)
            started.endpoint = handle.endpoint
        log.info(
            "event=attempt_started workload=%d attempt=%d node=%s gpus=%s %s=%d",
            bind.workload_id,
            launch.attempt_number,
            bind.node,
            gpus,
            HANDLE_ID.get(self.backend.name, "pid"),
            handle.pid,
        )

    def _backend_unavailable(self, launch: Launch, why: str) -> None:
        """The backend could not take the attempt at all (its controller is unreachable): no node failed and
        the work did nothing wrong, so it goes back to pending using nothing (no restart, no node failure,
        no GPU-seconds), and no start is tried for BACKEND_RETRY seconds (`schedule`)."""
        self._backend_down = (time.time() + BACKEND_RETRY, why)
        log.warning("event=backend_unavailable backend=%s attempt=%d error=%r", self.backend.name,
                    launch.attempt_id, why)  # fmt: skip
        with self.store.session() as s:
            attempt = s.get(Attempt, launch.attempt_id)
            assert attempt is not None
            attempt.state, attempt.finished_at = EVICTED, attempt.started_at
            attempt.reason = f"not started: the {self.backend.name} backend could not take it ({why})"
            if attempt.workload.cancel_requested:  # cancelled while it was being started
                transition(
                    s, attempt.workload, CANCELLED, "cancelled before its attempt started", actor="control"
                )
                return
            transition(
                s, attempt.workload, PENDING,
                f"not started: the {self.backend.name} backend could not take it ({why}); it waits pending "
                "and starts once the backend answers (no restart used)", actor="control",
            )  # fmt: skip

    def _launch(
        self,
        workload: Workload,
        attempt: Attempt,
        pods: tuple[scheduler.PodPlacement, ...] = (),
        secret_values: dict[str, str] | None = None,
    ) -> Launch:
        home = self.settings.home
        spec = workload.spec
        workdir = contract.workdir_for(spec, home, workload.id)
        if not spec.get("workdir"):
            workdir.mkdir(parents=True, exist_ok=True)
        checkpoint_dir = contract.checkpoint_dir_for(spec, workdir, home, workload.id, workload.array_index)
        service_port = contract.free_port() if workload.kind == SERVICE else 0
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
            service_port=service_port,
            service_id=workload.service_id,
            replica=workload.replica,
            array_id=workload.array_id,
            array_index=workload.array_index,
        )
        env.update(secret_values or {})
        # Only where the job runs on this machine as the head's own user (local). An agent makes it on its
        # node; on Slurm the job's batch script does: the head (root, perhaps) makes no directory a spec
        # names on anyone's behalf.
        if self.backend.name == "local":
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
            service_port=service_port,
            grace_period=float(spec.get("grace_period", 30.0)),
            max_duration=spec.get("max_duration"),
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
        table = cast(Table, Workload.__table__)
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


def _gpu_models(s: Session, pods: Sequence[scheduler.PodPlacement]) -> dict[tuple[str, int], str]:
    """The model of each GPU of the nodes `pods` are on, by (node, index)."""
    nodes = {pod.node for pod in pods if pod.gpu_indices}
    if not nodes:
        return {}
    rows = s.execute(
        select(Node.name, Gpu.index, Gpu.model).join(Gpu, Gpu.node_id == Node.id).where(Node.name.in_(nodes))
    )
    return {(node, index): model for node, index, model in rows}


def _pod_model(models: Mapping[tuple[str, int], str], pod: scheduler.PodPlacement) -> str | None:
    """The model of the GPUs a pod holds (all of one model: placement.Placer._one_model); None for a pod
    with no GPU."""
    if not pod.gpu_indices:
        return None
    return models.get((pod.node, pod.gpu_indices[0]))


def _set_aside(path: Path) -> None:
    """Rename a run dir or log that a new attempt's path already names: one left by an attempt of the same
    workload id and number in another store (restored from a backup, or another head's on this
    GPUPOOL_HOME). Read as this attempt's, its exit code had the new work "succeed" at once while its
    real job ran on untracked. Kept beside, for whoever looks, never read."""
    if not path.exists():
        return
    aside = path.with_name(f"{path.name}.stale-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    try:
        path.rename(aside)
    except OSError as exc:
        log.error("event=stale_attempt_files_kept path=%s error=%s", path, exc)
        return
    log.warning("event=stale_attempt_files path=%s moved_to=%s", path, aside)
