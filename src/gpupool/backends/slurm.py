"""Run attempts as Slurm batch jobs, pinned to the nodes and GPU counts gpupool's scheduler chose.

gpupool stays the admission and placement authority: an attempt is submitted only once the scheduler has
bound it, with `--nodelist`, `--nodes`, `--ntasks-per-node=1` and `--gres=gpu:N`, so Slurm starts it at
once. Each attempt is one Slurm job (`--no-requeue`): where Slurm would requeue, gpupool starts a new
attempt that resumes from the checkpoint. The batch script writes RUN_DIR/exit_code like the local shim,
so an attempt's exit status outlives the head. A poller keeps the latest `squeue` and `scontrol show node`
answers, from which `status` and `inventory` answer without calling Slurm. The job's name and scripts:
backends/slurm_script.py; Slurm's node and job states read: backends/slurm_states.py. See docs/slurm.md.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from gpupool.backends.base import (
    BackendUnavailable,
    ForeignJob,
    Handle,
    Inventory,
    InventoryNode,
    Launch,
    LaunchError,
    Phase,
    Pod,
    Status,
    Unrunnable,
    recorded_end,
    recorded_exit_code,
)
from gpupool.backends.slurm_commands import (
    JobRow,
    SlurmCommands,
    SlurmError,
    SlurmTimeout,
    SlurmUnreachable,
    format_time_limit,
    gpu_indices_by_node,
    gpus_in_tres,
    missing_tools,
    partition_max_time,
)
from gpupool.backends.slurm_script import JOB_PREFIX, job_name, write_scripts
from gpupool.backends.slurm_states import DRAIN_PREFIX, HOLDING, SIGNAL_DEATH, final_status, inventory_node
from gpupool.backends.slurm_time import (
    JOB_ENDED,
    PARTITION_INTERVAL,
    PartitionTime,
    followed,
    minutes_for,
    write_followed,
)
from gpupool.spec import SpecError, format_duration

if TYPE_CHECKING:
    from gpupool.spec.workload import WorkloadSpec

log = logging.getLogger("gpupool.slurm")

WHOLE_GPUS = (
    "Slurm gives whole GPUs to a job; request a whole number of GPUs (a fraction needs Slurm's shard GRES, "
    "which gpupool does not drive yet)"
)

NAME_FILE = "slurm_job_name"  # RUN_DIR/slurm_job_name: written before sbatch, so that find() knows it
CANCEL_TIMEOUT = 10.0  # seconds, for the scancel after an sbatch that timed out
# Hand-off: a finished job keeps its allocation until gpupool has submitted the job it placed on the
# same GPUs (or the control loop's pass ends with nothing placed there; RELEASE_AFTER if the loop stalls;
# HANDOFF_MAX if the head is gone), so that the successor is already pending when Slurm frees the GPUs.
# The head then ends the finished job's allocation with libslurm's slurm_complete_job while its batch
# script still runs: slurmd stops the script and reports with an epilog-complete message, on which
# slurmctld schedules at once and starts the successor, instead of at its next periodic pass (up to
# `batch_sched_delay`, 3 s by default, later). Without libslurm the head touches RUN_DIR/released and the
# script ends by itself. See docs/slurm.md.
RELEASE_AFTER = 1.0
HANDOFF_MAX = 2.0


class SlurmBackend:
    name = "slurm"

    def __init__(
        self,
        *,
        partition: str | None = None,
        on_change: Callable[[], None] | None = None,
        commands: SlurmCommands | None = None,
        poll_interval: float = 1.0,
        exit_poll_interval: float = 0.1,
    ) -> None:
        self.commands = commands or SlurmCommands()
        self.partition = partition
        self.poll_interval = poll_interval
        self.exit_poll_interval = exit_poll_interval
        self._on_change = on_change
        self._lock = threading.Lock()
        self._jobs: dict[str, JobRow] = {}  # the latest squeue: pending, running, completing jobs
        self._jobs_at = 0.0  # monotonic time that squeue was asked
        self._submitted: dict[str, float] = {}  # job id -> monotonic time we submitted it
        self._run_dirs: dict[str, Path] = {}  # our jobs' run dirs, until the loop settles them
        self._exited: set[str] = set()  # of those, the ones whose exit_code the poller has seen
        self._slots: dict[str, frozenset[tuple[str, int]]] = {}  # our jobs' (node, GPU index) as placed
        # settled jobs still holding their GPUs: run dir, when settled, the (node, GPU index) they hold
        self._handing_off: dict[str, tuple[Path, float, frozenset[tuple[str, int]]]] = {}
        self._finals: dict[str, dict[str, str]] = {}  # scontrol records of our jobs that left squeue
        self._signalled: set[str] = set()  # our jobs gpupool sent a signal (their signal deaths are ours)
        self._gangs: set[str] = set()  # our multi-node jobs (signal() spares their batch step's srun)
        # our jobs that recorded a signal death gpupool did not send: how Slurm says they ended, once known,
        # else when Slurm was last asked (monotonic)
        self._verdicts: dict[str, Status] = {}
        self._asked: dict[str, float] = {}
        self._foreign_indices: dict[str, dict[str, tuple[int, ...]]] = {}
        self._nodes: dict[str, InventoryNode] = {}
        self._inventory: Inventory | None = None
        self._max_time = PartitionTime()  # refuse() answers from it without asking Slurm
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.check()
        self.refresh()

    # -- setup ----------------------------------------------------------------------------------------

    def check(self) -> None:
        """Fail at start, with the fix, when the head cannot use Slurm."""
        missing = missing_tools(self.commands.env.get("PATH"))
        if missing:
            raise SlurmError(
                f"--backend slurm needs Slurm's client tools on PATH; missing: {', '.join(missing)}. "
                "Install them on the head (Debian: apt-get install slurm-client munge), copy the cluster's "
                "slurm.conf and munge.key, or run the head on a Slurm login node"
            )
        self.commands.ping()
        partitions = self.commands.partitions()
        if self.partition is not None:
            names = [p.get("PartitionName", "") for p in partitions]
            if self.partition not in names:
                raise SlurmError(
                    f"--partition {self.partition}: no such Slurm partition "
                    f"(partitions: {', '.join(names) or 'none'}); pass one of them or leave --partition out"
                )
        self._note_max_time(partitions)

    def _note_max_time(self, partitions: list[dict[str, str]]) -> None:
        if self._max_time.note(partition_max_time(partitions, self.partition), time.monotonic()):
            log.warning("event=slurm_max_time_unknown partition=%s", self.partition or "(default)")

    def _read_max_time(self) -> None:
        """Read the partition's MaxTime again; a Slurm that does not answer leaves the last one known."""
        try:
            self._note_max_time(self.commands.partitions())
        except SlurmError as exc:
            self._max_time.read_at = time.monotonic()  # tried: again after PARTITION_INTERVAL
            log.warning("event=slurm_partition_read_failed error=%r", str(exc))

    def watch(self) -> None:
        """Start the poller that keeps squeue's and scontrol's answers fresh and wakes the loop."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._poll, name="slurm-poller", daemon=True)
            self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.commands.close()
        calls = " ".join(f"{name}={n}" for name, n in sorted(self.commands.calls.items()))
        log.info("event=slurm_commands_run %s", calls)

    def _poll(self) -> None:
        self.commands.load_library()  # here, so that no pass of the control loop waits for it
        refreshed = time.monotonic()
        while not self._stop.wait(self.exit_poll_interval):
            self._release(older_than=RELEASE_AFTER)
            changed = self._exits_appeared()
            if time.monotonic() - refreshed >= self.poll_interval:
                refreshed = time.monotonic()
                try:
                    changed = self.refresh() or changed
                except SlurmError as exc:
                    log.warning("event=slurm_refresh_failed error=%r", str(exc))
                if refreshed - self._max_time.read_at >= PARTITION_INTERVAL:
                    self._read_max_time()
            if changed and self._on_change is not None:
                self._on_change()

    def _exits_appeared(self) -> bool:
        with self._lock:
            watched = [(j, d) for j, d in self._run_dirs.items() if j not in self._exited]
        done = [job_id for job_id, run_dir in watched if (run_dir / "exit_code").exists()]
        if done:
            with self._lock:
                self._exited.update(done)
        return bool(done)

    def pass_finished(self) -> None:
        """The control loop ended a pass: a settled job whose GPUs it placed nothing on lets go now."""
        self._release()

    def _release(self, older_than: float = 0.0, taken: frozenset[tuple[str, int]] | None = None) -> None:
        """End the hand-off of settled jobs: those waiting longer than `older_than`, or (with `taken`)
        those holding any of these (node, GPU index) slots, which a just-submitted job was placed on."""
        now = time.monotonic()
        with self._lock:
            due = [
                (j, d)
                for j, (d, at, slots) in self._handing_off.items()
                if (slots & taken if taken is not None else now - at >= older_than)
            ]
            for job_id, _ in due:
                self._handing_off.pop(job_id, None)
        for job_id, run_dir in due:
            code = recorded_exit_code(run_dir)
            if code is not None and self.commands.complete_job(job_id, code):
                continue
            try:
                (run_dir / "released").touch()
            except OSError as exc:  # the script stops waiting by itself after HANDOFF_MAX
                log.warning("event=slurm_release_failed run_dir=%s error=%r", run_dir, str(exc))

    # -- inventory ------------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Ask Slurm for its jobs and nodes; True when something the loop cares about changed."""
        asked = time.monotonic()
        rows = {row.job_id: row for row in self.commands.jobs()}
        nodes = {n.name: n for n in (inventory_node(r) for r in self.commands.nodes()) if self._mine(n)}
        foreign = self._foreign(rows, nodes)
        with self._lock:
            ours_before = {j for j in self._jobs if self._jobs[j].name.startswith(JOB_PREFIX)}
            ours_now = {j for j in rows if rows[j].name.startswith(JOB_PREFIX)}
            self._jobs, self._jobs_at = rows, asked
            previous = self._inventory
            listed = tuple(nodes.values())
            changed = previous is None or previous.nodes != listed or previous.foreign != foreign
            if changed:
                generation = (previous.generation + 1) if previous is not None else 1
                self._inventory = Inventory(listed, foreign, generation)
            self._nodes = nodes
        return changed or bool(ours_before - ours_now)

    def _mine(self, node: InventoryNode) -> bool:
        if self.partition is None:
            return True
        return self.partition in dict(node.labels).get("slurm.partitions", "").split(",")

    def _foreign(self, rows: dict[str, JobRow], nodes: dict[str, InventoryNode]) -> tuple[ForeignJob, ...]:
        jobs = []
        for row in rows.values():
            if row.name.startswith(JOB_PREFIX) or row.state not in HOLDING:
                continue
            on = tuple(n for n in row.nodes if n in nodes)
            if not on:
                continue
            gpus = gpus_in_tres(row.tres_per_node)
            indices = self._foreign_indices.get(row.job_id)
            if indices is None and gpus:
                text = self.commands.job_text(row.job_id, detail=True)
                indices = gpu_indices_by_node(text) if text else {}
                self._foreign_indices[row.job_id] = indices
            jobs.append(
                ForeignJob(
                    job_id=row.job_id,
                    name=row.name,
                    user=row.user,
                    state=row.state,
                    nodes=on,
                    gpus_per_node=gpus,
                    cpus_per_node=row.cpus / max(1, row.num_nodes),
                    gpu_indices=tuple(sorted((indices or {}).items())),
                    started_at=row.start_time,
                )
            )
        self._foreign_indices = {j: v for j, v in self._foreign_indices.items() if j in rows}
        return tuple(sorted(jobs, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0))

    def inventory(self) -> Inventory | None:
        with self._lock:
            return self._inventory

    def drain_node(self, name: str, reason: str) -> None:
        text = reason if reason.startswith(DRAIN_PREFIX) else DRAIN_PREFIX + reason
        self.commands.update_node(name, "drain", text)
        log.info("event=slurm_node_drained node=%s reason=%r", name, text)
        self._refresh_and_wake()

    def resume_node(self, name: str) -> None:
        self.commands.update_node(name, "resume")
        log.info("event=slurm_node_resumed node=%s", name)
        self._refresh_and_wake()

    def _refresh_and_wake(self) -> None:
        self.refresh()
        if self._on_change is not None:
            self._on_change()

    # -- attempts -------------------------------------------------------------------------------------

    def refuse(self, spec: WorkloadSpec) -> None:
        """What Slurm can never run, refused at submit (the API's 422) rather than placed and failed."""
        if spec.resources.gpu.is_fractional:
            raise SpecError(
                "resources.gpu", spec.resources.gpu.count, f"cannot run on Slurm: {WHOLE_GPUS}", "1"
            )
        # From the MaxTime last read (the poller reads it every minute): a submit never waits on Slurm.
        past = self._max_time.past(spec.max_duration)
        if past:
            raise SpecError("max_duration", format_duration(spec.max_duration or 0), *past)

    def start(self, launch: Launch) -> Handle:
        if not launch.workdir.is_dir():
            raise LaunchError(
                f"workdir {launch.workdir} does not exist (the head and the Slurm nodes must share it)"
            )
        pods = launch.pods
        if not pods:
            raise LaunchError("the slurm backend needs the scheduler's placement (Launch.pods)")
        if any(p.gpu_indices and p.gpu_fraction < 1.0 for p in pods):  # work submitted before `refuse`
            raise Unrunnable(f"resources.gpu: {WHOLE_GPUS}")
        past = self._max_time.past(launch.max_duration)  # submitted before, or MaxTime lowered since
        if past:
            raise Unrunnable(f"max_duration: {format_duration(launch.max_duration or 0)} {past[0]}")
        launch.run_dir.mkdir(parents=True, exist_ok=True)
        launch.log_path.parent.mkdir(parents=True, exist_ok=True)
        run_dir = launch.run_dir
        name = job_name(launch.workload_id, launch.attempt_number, launch.fencing_token)
        (run_dir / NAME_FILE).write_text(name + "\n")
        env = dict(launch.env)
        env["GPUPOOL_DEVICES"] = ",".join(str(i) for i in pods[0].gpu_indices)
        env.pop("CUDA_VISIBLE_DEVICES", None)  # so that the batch script can tell whether Slurm set it
        if len(pods) > 1:
            env.update(self._gang_environment(pods))
        batch = write_scripts(launch, name, HANDOFF_MAX)
        args = [
            f"--job-name={name}",
            f"--nodes={len(pods)}",
            "--ntasks-per-node=1",
            f"--nodelist={','.join(p.node for p in pods)}",
            f"--chdir={launch.workdir}",
            f"--output={launch.log_path}",
            f"--error={run_dir / 'slurm.err'}",
            "--open-mode=append",
            "--no-requeue",
            "--export=ALL",
        ]
        if self.partition is not None:
            args.append(f"--partition={self.partition}")
        gres = self._gres(pods[0])
        if gres:
            args.append(f"--gres={gres}")
        if launch.cpus > 0:
            args.append(f"--cpus-per-task={math.ceil(launch.cpus)}")
        if launch.memory_bytes > 0:
            args.append(f"--mem={math.ceil(launch.memory_bytes / (1 << 20))}M")
        if launch.max_duration is not None:
            limit = self._max_time.limit(launch.max_duration, launch.grace_period)
            args.append(f"--time={format_time_limit(limit)}")
        try:
            job_id = self.commands.sbatch([*args, str(batch)], env)
        except SlurmTimeout as exc:  # slurmctld may have taken it: no job of this attempt may run untracked
            self._cancel_untracked(name, run_dir)
            raise BackendUnavailable(f"slurmctld did not answer sbatch ({exc}); try again later") from exc
        except SlurmUnreachable as exc:
            raise BackendUnavailable(f"slurmctld is not reachable ({exc}); try again later") from exc
        except SlurmError as exc:
            raise LaunchError(str(exc)) from exc
        (run_dir / "slurm_job_id").write_text(job_id + "\n")
        write_followed(run_dir, launch.max_duration)
        slots = _slots(pods)
        with self._lock:
            self._submitted[job_id] = time.monotonic()
            self._run_dirs[job_id] = run_dir
            self._slots[job_id] = slots
            if len(pods) > 1:
                self._gangs.add(job_id)
        self._release(taken=slots)  # this job is pending in Slurm: the jobs whose GPUs it takes let go
        log.info("event=slurm_submitted workload=%d job=%s nodes=%s", launch.workload_id, job_id, args[3])
        endpoint = f"{self._address(pods[0].node)}:{launch.service_port}" if launch.service_port else ""
        return Handle(int(job_id), 0.0, endpoint)

    def follow_time_limit(
        self, handle: Handle, run_dir: Path, max_duration: float | None, grace_period: float
    ) -> str:
        """Make the job's TimeLimit follow a changed max_duration (`gpupool update --max-duration`): raised
        or removed, the old one would end the job first; lowered, it stays the backstop. No limit: the
        partition's MaxTime (UNLIMITED where it has none). Only Slurm operators (and SlurmUser) may raise
        a time limit, unless slurm.conf has `SlurmctldParameters=allow_user_incr_time`: a refusal is
        said in the log and returned for the workload's history."""
        job_id = str(handle.pid)
        known, before = followed(run_dir)
        if (known and before == max_duration) or (not known and max_duration is None):
            return ""  # as set at sbatch (or by the last update); none set and none wanted
        with self._lock:
            row = self._jobs.get(job_id)
        limits = self._max_time
        minutes = limits.most if max_duration is None else limits.limit(max_duration, grace_period)
        if minutes is not None and row is not None and row.start_time is not None:
            # Never below what the job has run plus its grace period and the margin: Slurm would end it at
            # once, with its own KillWait, cutting short the stop the head gives it with its grace period.
            ran = time.time() - row.start_time
            minutes = max(minutes, minutes_for(ran, grace_period))
        wanted = format_time_limit(minutes)
        try:
            self.commands.update_time_limit(job_id, wanted)
        except SlurmUnreachable as exc:
            raise BackendUnavailable(f"slurmctld is not reachable ({exc}); try again later") from exc
        except SlurmError as exc:
            if any(text in str(exc) for text in JOB_ENDED):
                return ""  # it has ended: the loop settles it
            log.warning(
                "event=slurm_time_limit_refused job=%s time_limit=%s error=%r fix=%r",
                job_id,
                wanted,
                str(exc),
                f"scontrol update JobId={job_id} TimeLimit={wanted} (as a Slurm operator)",
            )
            return (
                f"Slurm job {job_id} keeps its old TimeLimit, which may end it before max_duration does: "
                f"Slurm refused TimeLimit={wanted} ({exc}); only Slurm operators may raise a job's time "
                f"limit (unless slurm.conf sets SlurmctldParameters=allow_user_incr_time): ask one to run "
                f"`scontrol update JobId={job_id} TimeLimit={wanted}`"
            )
        write_followed(run_dir, max_duration)
        log.info("event=slurm_time_limit job=%s time_limit=%s", job_id, wanted)
        return ""

    def _cancel_untracked(self, name: str, run_dir: Path) -> None:
        """After an sbatch that timed out: cancel any job slurmctld took under this attempt's name (its
        next attempt gets another name, so this one would run untracked), or say in the log that it may."""
        try:
            found = self.commands.job_ids_named(name, timeout=CANCEL_TIMEOUT)
            for job_id in found:
                self.commands.scancel(job_id, check=True, timeout=CANCEL_TIMEOUT)
        except SlurmError as exc:
            log.error(
                "event=slurm_job_may_run_untracked name=%s run_dir=%s error=%r fix=%r",
                name,
                run_dir,
                str(exc),
                f"scancel --name={name}",
            )
            return
        log.warning("event=slurm_sbatch_timed_out name=%s cancelled=%s", name, ",".join(found) or "none")

    def _gres(self, pod: Pod) -> str:
        count = len(pod.gpu_indices)
        if not count:
            return ""
        node = self._nodes.get(pod.node)
        kinds = node.gpus if node is not None else ()
        if len(kinds) <= 1:
            return f"gpu:{count}"
        wanted = {_kind_of(kinds, i) for i in pod.gpu_indices}
        kind = wanted.pop() if len(wanted) == 1 else ""
        return f"gpu:{kind}:{count}" if kind else f"gpu:{count}"

    def _address(self, name: str) -> str:
        """Node `name`'s address as Slurm gives it (NodeAddr), else its name."""
        node = self._nodes.get(name)
        return node.address if node is not None else name

    def _gang_environment(self, pods: tuple[Pod, ...]) -> dict[str, str]:
        addresses = [self._address(pod.node) for pod in pods]
        return {
            "GPUPOOL_NUM_NODES": str(len(pods)),
            "NNODES": str(len(pods)),
            "GPUPOOL_MASTER_ADDR": addresses[0],
            "MASTER_ADDR": addresses[0],
            "GPUPOOL_NODE_IPS": ",".join(addresses),
        }

    def status(self, handle: Handle, run_dir: Path) -> Status:
        job_id = str(handle.pid)
        code = recorded_exit_code(run_dir)
        with self._lock:
            signalled = job_id in self._signalled
        if code is not None and (code <= SIGNAL_DEATH or signalled):  # the fast path: a normal end
            return Status(Phase.EXITED, code, detail=f"slurm job {job_id}", ended_at=recorded_end(run_dir))
        if code is not None:
            return self._signal_death(job_id, code, run_dir)
        with self._lock:
            row = self._jobs.get(job_id)
            fresh = self._submitted.get(job_id, 0.0) >= self._jobs_at
            final = self._finals.get(job_id)
        if row is not None:
            if job_id not in self._run_dirs:  # adopted after a restart: watch its exit status too
                with self._lock:
                    self._run_dirs[job_id] = run_dir
            return Status(Phase.RUNNING, detail=f"slurm job {job_id} {row.state} {row.reason}".rstrip())
        if fresh:
            return Status(Phase.RUNNING, detail=f"slurm job {job_id} submitted")
        if final is None:
            record = self.commands.job(job_id)
            if record is None:
                return Status(
                    Phase.VANISHED,
                    detail=f"slurm job {job_id} is no longer known to slurmctld and left no exit status",
                )
            final = record
            if record.get("JobState") not in HOLDING and record.get("JobState") != "PENDING":
                with self._lock:
                    self._finals[job_id] = record
        return final_status(job_id, final, run_dir)

    def _signal_death(self, job_id: str, code: int, run_dir: Path) -> Status:
        """Our job recorded a death by a signal gpupool did not send: a node set DOWN or a preemption in
        Slurm ends a job with SIGTERM too. Slurm's state (set before it signals) says which; it is asked
        once (again at most once per poll interval while the job is still completing)."""
        with self._lock:
            verdict = self._verdicts.get(job_id)
            asked = self._asked.get(job_id)
        if verdict is not None:
            return verdict
        ended = recorded_end(run_dir)
        waiting = Status(
            Phase.RUNNING, detail=f"slurm job {job_id} ended (exit code {code}); asking Slurm how"
        )
        if asked is not None and time.monotonic() - asked < self.poll_interval:
            return waiting
        with self._lock:
            self._asked[job_id] = time.monotonic()
        try:
            record = self.commands.job(job_id)
        except SlurmError as exc:  # settle nothing on a guess: ask again at the next look
            log.warning("event=slurm_job_state_unknown job=%s code=%d error=%r", job_id, code, str(exc))
            return waiting
        state = (record or {}).get("JobState", "")
        if state in ("COMPLETING", "PENDING", "CONFIGURING"):
            return waiting  # ending: its final state follows within moments
        if record is not None and state not in HOLDING:
            verdict = final_status(job_id, record, run_dir)
        else:  # still running (its batch script waits for the hand-off), or forgotten: the code stands
            verdict = Status(Phase.EXITED, code, detail=f"slurm job {job_id}", ended_at=ended)
        with self._lock:
            self._verdicts[job_id] = verdict
        return verdict

    def signal(self, handle: Handle, signum: int) -> None:
        job_id = str(handle.pid)
        with self._lock:
            row = self._jobs.get(job_id)
            gang = job_id in self._gangs or (row is not None and row.num_nodes > 1)
            self._signalled.add(job_id)
        if row is not None and row.state == "PENDING":
            self.commands.scancel(job_id)  # nothing runs yet that could checkpoint
            return
        name = signal.Signals(signum).name.removeprefix("SIG")
        # A gang's ranks run in srun's step: signalling the batch step too (--full) would make srun abort
        # the step and kill every rank at once, without their grace period.
        self.commands.scancel(job_id, signal_name=name, full=not gang or signum == signal.SIGKILL)
        if signum == signal.SIGKILL:
            self.commands.scancel(job_id)

    def find(self, run_dir: Path) -> Handle | None:
        try:
            return Handle(int((run_dir / "slurm_job_id").read_text().strip()), 0.0)
        except (OSError, ValueError):
            pass
        # Submitted, but the head died before it wrote the id down: find the job by its name, which start()
        # wrote before sbatch. An attempt started before names carried a token has job.sh but no name file.
        try:
            name = (run_dir / NAME_FILE).read_text().strip()
        except OSError:
            if not (run_dir / "job.sh").exists():
                return None  # sbatch was never reached
            name = f"{JOB_PREFIX}{run_dir.parent.name}.{run_dir.name}"
        try:
            found = self.commands.job_ids_named(name)
        except SlurmError as exc:  # not knowing is not "never launched": that would start it twice
            raise BackendUnavailable(f"cannot look up Slurm job {name}: {exc}") from exc
        if not found:
            return None
        (run_dir / "slurm_job_id").write_text(found[0] + "\n")
        return Handle(int(found[0]), 0.0)

    def cleanup(self, handle: Handle) -> None:
        job_id = str(handle.pid)
        with self._lock:
            run_dir = self._run_dirs.pop(job_id, None)
            self._exited.discard(job_id)
            self._submitted.pop(job_id, None)
            self._finals.pop(job_id, None)
            self._signalled.discard(job_id)
            self._gangs.discard(job_id)
            self._verdicts.pop(job_id, None)
            self._asked.pop(job_id, None)
            slots = self._slots.pop(job_id, frozenset())
            still_there = job_id in self._jobs
            ended = run_dir is not None and (run_dir / "exit_code").exists()
            if ended and run_dir is not None:
                self._handing_off[job_id] = (run_dir, time.monotonic(), slots)
        # A batch script that wrote its exit status is ending on its own (after the hand-off); Slurm reaps
        # whatever it leaves behind.
        if still_there and not ended:
            self.commands.scancel(job_id)


def _slots(pods: tuple[Pod, ...]) -> frozenset[tuple[str, int]]:
    """The (node, GPU index) pairs a placement takes; a pod without GPUs takes its node's slot -1."""
    return frozenset((p.node, i) for p in pods for i in (p.gpu_indices or (-1,)))


def _kind_of(kinds: tuple[tuple[str, int], ...], index: int) -> str:
    """The GRES type of GPU `index` when a node's GPUs are numbered type by type, as listed."""
    start = 0
    for kind, count in kinds:
        if index < start + count:
            return kind
        start += count
    return ""
