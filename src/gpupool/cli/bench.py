"""`gpupool bench`: collective bandwidth, GEMM, training throughput, and token files for the training bench.

torch is imported inside the commands only, so the rest of the CLI starts without it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gpupool.bench.errors import BenchError
from gpupool.cli.render import console, err_console, print_error, print_json, print_warnings
from gpupool.timeutil import utcnow

if TYPE_CHECKING:
    from gpupool.client import Client

bench_app = typer.Typer(
    help="Benchmarks in the formats people already read: nccl-tests tables, GEMM TFLOPS, Megatron-style MFU.",
    no_args_is_help=True,
)

_TORCH_MISSING = (
    "the bench commands need torch; install it with `pip install 'gpupool[bench]'` (or `pip install torch`)"
)


@contextlib.contextmanager
def bench_errors() -> Iterator[None]:
    """A BenchError is one readable line on stderr and exit code 1, like every other CLI error."""
    try:
        yield
    except BenchError as exc:
        print_error(exc)
        raise typer.Exit(1) from None
    except ModuleNotFoundError as exc:
        if exc.name != "torch":
            raise
        print_error(_TORCH_MISSING)
        raise typer.Exit(1) from None


def _write_json(path: Path | None, payload: Any) -> None:
    if path is None:
        return
    if str(path) == "-":
        print_json(payload)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(payload, indent=2) + "\n")
    except OSError as exc:
        raise BenchError(f"--json {path}: cannot write ({exc.strerror})") from exc
    err_console.print(f"[dim]wrote {path}[/dim]", highlight=False)


# -- submitting a bench as a gpupool job --------------------------------------------------------------------

_SUBMIT = typer.Option(False, "--submit", help="run as a gpupool job instead of here (see docs/bench.md)")
_PRINT_SPEC = typer.Option(False, "--print-spec", help="print the spec --submit would submit; submit nothing")
_NODES = typer.Option(1, "--nodes", help="with --submit: nodes in the job (a gang; torchrun joins them)")
_GPUS = typer.Option(None, "--gpus", help="with --submit: GPUs per node, e.g. 8 or H100:8 (required)")
_QUEUE = typer.Option("default", "--queue", "-q", help="with --submit: the queue")
_NAME = typer.Option(None, "--name", help="with --submit: the job name (default bench-<kind>)")
_RECORD = typer.Option(
    False,
    "--record",
    help="record the result on the head for this node (--node; admin token); --submit always does",
)
_NODE = typer.Option(
    None, "--node", help="the node the result is recorded for (implies --record; default: this host's name)"
)
_EMIT = typer.Option(
    False, "--emit-result", hidden=True, help="print the result line a bench job's log carries"
)


def _report(kind: str, payload: dict[str, Any], json_out: Path | None, *, record: bool, node: str | None,
            emit: bool) -> None:  # fmt: skip
    """Write --json, print the job's result line (--emit-result), and record the result on the head. The
    report says when it was measured (`measured_at`): a copy sent later is stored at that time."""
    from gpupool.bench.results import result_line

    payload = {**payload, "measured_at": utcnow().isoformat()}
    _write_json(json_out, payload)
    if emit:
        rank = os.environ.get("GPUPOOL_NODE_RANK", "")
        print(result_line(payload, int(rank) if rank.isdigit() else None), flush=True)
    if not (record or node):
        return
    from gpupool.cli.app import client  # the global --server/--token options live there
    from gpupool.cli.bench_results import describe
    from gpupool.client import GpupoolError

    name = node or socket.gethostname()
    try:
        stored = client().record_bench(name, payload, kind=kind)
    except GpupoolError as exc:
        saved = json_out if json_out is not None and str(json_out) != "-" else None
        if saved is None:  # nothing is lost: keep the result where `bench record` can send it later
            saved = Path(f"gpupool-bench-{kind}-{time.strftime('%Y%m%d-%H%M%S')}.json")
            saved.write_text(json.dumps(payload, indent=2) + "\n")
        raise BenchError(
            f"--record: the head did not take the result ({exc}); it is in {saved}: "
            f"send it with `gpupool bench record {saved} --node {name}`"
        ) from exc
    for r in stored:
        err_console.print(f"recorded for node {r['node']}: {describe(r)}", highlight=False, soft_wrap=True)


def _submit(
    kind: str,
    forward: list[str],
    *,
    distributed: bool,
    nodes: int,
    gpus: str | None,
    queue: str,
    name: str | None,
    print_spec: bool,
    node: str | None = None,
    needs_gpus: bool = False,
) -> None:
    """Submit the bench as a job; `needs_gpus`: it fails without GPUs torch can see (gemm's --device all),
    so a pool of simulated GPUs is refused here rather than at run time."""
    from gpupool.bench.submit import job_spec, results_path
    from gpupool.spec import parse_workload_spec

    spec = job_spec(
        kind,
        forward,
        distributed=distributed,
        nodes=nodes,
        gpus=gpus,
        queue=queue,
        name=name,
        workdir=os.getcwd(),
        node_names=[node] if node is not None else None,
    )
    parse_workload_spec(spec)
    if print_spec:
        print_json(spec)
        return
    from gpupool.cli.app import client  # the global --server/--token options live there

    c = client()
    if needs_gpus:
        _refuse_simulated(c, node)
    created = c.submit(spec)
    results = results_path(kind, distributed, created["id"], nodes)
    console.print(
        f"submitted [bold]{created['id']}[/bold] ({created['name']}) to queue {created['queue']}: "
        f"{created['state']}; results: {spec['workdir']}/{results}",
        highlight=False,
    )
    print_warnings(created)


def _refuse_simulated(c: Client, node: str | None) -> None:
    """BenchError when every GPU the job could be placed on (`node`'s, else the pool's) is simulated: torch
    sees none there, so `--device all` would fail when the job runs."""
    from gpupool.client import GpupoolError

    try:
        nodes = c.nodes()
    except GpupoolError:
        return  # the submit that follows says what is wrong with the server or the token
    gpus = [g for n in nodes if node is None or n["name"] == node for g in n.get("gpus") or []]
    if gpus and all(g.get("simulated") for g in gpus):
        where = f"node {node}'s GPUs are" if node is not None else "the pool's GPUs are all"
        raise BenchError(
            f"--submit: {where} simulated (gpupool server --gpus sim:...), which torch cannot see, so a "
            "GPU gemm would fail when the job runs; measure the CPU instead with --device cpu"
        )


# -- collective ---------------------------------------------------------------------------------------------


@bench_app.command("collective")
def collective(
    op: str = typer.Option(
        "all_reduce",
        "--op",
        help="all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, sendrecv, a list, or all",
    ),
    minbytes: str = typer.Option("8", "-b", "--minbytes", help="smallest size, e.g. 8, 1K, 32M"),
    maxbytes: str = typer.Option(
        "128M", "-e", "--maxbytes", help="largest size (K, M, G are powers of 1024)"
    ),
    stepfactor: int = typer.Option(2, "-f", "--stepfactor", help="multiply the size by this at each step"),
    iters: int = typer.Option(20, "-n", "--iters", help="timed iterations per size"),
    warmup_iters: int = typer.Option(5, "-w", "--warmup_iters", help="untimed iterations before them"),
    blocking: bool = typer.Option(False, "--blocking", "-z", help="synchronise and barrier every iteration"),
    dtype: str = typer.Option("float", "--dtype", "-d", help="float, bf16, half or double"),
    backend: str | None = typer.Option(None, "--backend", help="nccl or gloo (default nccl with GPUs)"),
    nproc: int | None = typer.Option(None, "--nproc", help="processes here (default: one per GPU; 2 on CPU)"),
    check: bool = typer.Option(True, "--check/--no-check", "-c", help="check every result (#wrong)"),
    json_out: Path | None = typer.Option(
        None, "--json", help="write the results as JSON here (- for stdout; the table then goes to stderr)"
    ),
    submit: bool = _SUBMIT,
    print_spec: bool = _PRINT_SPEC,
    nodes: int = _NODES,
    gpus: str | None = _GPUS,
    queue: str = _QUEUE,
    name: str | None = _NAME,
    record: bool = _RECORD,
    node: str | None = _NODE,
    emit_result: bool = _EMIT,
) -> None:
    """Collective bandwidth with nccl-tests' table, formulas and #wrong check (torch.distributed)."""
    from gpupool.bench.collective import DTYPES, parse_dtype, parse_ops, parse_size, size_steps

    with bench_errors():
        ops = parse_ops(op)
        kind = parse_dtype(dtype)
        low, high = parse_size(minbytes, "-b/--minbytes"), parse_size(maxbytes, "-e/--maxbytes")
        list(size_steps(low, high, stepfactor))
        if iters < 1 or warmup_iters < 0:
            raise BenchError("-n/--iters must be at least 1 and -w/--warmup_iters at least 0")
        if nproc == 1 and any(o.name == "sendrecv" for o in ops):
            raise BenchError("--op sendrecv needs at least 2 ranks; use --nproc 2 or more")
        if submit or print_spec:
            forward = ["--op", op, "-b", minbytes, "-e", maxbytes, "-f", str(stepfactor), "-n", str(iters)]
            forward += ["-w", str(warmup_iters), "--dtype", dtype] + (["--blocking"] if blocking else [])
            forward += ([] if check else ["--no-check"]) + (["--backend", backend] if backend else [])
            _submit("collective", forward, distributed=True, nodes=nodes, gpus=gpus, queue=queue,
                    name=name, print_spec=print_spec, node=node)  # fmt: skip
            return
        from gpupool.bench import launch_torch
        from gpupool.bench.collective_torch import CollectiveConfig, run_collective

        chosen = backend or launch_torch.default_backend()
        count = nproc if nproc is not None else launch_torch.default_nproc(chosen)
        key = next(k for k, v in DTYPES.items() if v == kind)
        cfg = CollectiveConfig(
            tuple(o.name for o in ops),
            key,
            low,
            high,
            stepfactor,
            iters,
            warmup_iters,
            blocking,
            check,
            table="stderr" if str(json_out) == "-" else "stdout",
        )
        reports = launch_torch.run(run_collective, (cfg,), nproc=count, backend=chosen)
        if reports is None:  # a torchrun rank other than 0: rank 0 reports
            return
        payload = reports[0] if len(reports) == 1 else {"ops": reports}
        _report("collective", payload, json_out, record=record, node=node, emit=emit_result)
        if any(r["wrong"] for r in reports):
            raise BenchError("some results were wrong (see #wrong): the collective returned bad data")


# -- gemm ---------------------------------------------------------------------------------------------------


@bench_app.command("gemm")
def gemm(
    dtype: str | None = typer.Option(None, "--dtype", "-d", help="bf16, half or float (default bf16 on GPU)"),
    sizes: str | None = typer.Option(
        None,
        "--sizes",
        "-s",
        help="N (N x N x N) or MxNxK, comma separated (default 2048..16384; CPU 128..1024)",
    ),
    iters: int = typer.Option(20, "-n", "--iters", help="timed matmuls per size"),
    warmup_iters: int = typer.Option(5, "-w", "--warmup_iters", help="untimed matmuls before them"),
    device: str = typer.Option(
        "auto", "--device", help="auto (every GPU, else the CPU), cpu, all (every GPU), or one index: 0, 1..."
    ),
    json_out: Path | None = typer.Option(
        None, "--json", help="write the results as JSON here (- for stdout; the table then goes to stderr)"
    ),
    submit: bool = _SUBMIT,
    print_spec: bool = _PRINT_SPEC,
    nodes: int = _NODES,
    gpus: str | None = _GPUS,
    queue: str = _QUEUE,
    name: str | None = _NAME,
    record: bool = _RECORD,
    node: str | None = _NODE,
    emit_result: bool = _EMIT,
) -> None:
    """Matmul TFLOPS by dtype and size, as a fraction of the GPU model's dense peak (gpupool.gpu.catalog)."""
    from gpupool.bench.gemm import DEFAULT_CPU_SIZES, DEFAULT_GPU_SIZES, parse_gemm_dtype, parse_shapes

    with bench_errors():
        if dtype is not None:
            parse_gemm_dtype(dtype)
        if sizes is not None:
            if any(not part.strip() for part in sizes.split(",")):  # "128,," is a typo, not "128"
                raise BenchError(f"--sizes {sizes!r}: an empty size between commas; give e.g. 1024,2048,4096")
            parse_shapes(sizes)
        if iters < 1 or warmup_iters < 0:
            raise BenchError("-n/--iters must be at least 1 and -w/--warmup_iters at least 0")
        if submit or print_spec:
            forward = [
                "-n",
                str(iters),
                "-w",
                str(warmup_iters),
                "--device",
                "all" if device == "auto" else device,
            ]
            forward += (["--dtype", dtype] if dtype else []) + (["--sizes", sizes] if sizes else [])
            # auto is all on a job: a GPU job that found no GPU must fail, not record the CPU's TFLOPS
            # for a GPU node (which could drain it, bench.action unhealthy)
            _submit("gemm", forward, distributed=False, nodes=nodes, gpus=gpus, queue=queue, name=name,
                    print_spec=print_spec, node=node, needs_gpus=device != "cpu")  # fmt: skip
            return
        from gpupool.bench import gemm_torch

        devices = gemm_torch.devices_for(device)
        on_gpu = devices[0].type == "cuda"
        chosen = parse_gemm_dtype(dtype) if dtype else ("bf16" if on_gpu else "float")
        shapes = parse_shapes(sizes or (DEFAULT_GPU_SIZES if on_gpu else DEFAULT_CPU_SIZES))
        with contextlib.redirect_stdout(sys.stderr if str(json_out) == "-" else sys.stdout):
            rows, notes = gemm_torch.run_gemm(devices, shapes, chosen, iters, warmup_iters)
        payload = gemm_torch.report(rows, notes, iters, warmup_iters)
        _report("gemm", payload, json_out, record=record, node=node, emit=emit_result)


# -- train --------------------------------------------------------------------------------------------------


@bench_app.command("train")
def train(
    layers: int = typer.Option(12, "--layers", help="transformer layers (l)"),
    hidden: int = typer.Option(768, "--hidden", help="hidden size (h)"),
    heads: int = typer.Option(12, "--heads", help="attention heads (h must be a multiple)"),
    seq: int = typer.Option(1024, "--seq", help="sequence length in tokens (s)"),
    vocab: int | None = typer.Option(
        None, "--vocab", help="vocabulary size V (default 50304; with --data: the file's)"
    ),
    micro_batch: int = typer.Option(4, "--micro-batch", help="sequences per rank per forward/backward"),
    global_batch: int | None = typer.Option(
        None, "--global-batch", help="sequences per optimizer step, all ranks (default micro batch x ranks)"
    ),
    iters: int = typer.Option(10, "-n", "--iters", help="timed iterations (optimizer steps)"),
    warmup_iters: int = typer.Option(2, "-w", "--warmup_iters", help="untimed iterations before them"),
    precision: str | None = typer.Option(
        None, "--precision", help="bf16, fp16 or fp32 (default bf16 on GPU, fp32 on CPU)"
    ),
    parallel: str = typer.Option("ddp", "--parallel", help="ddp or fsdp"),
    recompute: bool = typer.Option(
        False, "--recompute", help="activation recomputation (checkpoint each layer)"
    ),
    data: Path | None = typer.Option(
        None, "--data", help="token file prefix from prepare-data (default synthetic)"
    ),
    backend: str | None = typer.Option(None, "--backend", help="nccl or gloo (default nccl with GPUs)"),
    nproc: int | None = typer.Option(None, "--nproc", help="processes here (default: one per GPU; 2 on CPU)"),
    json_out: Path | None = typer.Option(
        None, "--json", help="write the results as JSON here (- for stdout; the table then goes to stderr)"
    ),
    submit: bool = _SUBMIT,
    print_spec: bool = _PRINT_SPEC,
    nodes: int = _NODES,
    gpus: str | None = _GPUS,
    queue: str = _QUEUE,
    name: str | None = _NAME,
    record: bool = _RECORD,
    node: str | None = _NODE,
    emit_result: bool = _EMIT,
) -> None:
    """GPT training throughput: tokens/s, TFLOP/s per GPU by Megatron-LM's formula, and MFU."""
    from gpupool.bench.gpt import GptShape
    from gpupool.bench.tokens import read_index

    with bench_errors():
        if precision is not None and precision not in ("bf16", "fp16", "fp32"):
            raise BenchError(f"--precision {precision!r}: give bf16, fp16 or fp32")
        if parallel not in ("ddp", "fsdp"):
            raise BenchError(f"--parallel {parallel!r}: give ddp or fsdp")
        if iters < 1 or warmup_iters < 0:
            raise BenchError("-n/--iters must be at least 1 and -w/--warmup_iters at least 0")
        for flag, given in (("--global-batch", global_batch), ("--vocab", vocab)):
            if given is not None and given < 1:  # 0 ran with the default, as if not given
                raise BenchError(f"{flag} {given}: give at least 1, or leave it out for the default")
        file_vocab = read_index(data).vocab_size if data is not None else None
        if vocab is not None and file_vocab is not None and vocab < file_vocab:
            raise BenchError(f"--vocab {vocab} is smaller than the {file_vocab} token ids of --data {data}")
        shape = GptShape(layers, hidden, heads, seq, vocab or file_vocab or 50304)
        shape.validate()
        if submit or print_spec:
            forward = [
                "--layers",
                str(layers),
                "--hidden",
                str(hidden),
                "--heads",
                str(heads),
                "--seq",
                str(seq),
            ]
            forward += ["--vocab", str(shape.vocab), "--micro-batch", str(micro_batch), "-n", str(iters)]
            forward += ["-w", str(warmup_iters), "--parallel", parallel] + (
                ["--recompute"] if recompute else []
            )
            forward += ["--global-batch", str(global_batch)] if global_batch else []
            forward += ["--precision", precision] if precision else []
            forward += ["--data", str(data.resolve())] if data else []
            forward += ["--backend", backend] if backend else []
            _submit("train", forward, distributed=True, nodes=nodes, gpus=gpus, queue=queue, name=name,
                    print_spec=print_spec, node=node)  # fmt: skip
            return
        from gpupool.bench.gpt import Batching
        from gpupool.bench.launch import torchrun_world_size

        world = torchrun_world_size() or nproc
        if world is not None:  # known without torch: check before the slow import
            Batching(micro_batch, global_batch or micro_batch * world, world).validate()
        from gpupool.bench import launch_torch
        from gpupool.bench.train_torch import TrainConfig, run_train

        chosen = backend or launch_torch.default_backend()
        count = nproc if nproc is not None else launch_torch.default_nproc(chosen)
        world = torchrun_world_size() or count
        batch = global_batch or micro_batch * world
        Batching(micro_batch, batch, world).validate()
        cfg = TrainConfig(
            shape,
            micro_batch,
            batch,
            iters,
            warmup_iters,
            precision or ("bf16" if chosen == "nccl" else "fp32"),
            parallel,
            str(data) if data is not None else None,
            recompute,
            table="stderr" if str(json_out) == "-" else "stdout",
        )
        result = launch_torch.run(run_train, (cfg,), nproc=count, backend=chosen)
        if result is not None:
            _report("train", result, json_out, record=record, node=node, emit=emit_result)


# -- prepare-data -------------------------------------------------------------------------------------------


@bench_app.command("prepare-data")
def prepare_data(
    source: Path = typer.Argument(..., help="JSONL: one JSON object per line with the text in --json-key"),
    output: Path = typer.Option(
        ..., "--output", "-o", help="prefix of the token file: writes PREFIX.bin, PREFIX.idx"
    ),
    json_key: str = typer.Option("text", "--json-key", help="the field that holds each document's text"),
) -> None:
    """Turn JSONL text into a token file for `bench train --data` (byte-level tokenizer, no download)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    from gpupool.bench.tokens import paths, write_token_file

    with bench_errors():
        try:
            total = source.stat().st_size
        except OSError as exc:
            raise BenchError(f"cannot read {source}: {exc.strerror}") from exc
        output.parent.mkdir(parents=True, exist_ok=True)
        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            DownloadColumn(),
            TimeRemainingColumn(),
            console=err_console,
            transient=True,
        ) as progress:
            task = progress.add_task(f"tokenizing {source.name}", total=total)
            index = write_token_file(
                source, output, key=json_key, on_progress=lambda n: progress.advance(task, n)
            )
        bin_path, idx_path = paths(output)
        console.print(
            f"{index.documents} documents, {index.tokens} tokens (byte-level, vocabulary {index.vocab_size}, "
            f"end-of-document id {index.eod}): {bin_path}, {idx_path}",
            highlight=False,
        )


# `record` and `results` register on bench_app as they are imported, after the benches: `--help`'s order.
from gpupool.cli import bench_results as _bench_results  # noqa: E402, F401  (registers `bench record|results`)
