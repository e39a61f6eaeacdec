"""The state store's tables: typed SQLAlchemy 2 models.

Desired state (workloads, queues, node cordons) and observed state (attempts, GPU samples) live here;
every state change is also appended to `events`, so the history of a workload is auditable.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, object_session, relationship

from gpupool.timeutil import utcnow

MAX_ID = (1 << 63) - 1  # the largest id a 64-bit integer column holds: a larger one names no row


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Node(Base):
    """A machine with GPUs. `state`: ready | cordoned | draining | unhealthy | lost."""

    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(253), unique=True)
    state: Mapped[str] = mapped_column(String(16), default="ready")
    state_reason: Mapped[str] = mapped_column(Text, default="")
    address: Mapped[str] = mapped_column(String(255), default="127.0.0.1")
    backend: Mapped[str] = mapped_column(String(32), default="local")
    cpus: Mapped[float] = mapped_column(Float, default=0.0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    last_heartbeat: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # Agent nodes only: SHA-256 of the node credential the agent got when it joined (never stored in clear).
    credential_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The GPUs the node is expected to have, [{index, uuid, model}]: those it first registered with, or
    # as an operator last accepted them (`gpupool node accept-gpus`); None: not known yet. The health
    # checks take a node with fewer out of service (control/health.py).
    expected_gpus: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    # At least this many GPUs, as the join token it joined with declares (None: nothing declared). The GPU
    # count check expects the larger of this and `expected_gpus`; an admin's accept-gpus clears it.
    declared_gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)

    gpus: Mapped[list[Gpu]] = relationship(
        back_populates="node", order_by="Gpu.index", cascade="all, delete-orphan", lazy="selectin"
    )

    def change_state(self, state: str, reason: str, actor: str) -> bool:
        """Set the state and its reason; a change of state is also recorded as an Event in the node's
        session. True when the state changed."""
        changed = self.state != state
        if changed:
            session = object_session(self)
            assert session is not None, "change_state needs a node loaded in a session"
            session.add(
                Event(
                    object_kind="node",
                    object_id=self.name,
                    from_state=self.state,
                    to_state=state,
                    reason=reason,
                    actor=actor,
                )
            )
        self.state, self.state_reason = state, reason
        return changed


class Gpu(Base):
    """One GPU of a node, as discovered (NVML or simulated), with its latest telemetry sample."""

    __tablename__ = "gpus"
    __table_args__ = (UniqueConstraint("node_id", "index", name="uq_gpus_node_index"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    uuid: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(64))
    product_name: Mapped[str] = mapped_column(String(128), default="")
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    nvlink_island: Mapped[int] = mapped_column(Integer, default=0)
    simulated: Mapped[bool] = mapped_column(default=False)
    last_sample: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)

    node: Mapped[Node] = relationship(back_populates="gpus")


class Queue(Base):
    """A team or project: guaranteed quota, hard limit and over-quota weight per resource."""

    __tablename__ = "queues"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    parent: Mapped[str | None] = mapped_column(String(63), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class Workload(Base):
    """A job or service as submitted (its spec) and where it stands (`state`, `reason`)."""

    __tablename__ = "workloads"
    __table_args__ = (
        Index("ix_workloads_state", "state"),
        Index("ix_workloads_queue", "queue"),
        Index("ix_workloads_service_id", "service_id"),
        Index("ix_workloads_array_id", "array_id"),
        Index("ix_workloads_name", "name"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63))
    kind: Mapped[str] = mapped_column(String(16), default="job")
    queue: Mapped[str] = mapped_column(String(63))
    user: Mapped[str] = mapped_column(String(63), default="admin")
    priority: Mapped[int] = mapped_column(Integer, default=50)
    preemptible: Mapped[bool] = mapped_column(default=True)
    gpus: Mapped[str] = mapped_column(String(64), default="0")
    nodes: Mapped[int] = mapped_column(Integer, default=1)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), default="pending")
    reason: Mapped[str] = mapped_column(Text, default="")
    # While pending: the scheduler's reason code (explain.CODES), e.g. "queue-limit"; "" otherwise.
    reason_code: Mapped[str] = mapped_column(String(32), default="", server_default="")
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    # `gpupool hold`: kept pending, out of the scheduler's reach, until `gpupool release` (a running one is
    # stopped first, as a preemption that uses no restart, and waits pending).
    held: Mapped[bool] = mapped_column(default=False, server_default=false())
    # Held by an admin: only an admin releases it (Slurm's admin hold); a user's own hold, or its idle
    # rule's, its owner releases too.
    held_by_admin: Mapped[bool] = mapped_column(default=False, server_default=false())
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    # Times a lost node, or one that could not start it, sent it back to pending without using a restart
    # (`retry.max_node_failures`, control/observe.py).
    node_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # A service's replicas are workloads of their own (each scheduled, started and stopped alone) that share
    # `service_id`, the id of replica 0, the service's id; `replica` numbers them 0.. (GPUPOOL_REPLICA).
    # A job has none (null, 0).
    service_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    replica: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # A job array's tasks are workloads of their own that share `array_id`, the first task's id (the
    # array's id); `array_index` is the task's index from the spec's `array` (GPUPOOL_ARRAY_INDEX). A job
    # that is no array has none (null, null).
    array_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    array_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Optimistic concurrency: two writers (API cancel, control loop) never overwrite each other silently.
    version: Mapped[int] = mapped_column(Integer, nullable=False)
    __mapper_args__ = {"version_id_col": version}

    attempts: Mapped[list[Attempt]] = relationship(
        back_populates="workload", order_by="Attempt.number", lazy="selectin"
    )


class Attempt(Base):
    """One run of a workload on a node's GPUs; a retry is a new attempt with the next number."""

    __tablename__ = "attempts"
    __table_args__ = (
        UniqueConstraint("workload_id", "number", name="uq_attempts_workload_number"),
        Index("ix_attempts_state", "state"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="starting")
    node_name: Mapped[str] = mapped_column(String(253))
    # The queue it ran in: its workload's when it started (pending work may move; its GPU-hours stay).
    queue: Mapped[str] = mapped_column(String(63))
    gpu_indices: Mapped[list[Any]] = mapped_column(JSON, default=list)
    gpu_fraction: Mapped[float] = mapped_column(Float, default=0.0)
    cpus: Mapped[float] = mapped_column(Float, default=0.0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    # The backend that runs it (local | slurm); `pid` is that backend's id for it (a Slurm job id for slurm).
    backend: Mapped[str] = mapped_column(String(32), default="local", server_default="local")
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # When that process started, so a reused pid is not taken for it: seconds after the boot `pid_boot_id`
    # (a local attempt since 2026-12), or the wall clock where pid_boot_id is None (see process_start.py).
    pid_start_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    pid_boot_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    run_dir: Mapped[str] = mapped_column(Text, default="")
    log_path: Mapped[str] = mapped_column(Text, default="")
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    stop_reason: Mapped[str] = mapped_column(String(32), default="")
    stop_requested_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # An eviction's gainer (scheduler.Eviction.for_workload), or the waiting workload a later pass promised
    # the GPUs of this attempt, stopping for no one, to (scheduler.Decisions.released_to): while this
    # attempt stops, the GPUs it releases are that pending workload's room (WorkloadView.evicted_for).
    stop_for_workload: Mapped[int | None] = mapped_column(Integer, nullable=True)
    killed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # Fencing: an agent runs an attempt only while the head lists it with this token (docs/agents.md).
    fencing_token: Mapped[str] = mapped_column(
        String(64), default=lambda: secrets.token_hex(16), server_default=""
    )
    # One placement per rank (NODE_RANK order): [{"node", "gpu_indices", "gpu_fraction"}]; [] for attempts
    # recorded before ranks were (their one pod is node_name/gpu_indices).
    pods: Mapped[list[Any] | None] = mapped_column(JSON, default=list, nullable=True)
    # A service's address while it runs, "host:port" (rank 0's node and its GPUPOOL_PORT); "" for a job.
    endpoint: Mapped[str] = mapped_column(String(300), default="", server_default="")
    # GPU efficiency from the telemetry of the GPUs it held (control/efficiency.py), written every 30 s while
    # it runs and at its end; all None while none arrived (an old attempt, a backend whose GPUs gpupool does
    # not sample), which reads "no GPU telemetry", never 0%. `gpu_seconds_sampled`: the GPU-seconds of
    # telemetry the mean is over (summed over its GPUs), the weight a restarted head resumes the mean with.
    gpu_seconds_sampled: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_utilization_pct: Mapped[float | None] = mapped_column(Float, nullable=True)  # time-weighted mean
    gpu_memory_peak_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # on any one GPU
    gpu_memory_total_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)  # its largest GPU

    workload: Mapped[Workload] = relationship(back_populates="attempts")


class ForeignJob(Base):
    """Work the execution backend runs that gpupool did not start (a plain `sbatch` job), as last seen:
    it holds capacity the scheduler must leave alone. Rows go when the job ends."""

    __tablename__ = "foreign_jobs"
    __table_args__ = (UniqueConstraint("backend", "job_id", name="uq_foreign_jobs_backend_job"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    backend: Mapped[str] = mapped_column(String(32))
    job_id: Mapped[str] = mapped_column(String(64))  # the backend's id (Slurm job id)
    name: Mapped[str] = mapped_column(String(255))
    user: Mapped[str] = mapped_column(String(63))
    state: Mapped[str] = mapped_column(String(32))  # in the backend's words (RUNNING, COMPLETING, ...)
    nodes: Mapped[list[Any]] = mapped_column(JSON)
    gpus_per_node: Mapped[float] = mapped_column(Float)
    cpus_per_node: Mapped[float] = mapped_column(Float)
    # {node: [indices]} where the backend says which GPUs it holds; other nodes: any free ones.
    gpu_indices: Mapped[dict[str, Any]] = mapped_column(JSON)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Event(Base):
    """An append-only audit record of one state change (or refused change) of a workload, attempt or node."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_object", "object_kind", "object_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    object_kind: Mapped[str] = mapped_column(String(16))
    object_id: Mapped[str] = mapped_column(String(253))
    from_state: Mapped[str] = mapped_column(String(16), default="")
    to_state: Mapped[str] = mapped_column(String(16), default="")
    reason: Mapped[str] = mapped_column(Text, default="")
    actor: Mapped[str] = mapped_column(String(63), default="system")


class JoinToken(Base):
    """A token that lets a node agent join the pool (`gpupool node join-token create`), kept as its hash."""

    __tablename__ = "join_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))  # the first characters, to tell tokens apart in lists
    description: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)  # None: never
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    uses: Mapped[int] = mapped_column(Integer, default=0)  # nodes that joined with it
    last_used_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    gpus: Mapped[int | None] = mapped_column(Integer, nullable=True)  # each joining node has (None: not said)


class ApiToken(Base):
    """A bearer token, kept only as its SHA-256 hash: a person's (or a script's) identity, by `name`, with a
    `role`: admin (everything), user (submit, and change their own work), viewer (read only)."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(63), unique=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16), default="admin")
    # A user token may submit only to these queues; [] any queue.
    queues: Mapped[list[Any]] = mapped_column(JSON, default=list, server_default="[]")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class BenchResult(Base):
    """One series of a bench result on a node (gpupool.bench.results): the newest HISTORY_PER_SERIES are
    kept per (node, kind, key), so a slowdown shows against the node's own history."""

    __tablename__ = "bench_results"
    __table_args__ = (Index("ix_bench_results_series", "node_name", "kind", "key", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_name: Mapped[str] = mapped_column(String(253))
    kind: Mapped[str] = mapped_column(String(16))  # collective | gemm | train
    key: Mapped[str] = mapped_column(String(64))  # collective: the op; gemm: the dtype; train: the precision
    gpu_model: Mapped[str] = mapped_column(String(64), default="")  # the node's GPU model when recorded
    nodes: Mapped[list[Any]] = mapped_column(JSON, default=list)  # every node the run measured together
    workload_id: Mapped[int | None] = mapped_column(Integer, nullable=True)  # the bench job, if one ran it
    source: Mapped[str] = mapped_column(String(64), default="")  # "job 12", "cli", "file"
    actor: Mapped[str] = mapped_column(String(63), default="system")
    parameters: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    figures: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    report: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    measured_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RetiredUsage(Base):
    """The GPU-hours of a queue's workloads deleted from the store (finished check jobs past their retention,
    control/retention.py), so GPU-hours counted from the attempts never go down."""

    __tablename__ = "retired_usage"

    queue: Mapped[str] = mapped_column(String(63), primary_key=True)
    gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)
    workloads: Mapped[int] = mapped_column(Integer, default=0)  # workloads deleted
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Secret(Base):
    """A value a user keeps on the head for their work's environment (spec `secrets`, control/secrets.py).
    The API never returns it; only a starting attempt of its owner's work reads it."""

    __tablename__ = "secrets"
    __table_args__ = (UniqueConstraint("owner", "name", name="uq_secrets_owner_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    owner: Mapped[str] = mapped_column(String(63))
    name: Mapped[str] = mapped_column(String(128))
    # Encrypted, bound to this row: `enc1:<key id>:<base64>` (control/secret_keys.py); plain text only if
    # written before gpupool encrypted secrets, until the head's next start.
    value: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)


class HeadState(Base):
    """Small values a head keeps across restarts, by key (the notifier's cursor, control/notify.py)."""

    __tablename__ = "head_state"

    key: Mapped[str] = mapped_column(String(63), primary_key=True)
    value: Mapped[str] = mapped_column(Text, default="")
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, onupdate=utcnow)
