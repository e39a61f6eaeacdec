"""Where a whole replay's time goes: the trace window replayed under `perf record` (call graphs from DWARF),
each sample charged to the compiled function right under a chosen one.

`replay_instructions.py` counts instructions exactly but only for a window of `decide` calls (callgrind is
about 50x slower than the replay); this samples the whole replay, engine included, in about a minute.
mypyc names its C functions after the Python ones (`CPyDef_<module>___<Class>___<method>`), so a sample's
stack reads as the Python call chain. For each `--root` (a function, default the engine's run loop, its
cycles, `decide`, the cycle's set-up and its actions) the table lists the root's share of all samples and
how that share splits over the compiled functions it calls ("(own)" is the root's own code and the
CPython runtime it calls: dict lookups, allocation, reference counts).

Needs `perf` (Debian's `linux-perf`) and a compiled scheduler and engine (`tools/build_native.py`); the
source scheduler runs as interpreted Python, which perf cannot attribute to Python functions.

    python benchmarks/replay_perf.py                          # the Philly week under gpupool
    python benchmarks/replay_perf.py --code /tmp/old/src      # another code (the first --code only)
    python benchmarks/replay_perf.py --policy las --root CPyDef_allocate___Allocation___allocate
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import add_replay_options, console, replay_codes, write_run
from rich.table import Table

NAME = "replay_perf"
ROOTS = (
    "CPyDef_engine___Simulation___run",
    "CPyDef_engine___Simulation____cycles",
    "CPyDef_engine___Simulation____cycle",
    "CPyDef_core____run",
    "CPyDef_prepare___Prepared_____init__",
    "CPyDef_cycle___Cycle___run",
)

# Run in the child, under perf: PYTHONPATH selects the code.
CHILD = """
import sys, time
import gpupool.scheduler as scheduler
import gpupool.sim as sim
from gpupool.sim import experiment
if not (scheduler.NATIVE and sim.NATIVE):
    raise SystemExit("the scheduler or the engine is not compiled: run tools/build_native.py")
trace, window, cluster, queues, policy = sys.argv[1:6]
e = experiment.prepare(trace, cluster, window=window, queues=queues, policies=policy)
began = time.process_time()
experiment.run(e)
print("cpu_s", time.process_time() - began, "calls", e.results[0].cycles)
"""


def is_compiled(symbol: str) -> bool:
    return symbol.startswith("CPyDef_")


def read_stacks(text: str) -> list[list[str]]:
    """`perf script -F ip,sym` output as stacks of symbols, innermost first (offsets dropped). A function's
    Python-callable wrapper (`CPyPy_...`, what a call through Python reaches) reads as the function itself
    (`CPyDef_...`), so a root names either."""
    stacks: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        parts = line.split(None, 1)
        if not parts:
            if current:
                stacks.append(current)
                current = []
            continue
        symbol = parts[1].split("+")[0] if len(parts) > 1 else "?"
        if symbol.startswith("CPyPy_"):
            symbol = "CPyDef_" + symbol.removeprefix("CPyPy_")
        if not current or current[-1] != symbol:  # the wrapper and its function: one frame
            current.append(symbol)
    if current:
        stacks.append(current)
    return stacks


def split_under(stacks: list[list[str]], root: str) -> tuple[int, collections.Counter[str]]:
    """Samples with `root` on the stack, and how many of them each compiled callee right under it holds."""
    below: collections.Counter[str] = collections.Counter()
    total = 0
    for stack in stacks:
        if root not in stack:
            continue
        total += 1
        at = len(stack) - 1 - stack[::-1].index(root)  # the outermost call of root
        child = next((s for s in reversed(stack[:at]) if is_compiled(s) and s != root), "(own)")
        below[child] += 1
    return total, below


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_replay_options(parser, NAME)
    parser.add_argument("--policy", default="gpupool")
    parser.add_argument("--frequency", type=int, default=200, help="samples a second (default 200)")
    parser.add_argument("--root", action="append", help=f"function to split (repeatable; default {ROOTS})")
    parser.add_argument("--top", type=int, default=8, help="callees listed per root (default 8)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed: apt-get install linux-perf")
    code = replay_codes(args)[0]
    env = {**os.environ, "PYTHONPATH": str(code)}
    with tempfile.TemporaryDirectory(prefix="gpupool-perf-") as tmp:
        data = str(Path(tmp) / "perf.data")
        record = [
            "perf", "record", "-q", "-F", str(args.frequency), "--call-graph", "dwarf,16384", "-o", data,
            sys.executable, "-c", CHILD, args.trace, args.window, args.cluster, args.queues, args.policy,
        ]  # fmt: skip
        done = subprocess.run(record, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise SystemExit(f"perf record failed:\n{done.stderr[-2000:]}")
        replay = done.stdout.split()
        script = subprocess.run(
            ["perf", "script", "-i", data, "-F", "ip,sym"], capture_output=True, text=True, timeout=3600
        )
        if script.returncode != 0:
            raise SystemExit(f"perf script failed:\n{script.stderr[-2000:]}")
    stacks = read_stacks(script.stdout)
    if not stacks:
        raise SystemExit("perf recorded no samples")
    console.print(
        f"{args.policy}, {args.window} on {args.cluster}: {len(stacks)} samples, replay CPU "
        f"{float(replay[1]):.2f} s under perf, {replay[3]} decide calls ({code})"
    )
    roots: dict[str, Any] = {}
    for root in [r.replace("CPyPy_", "CPyDef_", 1) for r in args.root or ROOTS]:
        total, below = split_under(stacks, root)
        share = total / len(stacks)
        table = Table(title=f"{root}: {share:.1%} of the replay")
        table.add_column("right under it")
        table.add_column("share of the replay", justify="right")
        for child, count in below.most_common(args.top):
            table.add_row(child, f"{count / len(stacks):.1%}")
        console.print(table)
        roots[root] = {"share": share, "below": {c: n / len(stacks) for c, n in below.most_common()}}
    payload = {
        "samples": len(stacks),
        "cpu_s_under_perf": float(replay[1]),
        "calls": int(replay[3]),
        "roots": roots,
    }
    console.print(f"wrote {write_run(NAME, args, payload)}")


if __name__ == "__main__":
    main()
