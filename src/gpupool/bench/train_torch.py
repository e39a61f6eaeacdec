"""The training-throughput benchmark on each rank: data parallel (DDP or FSDP) GPT training steps.

One iteration is one optimizer step over the global batch: every rank runs `accumulation` micro-batches
of `micro_batch` sequences (gradients synchronised on the last one only), then AdamW steps. Iterations are
timed from the end of one to the end of the next, each ending with a device synchronisation; the first
`warmup` iterations (allocator, kernel selection, DDP buckets) are not counted.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from gpupool.bench.errors import BenchError
from gpupool.bench.gpt import Batching, GptShape, count_text, megatron_flops
from gpupool.bench.gpt_torch import Gpt
from gpupool.bench.launch_torch import Rank
from gpupool.bench.peak import peak_for
from gpupool.bench.tokens import paths, read_index

PRECISIONS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}
PEAK_DTYPE = {"bf16": "bf16", "fp16": "half", "fp32": "float"}


@dataclass(frozen=True)
class TrainConfig:
    shape: GptShape
    micro_batch: int
    global_batch: int
    iters: int
    warmup: int
    precision: str  # bf16 | fp16 | fp32
    parallel: str  # ddp | fsdp
    data: str | None  # token file prefix; None: synthetic tokens
    recompute: bool = False
    table: str = "stdout"  # where rank 0 prints its lines: stdout, or stderr (with --json -)
    lr: float = 3e-4
    seed: int = 1234


class _Tokens:
    """Micro-batches of (input, target) token windows: uniform random ids, or windows of a token file."""

    def __init__(self, cfg: TrainConfig, ctx: Rank) -> None:
        self.cfg, self.device = cfg, ctx.device
        self.gen = torch.Generator().manual_seed(cfg.seed + ctx.rank)
        self.file: torch.Tensor | None = None
        if cfg.data is not None:
            index = read_index(Path(cfg.data))
            if index.tokens < cfg.shape.seq + 1:
                raise BenchError(
                    f"--data {cfg.data} holds {index.tokens} tokens, fewer than --seq {cfg.shape.seq} + 1"
                )
            bin_path, _ = paths(Path(cfg.data))
            self.file = torch.from_file(str(bin_path), shared=False, size=index.tokens, dtype=torch.uint16)

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        b, s = self.cfg.micro_batch, self.cfg.shape.seq
        if self.file is None:
            window = torch.randint(0, self.cfg.shape.vocab, (b, s + 1), generator=self.gen)
        else:
            starts = torch.randint(0, self.file.numel() - s, (b,), generator=self.gen)
            window = torch.stack([self.file[i : i + s + 1].to(torch.int64) for i in starts.tolist()])
        window = window.to(self.device, non_blocking=True)
        return window[:, :-1], window[:, 1:]


def run_train(ctx: Rank, cfg: TrainConfig) -> dict[str, object]:
    batching = Batching(cfg.micro_batch, cfg.global_batch, ctx.world_size)
    batching.validate()
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    gpt = Gpt(cfg.shape, recompute=cfg.recompute).to(ctx.device)
    parameters = sum(p.numel() for p in gpt.parameters())
    model, grad_sync = _parallel(gpt, cfg.parallel, ctx)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, fused=ctx.is_cuda)
    amp_dtype = PRECISIONS[cfg.precision]
    scaler = torch.amp.GradScaler(ctx.device.type, enabled=cfg.precision == "fp16")
    data = _Tokens(cfg, ctx)
    peak = _peak(ctx, cfg.precision)
    flops = megatron_flops(cfg.shape, cfg.global_batch)
    tokens_per_iter = cfg.global_batch * cfg.shape.seq
    _say(ctx, cfg, _header(ctx, cfg, batching, parameters, peak.note))
    _say(
        ctx,
        cfg,
        [
            f"{'iteration':>11s}  {'time(s)':>9s}  {'loss':>8s}  {'tokens/s':>12s}  "
            f"{'TFLOP/s/GPU':>11s}  {'MFU':>6s}"
        ],
    )

    times, losses = [], []
    ctx.synchronize()
    dist.barrier()
    last = time.perf_counter()
    for iteration in range(cfg.warmup + cfg.iters):
        loss_sum = torch.zeros((), device=ctx.device)
        for micro in range(batching.accumulation):
            x, y = data.next()
            sync = micro == batching.accumulation - 1
            with grad_sync(sync), _autocast(ctx, amp_dtype):
                loss = model(x, y) / batching.accumulation
            scaler.scale(loss).backward()
            loss_sum += loss.detach()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        ctx.synchronize()
        now = time.perf_counter()
        elapsed, last = now - last, now
        timed = iteration >= cfg.warmup
        if timed:
            times.append(elapsed)
        losses.append(float(loss_sum))
        tflops = flops / elapsed / ctx.world_size / 1e12
        mfu = f"{tflops / peak.tflops * 100:5.1f}%" if peak.tflops else f"{'-':>6s}"
        label = f"{iteration + 1 - cfg.warmup}/{cfg.iters}" if timed else f"warmup {iteration + 1}"
        _say(
            ctx,
            cfg,
            [
                f"{label:>11s}  {elapsed:9.3f}  {losses[-1]:8.4f}  {tokens_per_iter / elapsed:12.1f}  "
                f"{tflops:11.3f}  {mfu}"
            ],
        )

    mean = sum(times) / len(times)
    tflops_per_gpu = flops / mean / ctx.world_size / 1e12
    result: dict[str, object] = {
        "benchmark": "train",
        "model": {**cfg.shape.__dict__, "parameters": parameters},
        "world_size": ctx.world_size,
        "backend": ctx.backend,
        "device": ctx.device.type,
        "device_name": peak.device_name,
        "parallel": cfg.parallel,
        "precision": cfg.precision,
        "micro_batch": cfg.micro_batch,
        "global_batch": cfg.global_batch,
        "grad_accumulation": batching.accumulation,
        "recompute": cfg.recompute,
        "data": cfg.data or "synthetic",
        "iters": cfg.iters,
        "warmup_iters": cfg.warmup,
        "iteration_times_s": times,
        "iteration_time_s": mean,
        "tokens_per_s": tokens_per_iter / mean,
        "flops_per_iteration": flops,
        "tflops_per_gpu": tflops_per_gpu,
        "hardware_tflops_per_gpu": megatron_flops(cfg.shape, cfg.global_batch, recompute=cfg.recompute)
        / mean
        / ctx.world_size
        / 1e12,
        "peak_tflops": peak.tflops,
        "peak_note": peak.note,
        "mfu": tflops_per_gpu / peak.tflops if peak.tflops else None,
        "loss_first": losses[0],
        "loss_last": losses[-1],
    }
    if peak.tflops:
        mfu_text = f"{tflops_per_gpu / peak.tflops * 100:.1f}% of {peak.tflops:g} TFLOPS"
    else:
        mfu_text = f"- ({peak.note})"
    _say(
        ctx,
        cfg,
        [
            f"# tokens/s: {result['tokens_per_s']:.1f}  TFLOP/s per GPU: {tflops_per_gpu:.3f}  "
            f"MFU: {mfu_text}",
            "# FLOPs per iteration (Megatron-LM formula, Narayanan et al. SC'21 eq. 3, without "
            f"recomputation): {flops:.4g}",
        ],
    )
    return result


_GradSync = Callable[[bool], contextlib.AbstractContextManager[None]]


@dataclass(frozen=True)
class _DevicePeak:
    tflops: float | None
    note: str
    device_name: str


def _peak(ctx: Rank, precision: str) -> _DevicePeak:
    if not ctx.is_cuda:
        found = peak_for(None, None, PEAK_DTYPE[precision])
        return _DevicePeak(None, found.note, "cpu")
    props = torch.cuda.get_device_properties(ctx.device)
    found = peak_for(str(props.name), int(props.total_memory), PEAK_DTYPE[precision])
    return _DevicePeak(found.tflops, found.note, str(props.name))


def _parallel(model: Gpt, how: str, ctx: Rank) -> tuple[nn.Module, _GradSync]:
    """Wrap for data parallelism; return the model and `grad_sync(sync)`: a context for one micro-batch
    that all-reduces (or reduce-scatters) its gradients only when sync is true."""
    if how == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)  # one all-gather / reduce-scatter per layer, overlapped with compute
        sharded = fully_shard(model)

        @contextlib.contextmanager
        def fsdp_sync(sync: bool) -> Iterator[None]:
            sharded.set_requires_gradient_sync(sync)
            yield

        return model, fsdp_sync  # fully_shard changed the class of model itself: sharded is model
    from torch.nn.parallel import DistributedDataParallel

    ddp = DistributedDataParallel(model, device_ids=[ctx.device.index] if ctx.is_cuda else None)

    def ddp_sync(sync: bool) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext() if sync else ddp.no_sync()

    return ddp, ddp_sync


def _autocast(ctx: Rank, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[None]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(ctx.device.type, dtype=dtype)


def _header(ctx: Rank, cfg: TrainConfig, batching: Batching, parameters: int, peak_note: str) -> list[str]:
    s = cfg.shape
    return [
        f"# gpupool bench train: GPT, {s.layers} layers, hidden {s.hidden}, {s.heads} heads, seq {s.seq}, "
        f"vocab {s.vocab}: {count_text(parameters)} parameters",
        f"# {ctx.world_size} ranks ({ctx.backend}, {cfg.parallel}, {ctx.device.type}), micro batch "
        f"{cfg.micro_batch}, global batch {cfg.global_batch}, gradient accumulation {batching.accumulation}, "
        f"precision {cfg.precision}, data {cfg.data or 'synthetic'}"
        + (", activation recomputation" if cfg.recompute else ""),
        f"# peak: {peak_note}",
    ]


def _say(ctx: Rank, cfg: TrainConfig, lines: list[str]) -> None:
    if ctx.leader:
        stream = sys.stderr if cfg.table == "stderr" else sys.stdout
        stream.write("\n".join(lines) + "\n")
        stream.flush()
