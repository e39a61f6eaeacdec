"""Run a function on N ranks of torch.distributed: processes on this machine, or the ranks torchrun started.

On this machine the ranks meet at a TCP rendezvous on 127.0.0.1. CPU runs (gloo) fork the processes, which
then share the parent's imported torch (about 2 s saved per rank); CUDA runs spawn fresh interpreters,
because a forked child cannot use CUDA. Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT set, as in a multi-node gpupool job) the current process is one rank and joins the others there.
"""

from __future__ import annotations

import datetime as dt
import os
import pickle
import socket
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessException, start_processes

from gpupool.bench.errors import BenchError
from gpupool.bench.launch import under_torchrun


@dataclass(frozen=True)
class Rank:
    """Where this process stands in the group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def synchronize(self) -> None:
        if self.is_cuda:
            torch.cuda.synchronize(self.device)


def check_backend(backend: str, nproc: int) -> None:
    """Fail before any process starts when the backend cannot run here."""
    if backend not in ("nccl", "gloo"):
        raise BenchError(f"--backend {backend!r}: give nccl (GPUs) or gloo (CPU)")
    if nproc < 1:
        raise BenchError(f"--nproc must be at least 1 (got {nproc})")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise BenchError(
                "--backend nccl needs CUDA GPUs and this machine has none visible to torch; "
                "use --backend gloo for the CPU path"
            )
        if not dist.is_nccl_available():
            raise BenchError("--backend nccl: this torch build has no NCCL; use --backend gloo")
        visible = torch.cuda.device_count()
        if not under_torchrun() and nproc > visible:
            raise BenchError(
                f"--nproc {nproc} is more than the {visible} GPUs visible here; use --nproc {visible}"
            )


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def default_nproc(backend: str) -> int:
    """One process per GPU for NCCL; two CPU processes for gloo."""
    return max(1, torch.cuda.device_count()) if backend == "nccl" else 2


def run(
    fn: Callable[..., Any], args: tuple[Any, ...], *, nproc: int, backend: str, timeout_s: float = 600.0
) -> Any:
    """Call fn(rank, *args) on every rank; return rank 0's result (None on the other torchrun ranks)."""
    if under_torchrun():
        world = int(os.environ["WORLD_SIZE"])
        rank = int(os.environ["RANK"])
        local = int(os.environ["LOCAL_RANK"])
        ctx = _init(rank, world, local, backend, "env://", timeout_s, threads=None)
        try:
            result = fn(ctx, *args)
        finally:
            dist.destroy_process_group()
        return result if ctx.leader else None  # rank 0 reports for the group
    check_backend(backend, nproc)
    method = "spawn" if backend == "nccl" else "fork"
    threads = max(1, (os.cpu_count() or 1) // nproc)
    # Results and errors travel through files: a large result in a pipe would block the child while the
    # parent waits for it to exit.
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-") as tmp:
        folder = Path(tmp)
        try:
            start_processes(  # type: ignore[no-untyped-call]
                _entry,
                args=(fn, args, nproc, backend, _free_port(), timeout_s, threads, str(folder)),
                nprocs=nproc,
                join=True,
                start_method=method,
            )
        except ProcessException as exc:  # a rank raised or died
            failures = sorted((int(p.stem.split("-")[1]), p.read_text()) for p in folder.glob("error-*.txt"))
            if failures:
                rank, message = failures[0]
                raise BenchError(f"rank {rank} failed: {message}") from None
            last = str(exc).strip().splitlines()[-1]
            raise BenchError(f"a benchmark process ended abnormally: {last}") from None
        result = folder / "result.pickle"
        return pickle.loads(result.read_bytes()) if result.exists() else None


def _entry(
    local_rank: int,
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    world: int,
    backend: str,
    port: int,
    timeout_s: float,
    threads: int,
    folder: str,
) -> None:
    try:
        ctx = _init(local_rank, world, local_rank, backend, f"tcp://127.0.0.1:{port}", timeout_s, threads)
        try:
            value = fn(ctx, *args)
        finally:
            dist.destroy_process_group()
        if local_rank == 0:
            Path(folder, "result.pickle").write_bytes(pickle.dumps(value))
    except BaseException as exc:
        message = str(exc) if isinstance(exc, BenchError) else _last_line(exc)
        Path(folder, f"error-{local_rank}.txt").write_text(message)
        raise


def _last_line(exc: BaseException) -> str:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def _init(
    rank: int, world: int, local: int, backend: str, init_method: str, timeout_s: float, threads: int | None
) -> Rank:
    if threads is not None:
        torch.set_num_threads(threads)  # N processes on one machine share its cores, as torchrun's OMP=1
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=dt.timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    return Rank(rank, world, local, backend, device)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
