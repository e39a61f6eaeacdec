"""Instructions the scheduler spends on a replay's real cycles, side by side across codes: a measure of the
scheduler's speed that the machine's load does not move (these boxes are shared: CPU seconds of one code
against itself vary by 10% and more).

1. The first code replays the trace window (as `gpupool sim run`) and pickles the snapshots of `--count`
   consecutive `decide` calls from call `--start` on (consecutive: a cycle's caches, such as each
   queue's last pending order, see the one before, as in a real replay).
2. Each code then decides those snapshots in a fresh process under valgrind's callgrind, which counts the
   instructions executed inside the compiled scheduler's cycle (`--toggle-collect` on it; the pure-Python
   scheduler is not counted, so build each code first), and hashes every decision (binds, evictions,
   explanations with their sentences, fair shares): codes that should decide alike print the same hash.

Needs valgrind (`apt-get install valgrind`); about a minute per code for 300 calls.

    python benchmarks/replay_instructions.py --code /tmp/old/src --code src --policy gpupool
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import add_replay_options, console, replay_codes, write_run
from rich.table import Table

NAME = "replay_instructions"
# The compiled cycle's entry (core._run), as mypyc names its C function.
ENTRY = "CPyDef_core____run"

# Pickling a snapshot: its dataclasses travel as their fields (compiled, they do not pickle by default).
REDUCERS = """
import copyreg, dataclasses, inspect
from gpupool.scheduler import snapshot as S
def _fields(obj):
    return type(obj), tuple(getattr(obj, f.name) for f in dataclasses.fields(obj) if f.init)
for _, cls in inspect.getmembers(S, inspect.isclass):
    if dataclasses.is_dataclass(cls) and cls.__module__ == S.__name__:
        copyreg.pickle(cls, _fields)
"""

CAPTURE = (
    REDUCERS
    + """
import pickle, sys
from gpupool.sim import engine, experiment
trace, window, cluster, queues, policy, start, count, out = sys.argv[1:9]
start, count = int(start), int(count)
captured, calls = [], [0]
real = engine.decide
def capture(snapshot, now):
    calls[0] += 1
    if start <= calls[0] < start + count:
        captured.append((snapshot, now))
    return real(snapshot, now)
engine.decide = capture
e = experiment.prepare(trace, cluster, window=window, queues=queues, policies=policy)
experiment.run(e)
with open(out, "wb") as f:
    pickle.dump(captured, f, protocol=5)  # one pickle: views shared between snapshots stay shared
print(len(captured))
"""
)

DECIDE = (
    REDUCERS
    + """
import hashlib, pickle, sys
import gpupool.scheduler as scheduler
from gpupool.scheduler import decide
if not scheduler.NATIVE:
    raise SystemExit("this code's scheduler is not compiled: run its tools/build_native.py")
with open(sys.argv[1], "rb") as f:
    snapshots = pickle.load(f)
digest = hashlib.sha256()
for snapshot, now in snapshots:
    d = decide(snapshot, now)
    explained = sorted((k, v.code, v.message) for k, v in d.explanations.items())
    digest.update(repr((d.binds, d.evictions, explained, sorted(d.fair_shares.items()))).encode())
print(digest.hexdigest()[:12])
"""
)


def run(code: Path, script: str, *args: str, valgrind: list[str] | None = None) -> str:
    env = {**os.environ, "PYTHONPATH": str(code)}
    command = [*(valgrind or []), sys.executable, "-c", script, *args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{code}: {command[0]} failed:\n{done.stderr[-2000:]}")
    return done.stdout + done.stderr


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_replay_options(parser, NAME)
    parser.add_argument("--policy", default="gpupool")
    parser.add_argument("--start", type=int, default=8000, help="the first decide call captured (1-based)")
    parser.add_argument("--count", type=int, default=300, help="consecutive calls captured")
    parser.add_argument(
        "--profiles",
        type=Path,
        help="keep each code's callgrind profile here (read it with callgrind_annotate --inclusive=yes)",
    )
    args = parser.parse_args()
    if args.start < 1 or args.count < 1:
        raise SystemExit("--start and --count must be at least 1")
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    codes = replay_codes(args)
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="gpupool-replay-") as tmp:
        snapshots = Path(tmp) / "snapshots.pkl"
        window = (args.trace, args.window, args.cluster, args.queues, args.policy)
        got = int(
            run(codes[0], CAPTURE, *window, str(args.start), str(args.count), str(snapshots)).split()[-1]
        )
        if got == 0:
            raise SystemExit(f"the replay made fewer than {args.start} decide calls: lower --start")
        console.print(
            f"captured {got} consecutive calls of {args.policy} from call {args.start} ({codes[0]})"
        )
        if args.profiles is not None:
            args.profiles.mkdir(parents=True, exist_ok=True)
        for n, code in enumerate(codes):
            profile = "/dev/null" if args.profiles is None else str(args.profiles / f"callgrind.{n}")
            grind = [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={profile}",
                f"--toggle-collect={ENTRY}",
            ]
            output = run(code, DECIDE, str(snapshots), valgrind=grind)
            collected = re.search(r"Collected : (\d+)", output)
            if collected is None:
                raise SystemExit(f"{code}: callgrind reported no count:\n{output[-2000:]}")
            instructions = int(collected.group(1))
            digest = output.strip().splitlines()[0].split()[-1]
            rows[str(code)] = {"instructions": instructions, "per_call": instructions / got, "digest": digest}
            console.print(
                f"{instructions / got / 1e6:8.2f} M instructions a call  decisions {digest}  {code}"
            )
    first = rows[str(codes[0])]["instructions"]
    table = Table(title=f"{args.policy}, calls {args.start}..{args.start + got - 1} of {args.window}")
    for column in ("code", "M instructions a call", "vs first", "decisions"):
        table.add_column(column, justify="left" if column == "code" else "right")
    for code in codes:
        row = rows[str(code)]
        ratio = row["instructions"] / first
        table.add_row(str(code), f"{row['per_call'] / 1e6:.2f}", f"{ratio:.3f}", row["digest"])
    console.print(table)
    same = len({r["digest"] for r in rows.values()}) == 1
    console.print("decisions identical" if same else "[red]decisions DIFFER between codes[/red]")
    console.print(f"wrote {write_run(NAME, args, {'calls': got, 'codes': rows})}")


if __name__ == "__main__":
    main()
