"""The training run of the profile-guided build (`tools/build_native.py`): replays a synthetic trace.

gcc's profile-guided optimisation compiles the modules twice: once instrumented, then again laid out and
inlined after the branch and call counts that a representative run of the instrumented modules wrote.
This is that run. It needs no trace from outside the repository: it writes a seeded synthetic one (jobs of
1 to 32 GPUs, run times from a minute to two days, heavy-tailed as in GPU-cluster traces, five tenants of
unequal demand) and replays it through the compiled engine and scheduler under policies that between them
take every action: quotas with reclaim, preemption by attained-service band and consolidation
(`gpupool`), one pool by attained service (`las`), per-queue max-min (`drf`) and FIFO with backfill
(`fifo-backfill`). About 20 s on a 2-core box. It never trains on a trace that the benchmarks time.

    PYTHONPATH=src python tools/native_training.py      # what build_native.py runs
"""

from __future__ import annotations

import csv
import random
import sys
import tempfile
import time
from pathlib import Path

POLICIES = ("gpupool", "las", "drf", "fifo-backfill")
JOBS = 5000
CLUSTER = "24x8"
TENANTS = (("vision", 5.0), ("speech", 3.0), ("nlp", 2.0), ("research", 1.0), ("infra", 0.5))
SIZES = ((1, 60.0), (2, 10.0), (4, 10.0), (8, 12.0), (16, 5.0), (32, 3.0))  # GPUs, weight


def write_trace(path: Path, seed: int = 7) -> None:
    """A synthetic trace in the generic `csv` format: arrivals over about three days, busiest by day."""
    rng = random.Random(seed)
    names = [name for name, _ in TENANTS]
    weights = [weight for _, weight in TENANTS]
    gpus = [count for count, _ in SIZES]
    gpu_weights = [weight for _, weight in SIZES]
    t = 0.0
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["submit_time", "duration", "num_gpus", "queue"])
        for _ in range(JOBS):
            hour = (t / 3600.0) % 24
            t += rng.expovariate(1.0 / (40.0 if 8 <= hour < 20 else 90.0))
            duration = min(2 * 86400.0, 60.0 * rng.lognormvariate(2.5, 1.8))
            queue = rng.choices(names, weights)[0]
            writer.writerow([f"{t:.0f}", f"{duration:.0f}", rng.choices(gpus, gpu_weights)[0], queue])


def main() -> None:
    import gpupool.scheduler as scheduler
    import gpupool.sim as sim
    from gpupool.sim import experiment

    if not (scheduler.NATIVE and sim.NATIVE):
        raise SystemExit("native_training: the scheduler or the engine is not the compiled build")
    with tempfile.TemporaryDirectory(prefix="gpupool-training-") as tmp:
        trace = Path(tmp) / "synthetic.csv"
        write_trace(trace)
        for policy in POLICIES:
            began = time.process_time()
            e = experiment.prepare(f"csv:{trace}", CLUSTER, queues="auto", policies=policy)
            experiment.run(e)
            result = e.results[0]
            spent = time.process_time() - began
            print(
                f"native_training: {policy}: {len(result.jobs)} jobs, {result.cycles} cycles, "
                f"{e.metrics[policy]['preemptions']} preemptions, {spent:.1f} s"
            )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
