"""The job contract (DESIGN.md): what a user's program finds in its environment and on disk."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from gpupool.environment import PRIVATE_PREFIXES, shared_environment
from gpupool.spec.arrays import parse_array

# Server-side settings that must never leak into a job's environment: gpupool's own (the store's URL, the
# CLI's token, the secrets key file), and whatever else in the head's environment names a credential
# (PGPASSWORD, AWS_SECRET_ACCESS_KEY, VAULT_TOKEN, DATABASE_URL...). A job gets its user's own values from
# its spec's `env` and `secrets`, which are added after this filter.


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def workdir_for(spec: dict[str, Any], home: Path, workload_id: int) -> Path:
    """The spec's workdir, else a directory of its own under the server's home."""
    given = spec.get("workdir")
    return Path(given).expanduser() if given else home / "work" / str(workload_id)


def checkpoint_dir_for(
    spec: dict[str, Any], workdir: Path, home: Path, workload_id: int, array_index: int | None = None
) -> Path:
    """Relative checkpoint dirs live under the workdir; without one, each workload gets its own. A job
    array's tasks share the spec, not their checkpoints: each task gets a folder of the spec's dir named by
    its index (Slurm writes %a in file names for the same reason)."""
    checkpoint = spec.get("checkpoint") or {}
    given = checkpoint.get("dir")
    if not given:
        return home / "checkpoints" / str(workload_id)
    path = Path(given).expanduser()
    path = path if path.is_absolute() else workdir / path
    return path / str(array_index) if array_index is not None else path


def job_environment(
    *,
    base: dict[str, str],
    spec: dict[str, Any],
    workload_id: int,
    workload_name: str,
    queue: str,
    attempt_number: int,
    gpu_indices: list[int],
    checkpoint_dir: Path,
    node_address: str,
    master_port: int,
    num_nodes: int = 1,
    node_rank: int = 0,
    node_ips: list[str] | None = None,
    service_port: int = 0,
    service_id: int | None = None,
    replica: int = 0,
    array_id: int | None = None,
    array_index: int | None = None,
) -> dict[str, str]:
    env = {k: v for k, v in base.items() if not k.startswith(PRIVATE_PREFIXES)}
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    ips = node_ips or [node_address]
    env.update(
        {
            "GPUPOOL_JOB_ID": str(workload_id),
            "GPUPOOL_JOB_NAME": workload_name,
            "GPUPOOL_QUEUE": queue,
            "GPUPOOL_ATTEMPT": str(attempt_number),
            "GPUPOOL_CHECKPOINT_DIR": str(checkpoint_dir),
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices),
            "GPUPOOL_NUM_NODES": str(num_nodes),
            "GPUPOOL_NODE_RANK": str(node_rank),
            "GPUPOOL_GPUS_PER_NODE": str(len(gpu_indices)),
            "GPUPOOL_MASTER_ADDR": ips[0],
            "GPUPOOL_MASTER_PORT": str(master_port),
            "GPUPOOL_NODE_IPS": ",".join(ips),
            "MASTER_ADDR": ips[0],
            "MASTER_PORT": str(master_port),
            "NNODES": str(num_nodes),
            "NODE_RANK": str(node_rank),
            "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED", "1"),
        }
    )
    if service_port:
        env["GPUPOOL_PORT"] = str(service_port)  # a service listens here; the head's proxy reaches it here
    if service_id is not None:  # a service's replica: which copy this is, and the service's own id
        env["GPUPOOL_SERVICE_ID"] = str(service_id)
        env["GPUPOOL_REPLICA"] = str(replica)
    if array_id is not None:  # a job array's task (Slurm's SLURM_ARRAY_JOB_ID, _TASK_ID, _TASK_COUNT)
        env["GPUPOOL_ARRAY_ID"] = str(array_id)
        env["GPUPOOL_ARRAY_INDEX"] = str(array_index)
        env["GPUPOOL_ARRAY_COUNT"] = str(len(parse_array(spec.get("array") or array_index).indices))
    return env


def server_environment() -> dict[str, str]:
    """The head's environment as every backend hands it to a job (the local process, Slurm's sbatch with
    --export=ALL; the agent backend sends what differs from it): without the head's own credentials."""
    return shared_environment(os.environ)
