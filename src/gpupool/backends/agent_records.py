"""What the head keeps of its agents (backends/agent.py): a node as its agent registered it (the
registration parsed, with the error naming the field), an attempt and its ranks, and where their state and
logs lie on disk.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.backends.base import InventoryGpu

# Ports a node keeps free for the rendezvous of the attempts whose rank 0 it runs (MASTER_PORT), unless its
# agent registers its own range (`gpupool agent --rendezvous-ports`); below Linux's ephemeral ports.
DEFAULT_RENDEZVOUS_PORTS = (29500, 29999)


class BadRegistration(ValueError):
    """An agent's registration describes its node in a way the head cannot use."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def check_description(info: dict[str, Any]) -> None:
    """Raise BadRegistration for a field of a node's description the agent backend could not take in."""
    cpus, memory, gpus = info.get("cpus"), info.get("memory_bytes"), info.get("gpus")
    if cpus is not None and not (_is_number(cpus) and 0 <= cpus < math.inf):
        raise BadRegistration("info.cpus", f"{cpus!r} is not a number of CPUs; e.g. 64")
    if memory is not None and not (_is_number(memory) and isinstance(memory, int) and memory >= 0):
        raise BadRegistration("info.memory_bytes", f"{memory!r} is not a number of bytes; e.g. 1099511627776")
    if gpus is not None and not (isinstance(gpus, list) and all(_is_kind_count(g) for g in gpus)):
        raise BadRegistration("info.gpus", f"{gpus!r} is not a list of [kind, count]; e.g. [['H100', 8]]")
    if not isinstance(info.get("labels"), dict | None):
        raise BadRegistration("info.labels", f"{info['labels']!r} is not a mapping; e.g. {{'zone': 'a'}}")
    if not isinstance(info.get("address"), str | None):
        raise BadRegistration("info.address", f"{info['address']!r} is not an address; e.g. 10.0.0.7")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_kind_count(pair: Any) -> bool:
    """One entry of a node's `gpus`: [kind, count]."""
    if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
        return False
    count = pair[1]
    return _is_number(count) and isinstance(count, int) and count >= 0


def parse_devices(raw: Any) -> tuple[InventoryGpu, ...]:
    """The node's GPUs device by device, as the agent registers them (`GpuDevice.to_dict()` plus `kind`)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise BadRegistration("info.devices", "must be a list of GPUs, each {index, uuid, kind, ...}")
    devices = []
    for i, item in enumerate(raw):
        try:
            devices.append(
                InventoryGpu(
                    index=int(item["index"]),
                    uuid=str(item["uuid"])[:64],
                    kind=str(item.get("kind") or item.get("model") or ""),
                    product_name=str(item.get("name") or "")[:128],
                    memory_bytes=int(item.get("memory_bytes") or 0),
                    nvlink_island=int(item.get("nvlink_island") or 0),
                    simulated=bool(item.get("simulated")),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise BadRegistration(
                f"info.devices[{i}]", f"{exc!r}; each GPU needs an integer index and a uuid"
            ) from exc
    if len({d.index for d in devices}) != len(devices):
        raise BadRegistration("info.devices", "two GPUs with the same index")
    return tuple(sorted(devices, key=lambda d: d.index))


def parse_ports(raw: Any) -> tuple[int, int]:
    """The node's rendezvous port range `[low, high]`; the default for an agent that sends none."""
    if raw is None:
        return DEFAULT_RENDEZVOUS_PORTS
    try:
        low, high = (int(p) for p in raw)
    except (TypeError, ValueError) as exc:
        raise BadRegistration(
            "info.rendezvous_ports",
            f"{raw!r} is not [low, high]; e.g. gpupool agent --rendezvous-ports 29500-29999",
        ) from exc
    if not 1 <= low <= high <= 65535:
        raise BadRegistration(
            "info.rendezvous_ports", f"{low}-{high} is not a range of ports (1-65535, low <= high)"
        )
    return low, high


def rank_log_path(log_path: Path, rank: int) -> Path:
    """Where rank `rank`'s output is kept on the head: the attempt's log for rank 0, a sibling otherwise."""
    if rank == 0:
        return log_path
    return log_path.with_name(f"{log_path.stem}.rank-{rank}{log_path.suffix}")


@dataclass
class AgentNode:
    """A node as its agent registered it, and when it was last heard from (monotonic seconds)."""

    name: str
    address: str
    cpus: float
    memory_bytes: int
    gpus: tuple[tuple[str, int], ...]
    labels: tuple[tuple[str, str], ...]
    last_seen: float
    session: str = ""
    version: int = 0  # bumped whenever the node's desired state changes (wakes its long-poll)
    devices: tuple[InventoryGpu, ...] = ()  # each GPU's UUID and NVLink island (stored, seen by placement)
    ports: tuple[int, int] = DEFAULT_RENDEZVOUS_PORTS  # rendezvous ports for gangs whose rank 0 runs here


@dataclass
class Rank:
    node: str
    gpu_indices: tuple[int, ...]
    gpu_fraction: float
    exit_code: int | None = None
    detail: str = ""  # why it ended, in the agent's words (vanished, could not start)
    # whose fault the end was: "failure" (the work's), or "node-failure" where its agent killed it (the
    # head was unreachable for the agent's orphan grace); RUN_DIR/rank-R.why keeps both
    cause: str = "failure"
    # when it ended by the head's clock (the agent says how long ago: its clock may differ), if it said
    ended_at: float | None = None
    vanished: bool = False
    seen: bool = False  # the agent has reported it at least once


@dataclass
class AgentAttempt:
    attempt_id: int
    token: str
    run_dir: Path
    log_path: Path
    launches: list[dict[str, Any]]  # per rank: what the agent needs to start it
    ranks: list[Rank]
    signal: int = 0  # 0, SIGTERM or SIGKILL: the strongest signal asked for so far
    master_port: int = 0  # from rank 0's node's rendezvous range
    service_port: int = 0  # a service's GPUPOOL_PORT, from the same range; 0 for a job
    grace_period: float = 30.0  # SIGTERM to SIGKILL, for the other ranks when one ends early
    # The first end of a gang whose other ranks still run ({"phase", "code", "detail", "cause"}, kept in
    # RUN_DIR/gang_end.json): they are stopped gracefully, then the attempt ends with this, not with their
    # SIGTERM's 143. `stopping_since`: when they were sent SIGTERM (the backend's clock; 0 not yet).
    gang_end: dict[str, Any] | None = None
    stopping_since: float = 0.0
    dropped: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def write_atomic(path: Path, text: str) -> None:
    """Replace the file with `text` at once: a reader sees the old text or the new, never a part. The
    file is the head's user's only (mode 0600): launch.json holds the job's environment, secrets too."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o600)  # a .tmp left by an older head keeps its mode through O_CREAT
    os.replace(tmp, path)
