"""`gpupool bench record|results`: bench results on the head, a saved one recorded for a node and the stored
ones listed; `describe` and `result_lines` write them as lines (also for a bench's --record, `node show`)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import typer

from gpupool.bench.errors import BenchError
from gpupool.bench.gpt import count_text
from gpupool.cli.bench import bench_app, bench_errors
from gpupool.cli.render import JSON_HELP, console, err_console, print_json


def describe(result: dict[str, Any]) -> str:
    """One stored result as one line: the figures a person compares, then what they were measured with."""
    f, p, key = result["figures"], result["parameters"], result["key"]
    if result["kind"] == "collective":
        busbw = "-" if f.get("busbw") is None else f"{f['busbw']:.4g}"
        size = f.get("max_bytes") or 0
        return (
            f"collective {key}: busbw {busbw} GB/s at {_size_text(size)}, avg {f['avg_busbw']:.4g} GB/s, "
            f"#wrong {f['wrong']} ({f['nranks']} ranks, {p.get('dtype')}, {p.get('backend')})"
        )
    if result["kind"] == "gemm":
        fraction = f.get("worst_gpu_fraction_of_peak")
        share = f" = {fraction:.0%} of peak" if fraction is not None else ""
        device, on = f["worst_gpu"], f"({p.get('devices')} x {p.get('device_name')})"
        if not str(device).startswith("cuda"):  # the CPU: one device, no GPU to call slowest
            return f"gemm {key}: best {f['best_tflops']:.4g} TFLOPS on {device}{share} {on}"
        return (
            f"gemm {key}: best {f['best_tflops']:.4g} TFLOPS, slowest GPU {device} "
            f"{f['worst_gpu_tflops']:.4g} TFLOPS{share} {on}"
        )
    mfu = "-" if f.get("mfu") is None else f"{f['mfu']:.1%}"
    params = (p.get("model") or {}).get("parameters") or 0
    return (
        f"train {key}: {f['tokens_per_s']:.4g} tokens/s, {f['tflops_per_gpu']:.4g} TFLOP/s per GPU, "
        f"MFU {mfu} ({count_text(params)} parameters, {f['world_size']} ranks, {p.get('parallel')})"
    )


def _size_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


@bench_app.command("record")
def record_file(
    path: Path = typer.Argument(..., help="a JSON result a bench wrote with --json"),
    node: str | None = typer.Option(None, "--node", help="the node it was measured on (default: this host)"),
) -> None:
    """Record a saved bench result on the head for a node (admin token)."""
    from gpupool.bench.results import BenchResultError, kind_of, measured_at

    with bench_errors():
        try:
            payload = json.loads(path.read_text(), parse_constant=_no_constant)
        except OSError as exc:
            raise BenchError(f"cannot read {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise BenchError(f"{path}: not JSON ({exc}); give the file a bench wrote with --json") from exc
        try:
            kind = kind_of(payload)
            dated = measured_at(payload) is not None
        except BenchResultError as exc:
            raise BenchError(f"{path}: {exc}") from exc
        from gpupool.cli.app import client

        stored = client().record_bench(node or socket.gethostname(), payload, kind=kind, source="file")
        for r in stored:
            when = r["measured_at"][:19].replace("T", " ")
            console.print(
                f"recorded for node {r['node']} (measured {when} UTC): {describe(r)}",
                highlight=False,
                soft_wrap=True,
            )
        if not dated:
            err_console.print(
                f"warning: {path} has no measured_at (a bench of an older gpupool wrote it): recorded as "
                "measured now, so it is the node's newest result of its series",
                highlight=False,
                soft_wrap=True,
            )


def _no_constant(name: str) -> None:
    """NaN and Infinity, which Python's json reads but JSON has not (nor any measured figure)."""
    raise ValueError(f"{name} is not a number JSON allows")


@bench_app.command("results")
def results(
    node: str | None = typer.Argument(None, help="one node's results (default: every node)"),
    kind: str | None = typer.Option(None, "--kind", help="collective, gemm or train"),
    history: bool = typer.Option(False, "--history", help="every stored result, not only the newest of each"),
    limit: int = typer.Option(50, "--limit", help="at most this many results"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Bench results stored on the head: the newest of each node, kind and series (op, dtype, precision)."""
    from gpupool.cli.app import client

    rows = client().bench_results(node=node, kind=kind, latest=not history, limit=limit)
    if as_json:
        print_json(rows)
        return
    if not rows:
        where = f" for node {node}" if node else ""
        console.print(f"no bench results{where}; record one with `gpupool bench ... --record --node NAME`")
        return
    for line in result_lines(rows, with_node=node is None):
        console.print(line, highlight=False, soft_wrap=True)


def result_lines(rows: list[dict[str, Any]], *, with_node: bool = False) -> list[str]:
    """Stored results as lines (`bench results`, `node show`): when, where from, then the figures."""
    lines = []
    for r in rows:
        where = f"{r['node']:<12s} " if with_node else ""
        lines.append(f"  {where}{r['measured_at'][:19].replace('T', ' ')}  {r['source']:<8s} {describe(r)}")
    return lines
