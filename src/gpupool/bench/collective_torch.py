"""The collective benchmark on each rank: buffers, timing as nccl-tests does it, and the result check.

Timing: warm-up iterations, a barrier, then n iterations launched back to back and one synchronisation at
the end; the time of one operation is the elapsed time / n, averaged over the ranks (nccl-tests' default,
`-a 1`). On a GPU the elapsed time comes from CUDA events around the n launches; on the CPU from a wall
clock (gloo runs each operation to completion before the call returns). `--blocking` adds a
synchronisation and a barrier after every iteration, like nccl-tests' `-z 1`.

Check: every rank fills its input with small integers that depend on its rank, so sums are exact in
half and bfloat16 too; after the timed runs the buffers are filled again, the operation runs once, and
every element of the output is compared with the expected value (`#wrong`, summed over the ranks).
"""

from __future__ import annotations

import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gpupool.bench.collective import (
    DTYPES,
    OPS,
    Cell,
    Op,
    Plan,
    Row,
    cell,
    footer_lines,
    header_lines,
    plan_sizes,
    report,
    row_line,
    size_steps,
)
from gpupool.bench.errors import BenchError
from gpupool.bench.launch_torch import Rank

# torch 2.13 renamed the tensor forms; older releases only have the old names.
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class CollectiveConfig:
    ops: tuple[str, ...]
    dtype: str  # a key of DTYPES
    min_bytes: int
    max_bytes: int
    factor: int
    iters: int
    warmup: int
    blocking: bool
    check: bool = True
    table: str = "stdout"  # where rank 0 prints the tables: stdout, stderr (with --json -) or none


def run_collective(ctx: Rank, cfg: CollectiveConfig) -> list[dict[str, object]]:
    """Measure every op at every size on this rank; rank 0 prints the tables and returns the reports."""
    dtype = DTYPES[cfg.dtype]
    torch_dtype = getattr(torch, dtype.torch_name)
    devices = _device_lines(ctx)
    sizes = list(size_steps(cfg.min_bytes, cfg.max_bytes, cfg.factor))
    reports = []
    for name in cfg.ops:
        op = OPS[name]
        if op.name == "sendrecv" and ctx.world_size < 2:
            raise BenchError("--op sendrecv needs at least 2 ranks; use --nproc 2 or more")
        plans, skipped = plan_sizes(op, dtype, ctx.world_size, sizes)
        _say(
            ctx,
            cfg,
            header_lines(
                op,
                nranks=ctx.world_size,
                min_bytes=cfg.min_bytes,
                max_bytes=cfg.max_bytes,
                factor=cfg.factor,
                warmup=cfg.warmup,
                iters=cfg.iters,
                blocking=cfg.blocking,
                backend=ctx.backend,
                devices=devices,
            ),
        )
        rows = []
        for plan in plans:
            cells: list[Cell | None] = []
            for in_place in (False, True):
                if not (op.in_place if in_place else op.out_of_place):
                    cells.append(None)
                    continue
                bench = OpBuffers(ctx, op, plan, torch_dtype, in_place)
                seconds = time_op(ctx, bench.launch, cfg)
                wrong = bench.check() if cfg.check else 0
                time_us, wrong = mean_over_ranks(ctx, seconds * 1e6, wrong)
                cells.append(cell(op, plan.size, ctx.world_size, time_us, wrong))
                del bench
            row = Row(plan.size, plan.counts.param, dtype.name, op.redop, op.root, cells[0], cells[1])
            rows.append(row)
            _say(ctx, cfg, [row_line(row)])
        _say(ctx, cfg, footer_lines(op, rows, skipped))
        reports.append(
            report(
                op,
                rows,
                dtype=dtype.name,
                nranks=ctx.world_size,
                backend=ctx.backend,
                device=ctx.device.type,
                min_bytes=cfg.min_bytes,
                max_bytes=cfg.max_bytes,
                step_factor=cfg.factor,
                iters=cfg.iters,
                warmup_iters=cfg.warmup,
                blocking=cfg.blocking,
                skipped_sizes=skipped,
                devices=devices,
            )
        )
    return reports


def _say(ctx: Rank, cfg: CollectiveConfig, lines: list[str]) -> None:
    if ctx.leader and cfg.table != "none":
        stream = sys.stderr if cfg.table == "stderr" else sys.stdout
        stream.write("\n".join(lines) + "\n")
        stream.flush()


def _device_lines(ctx: Rank) -> list[str]:
    """nccl-tests' "# Using devices" lines, one per rank, gathered to every rank."""
    if ctx.is_cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        bus = getattr(props, "pci_bus_id", 0)
        where = f"device {ctx.device.index:2d} [0x{bus:02x}] {props.name}"
    else:
        where = f"device cpu [{os.cpu_count()} cores] {platform.processor() or platform.machine()}"
    host = socket.gethostname().split(".")[0]
    mine = f"#  Rank {ctx.rank:2d} Group  0 Pid {os.getpid():6d} on {host:>10s} {where}"
    lines: list[object] = [None] * ctx.world_size
    dist.all_gather_object(lines, mine)
    return [str(line) for line in lines]


def time_op(ctx: Rank, launch: Callable[[], None], cfg: CollectiveConfig) -> float:
    """Seconds per operation on this rank."""
    for _ in range(cfg.warmup):
        launch()
    ctx.synchronize()
    dist.barrier()
    if ctx.is_cuda:
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        for _ in range(cfg.iters):
            launch()
            if cfg.blocking:
                ctx.synchronize()
                dist.barrier()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3 / cfg.iters
    began = time.perf_counter()
    for _ in range(cfg.iters):
        launch()
        if cfg.blocking:
            dist.barrier()
    return (time.perf_counter() - began) / cfg.iters


def mean_over_ranks(ctx: Rank, time_us: float, wrong: int) -> tuple[float, int]:
    """Mean time and total wrong elements over the ranks."""
    both = torch.tensor([time_us, float(wrong)], dtype=torch.float64, device=ctx.device)
    dist.all_reduce(both)
    return float(both[0]) / ctx.world_size, round(float(both[1]))


def pattern(rank: int, start: int, length: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rank r's data at element offsets start..start+length: 1..4, exact in every dtype, sums too."""
    return ((torch.arange(start, start + length, device=device) + rank) % 4 + 1).to(dtype)


class OpBuffers:
    """One op's buffers at one size and its launch and check; in place or out of place."""

    def __init__(self, ctx: Rank, op: Op, plan: Plan, dtype: torch.dtype, in_place: bool) -> None:
        self.ctx, self.op, self.in_place = ctx, op, in_place
        self.n, self.r = ctx.world_size, ctx.rank
        self.p = plan.counts.param
        self.dtype, self.device = dtype, ctx.device
        send, recv = plan.counts.send, plan.counts.recv
        name = op.name
        if name in ("all_reduce", "broadcast", "reduce"):
            self.inp = self.out = torch.empty(recv, dtype=dtype, device=self.device)
        elif name == "all_gather":
            self.out = torch.empty(recv, dtype=dtype, device=self.device)
            self.inp = (
                self.out[self.r * self.p : (self.r + 1) * self.p]
                if in_place
                else torch.empty(send, dtype=dtype, device=self.device)
            )
        elif name == "reduce_scatter":
            self.inp = torch.empty(send, dtype=dtype, device=self.device)
            self.out = (
                self.inp[self.r * self.p : (self.r + 1) * self.p]
                if in_place
                else torch.empty(recv, dtype=dtype, device=self.device)
            )
        else:  # alltoall, sendrecv: out of place only
            self.inp = torch.empty(send, dtype=dtype, device=self.device)
            self.out = torch.empty(recv, dtype=dtype, device=self.device)
        self.fill()
        self.launch = self._launcher()

    def fill(self) -> None:
        self.inp.copy_(pattern(self.r, 0, self.inp.numel(), self.dtype, self.device))

    def _launcher(self) -> Callable[[], None]:
        inp, out, n, r = self.inp, self.out, self.n, self.r
        name = self.op.name
        if name == "all_reduce":
            return lambda: dist.all_reduce(out)
        if name == "all_gather":
            return lambda: _all_gather(out, inp)
        if name == "reduce_scatter":
            return lambda: _reduce_scatter(out, inp)
        if name == "broadcast":
            return lambda: dist.broadcast(out, src=0)
        if name == "reduce":
            return lambda: dist.reduce(out, dst=0)
        if name == "alltoall":
            return lambda: dist.all_to_all_single(out, inp)
        ops = [dist.P2POp(dist.isend, inp, (r + 1) % n), dist.P2POp(dist.irecv, out, (r - 1) % n)]

        def sendrecv() -> None:
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return sendrecv

    def check(self) -> int:
        """Fill again, run once, count the elements that differ from the expected result."""
        self.fill()
        self.ctx.synchronize()
        self.launch()
        self.ctx.synchronize()
        expected = self._expected()
        if expected is None:
            return 0
        return int((self.out != expected).sum().item())

    def _expected(self) -> torch.Tensor | None:
        n, r, p, name = self.n, self.r, self.p, self.op.name
        size = self.out.numel()

        def data(rank: int, start: int, length: int) -> torch.Tensor:
            return pattern(rank, start, length, self.dtype, self.device)

        def total(start: int, length: int) -> torch.Tensor:
            acc = torch.zeros(length, dtype=torch.float64, device=self.device)
            for rank in range(n):
                acc += data(rank, start, length).double()
            return acc.to(self.dtype)

        if name == "all_reduce":
            return total(0, size)
        if name == "reduce":
            return total(0, size) if r == 0 else None  # only the root's buffer is defined
        if name == "broadcast":
            return data(0, 0, size)
        if name == "all_gather":
            return torch.cat([data(s, 0, p) for s in range(n)])
        if name == "reduce_scatter":
            return total(r * p, p)
        if name == "alltoall":
            return torch.cat([data(s, r * p, p) for s in range(n)])
        return data((r - 1) % n, 0, size)  # sendrecv: from the previous rank
