"""The interface every execution backend presents to the control loop (local, slurm, agent)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Final, Protocol


@dataclass(frozen=True, slots=True)
class Pod:
    """Where one pod of a gang runs, as the scheduler placed it: a node and GPU indices on it."""

    node: str
    gpu_indices: tuple[int, ...] = ()
    gpu_fraction: float = 1.0


@dataclass(frozen=True, slots=True)
class Launch:
    """Everything needed to start one attempt, decided by control; the backend only carries it out."""

    attempt_id: int
    workload_id: int
    attempt_number: int
    script: str
    env: dict[str, str]
    workdir: Path
    run_dir: Path
    log_path: Path
    # One placement per pod (NODE_RANK order); empty means this machine (the local backend ignores it).
    pods: tuple[Pod, ...] = ()
    cpus: float = 0.0  # per pod, as requested (0 = none asked for)
    memory_bytes: int = 0  # per pod, as requested (0 = none asked for)
    fencing_token: str = ""  # the attempt's; an agent runs it only while the head lists it with this token
    # A service's port (GPUPOOL_PORT), chosen by control; a backend that knows its nodes' ports better (the
    # agents' ranges) chooses another. 0: not a service.
    service_port: int = 0
    # Seconds between SIGTERM and SIGKILL (the spec's grace_period): what a gang's other ranks get when one
    # of them ends early or its node is lost (the agent backend; Slurm's srun does it with its KillWait).
    grace_period: float = 30.0
    # The spec's max_duration in seconds (None: no limit): control enforces it; a backend with a time limit
    # of its own (Slurm's --time) sets that as a backstop for while the head is down.
    max_duration: float | None = None


@dataclass(frozen=True, slots=True)
class Handle:
    """How to find a started attempt again, even after a restart: the backend's id for it (a process id
    for `local`, a Slurm job id for `slurm`) plus a start time that guards against id reuse (0 if none):
    for `local`, seconds after boot `boot` (gpupool/process_start.py), or on the wall clock if `boot` is "".
    """

    pid: int
    start_time: float
    # A service's address, "host:port" (rank 0's node and its GPUPOOL_PORT); "" for a job.
    endpoint: str = ""
    boot: str = ""


# What a Handle's `pid` is on each backend, as the head's log lines name it: a process id, a Slurm job id,
# or (an agent runs the attempt under its own process ids) the attempt's id in the store.
HANDLE_ID: Final = {"local": "pid", "slurm": "slurm_job", "agent": "attempt_id"}


class Phase(Enum):
    RUNNING = "running"
    EXITED = "exited"
    VANISHED = "vanished"  # gone without leaving an exit status


@dataclass(frozen=True, slots=True)
class Status:
    phase: Phase
    exit_code: int | None = None
    detail: str = ""
    # Why an attempt that did not exit by itself ended, as the retry policy names it (`retry.on`):
    # failure | node-failure | preemption.
    cause: str = "failure"
    # Running, but ending of itself: why, and what is being stopped (a gang whose rank failed, its other
    # ranks given their grace period); "" otherwise. Said in the workload's reason while it lasts.
    ending: str = ""
    # When it ended (seconds since the epoch), where the backend knows it: an attempt settled late (the head
    # was down when it ended) is charged to its real end, not to the moment the head learned of it.
    ended_at: float | None = None


@dataclass(frozen=True, slots=True)
class InventoryGpu:
    """One GPU of an inventory node, when the backend knows it device by device (a node agent does)."""

    index: int
    uuid: str
    kind: str  # as the catalog names it ("H100"), like InventoryNode.gpus
    product_name: str
    memory_bytes: int  # 0: take the catalog's
    nvlink_island: int  # GPUs in one NVLink/NVSwitch domain share an id
    simulated: bool = False


@dataclass(frozen=True, slots=True)
class InventoryNode:
    """A node as a backend with its own inventory (Slurm) reports it.

    `state` is gpupool's word for it: ready | cordoned | unhealthy | lost; `state_reason` says why in the
    backend's words. `gpus` lists (type, count) as the backend names them ("h100", or "" when untyped);
    `devices`, when the backend knows them (agents), gives each GPU's UUID and NVLink island too."""

    name: str
    address: str
    state: str
    state_reason: str
    cpus: float
    memory_bytes: int
    gpus: tuple[tuple[str, int], ...]
    labels: tuple[tuple[str, str], ...] = ()
    devices: tuple[InventoryGpu, ...] = ()  # when known, they describe the GPUs instead of `gpus`


@dataclass(frozen=True, slots=True)
class ForeignJob:
    """Work the backend runs that gpupool did not start (a plain `sbatch` job): it holds capacity."""

    job_id: str
    name: str
    user: str
    state: str
    nodes: tuple[str, ...]
    gpus_per_node: float
    cpus_per_node: float
    # GPU indices per node where the backend says which ones it holds; missing nodes: any free ones.
    gpu_indices: tuple[tuple[str, tuple[int, ...]], ...] = ()
    started_at: float | None = None  # epoch seconds


@dataclass(frozen=True, slots=True)
class Inventory:
    """The nodes and foreign jobs a backend sees; `generation` changes whenever anything in it does."""

    nodes: tuple[InventoryNode, ...]
    foreign: tuple[ForeignJob, ...]
    generation: int


class LaunchError(RuntimeError):
    """The attempt could not be started; the message says why (missing workdir, bad interpreter, ...)."""


class Unrunnable(LaunchError):
    """The backend can never run the work as its spec asks (a fraction of a GPU on Slurm): no node failed and
    no other node would do better, so the work fails at once with the reason, instead of trying again."""


def recorded_exit_code(run_dir: Path) -> int | None:
    """The exit code an attempt's wrapper wrote in RUN_DIR/exit_code (the local shim, the Slurm batch
    script), if it ended and wrote one."""
    try:
        return int((run_dir / "exit_code").read_text().strip())
    except (OSError, ValueError):
        return None


def recorded_end(run_dir: Path) -> float | None:
    """When the wrapper wrote RUN_DIR/exit_code, its last act (seconds since the epoch), if it did."""
    try:
        return (run_dir / "exit_code").stat().st_mtime
    except OSError:
        return None


class BackendUnavailable(RuntimeError):
    """The backend cannot answer now (its controller is down, say): ask again later, settle nothing on it."""


class Backend(Protocol):
    name: str

    def start(self, launch: Launch) -> Handle: ...

    def status(self, handle: Handle, run_dir: Path) -> Status: ...

    def signal(self, handle: Handle, signum: int) -> None: ...

    def find(self, run_dir: Path) -> Handle | None:
        """The handle an attempt wrote at start, for attempts whose pid never reached the store; None when
        the attempt was never launched. Raises BackendUnavailable when the backend cannot tell now."""
        ...

    def cleanup(self, handle: Handle) -> None:
        """Kill anything the attempt left behind in its process group."""
        ...

    def inventory(self) -> Inventory | None:
        """The nodes this backend runs work on and the foreign work on them, or None when the head's
        own GPU provider describes the one node (local). Must not block: return the latest known."""
        ...

    def drain_node(self, name: str, reason: str) -> None:
        """Take a node out of service where the backend schedules too (a health verdict); the reason is
        recorded there (Slurm: `scontrol update nodename=... state=drain reason="gpupool: ..."`)."""
        ...

    def resume_node(self, name: str) -> None:
        """Return a node drained by `drain_node` to service."""
        ...


class FollowsTimeLimits(Protocol):
    """An optional hook of a backend that enforces a time limit of its own (Slurm's TimeLimit). Control
    calls it for a running attempt whose max_duration is not the one it last gave the backend (`gpupool
    update --max-duration`; once per attempt after a restart of the head), so that a raised limit is not
    cut short by the old one. A backend without it (local, agent) has nothing to follow: control alone
    enforces max_duration."""

    def follow_time_limit(
        self, handle: Handle, run_dir: Path, max_duration: float | None, grace_period: float
    ) -> str:
        """Make the attempt's own limit follow `max_duration` (None: no limit); "" when it does (or did
        already), else why the backend refused, in words for the workload's history. Raises
        BackendUnavailable when the backend cannot answer now (control asks again at its next pass)."""
        return ""
