"""Eviction searches: the cheapest victims anywhere are found, and a node whose victims cannot beat the
search's pick is passed over without changing any decision (`EvictionSearch._cannot_beat`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from hypothesis import strategies as st

from gpupool.scheduler import decide
from gpupool.scheduler.snapshot import (
    GpuDemand,
    GpuView,
    NodeView,
    PodPlacement,
    QueueView,
    SchedulerConfig,
    Share,
    Snapshot,
    WorkloadView,
)
from tests.unit.scheduler.strategies import GB, NOW

ROOT = Path(__file__).resolve().parents[3]
CROWDED_SNAPSHOTS = 80


def _node(name: str, gpus: int = 8) -> NodeView:
    return NodeView(name, True, tuple(GpuView(k, "H100", 80 * GB) for k in range(gpus)), 224.0, 2000 * GB)


def test_reclaim_takes_the_job_that_loses_least_work_wherever_it_runs() -> None:
    """Six full nodes of one-GPU jobs of a queue with no quota; a queue with a quota asks for one GPU. The
    job started last (least work lost) is on the fifth node, after nodes whose jobs all lose more."""
    nodes = tuple(_node(f"n{i}") for i in range(1, 7))
    running = []
    for i, node in enumerate(nodes):
        for k in range(8):
            wid = i * 8 + k + 1
            started = 1000.0 + 10.0 * wid if node.name != "n5" or k != 3 else NOW - 60.0
            running.append(
                WorkloadView(
                    wid,
                    "big",
                    50,
                    started,
                    gpus=GpuDemand(1.0),
                    start_time=started,
                    placement=(PodPlacement(node.name, (k,)),),
                )
            )
    snapshot = Snapshot(
        nodes=nodes,
        pending=(WorkloadView(100, "hungry", 50, NOW - 1.0, gpus=GpuDemand(1.0)),),
        queues=(QueueView("hungry", gpu=Share(quota=8.0)), QueueView("big")),
        running=tuple(running),
        config=SchedulerConfig(blocking="skip"),
    )
    decisions = decide(snapshot, NOW)
    assert [(e.workload_id, e.code, e.for_workload) for e in decisions.evictions] == [(36, "reclaim", 100)]


@st.composite
def crowded(draw: st.DrawFn) -> Snapshot:
    """Several nodes full of single-pod work of queues above their shares (whole GPUs and fractions, mixed
    priorities, starts and checkpoints), and whole-GPU work pending in a queue below its quota and in the
    busy queues at a higher priority: reclaim and preempt search many nodes after their first pick."""
    nodes = tuple(
        _node(f"n{i + 1}", draw(st.sampled_from([4, 8, 8]))) for i in range(draw(st.integers(3, 14)))
    )
    running: list[WorkloadView] = []
    for node in nodes:
        k = 0
        while k < len(node.gpus):
            units = draw(st.sampled_from([0.5, *[1.0] * 8, 2.0, 2.0, 4.0]))
            if units > len(node.gpus) - k or draw(st.integers(0, 9)) == 0:
                k += 1  # a GPU left free
                continue
            wid = len(running) + 1
            started = float(draw(st.integers(0, int(NOW) - 600)))
            checkpoint = draw(st.sampled_from([None, None, 300.0, 3000.0]))
            count = max(1, int(units))
            running.append(
                WorkloadView(
                    wid,
                    draw(st.sampled_from(["big", "busy"])),
                    draw(st.sampled_from([10, 50, 50, 90])),
                    started,
                    gpus=GpuDemand(units),
                    start_time=started,
                    last_checkpoint_time=None if checkpoint is None else started + checkpoint,
                    placement=(PodPlacement(node.name, tuple(range(k, k + count)), min(units, 1.0)),),
                )
            )
            k += count
    pending = tuple(
        WorkloadView(
            1000 + i,
            draw(st.sampled_from(["hungry", "hungry", "big"])),
            draw(st.sampled_from([50, 95])),
            NOW - 100.0 + i,
            gpus=GpuDemand(draw(st.sampled_from([1.0, 1.0, 2.0, 4.0]))),
        )
        for i in range(draw(st.integers(2, 12)))
    )
    quota = float(draw(st.integers(1, sum(len(n.gpus) for n in nodes) // 2)))
    queues = (QueueView("hungry", gpu=Share(quota=quota)), QueueView("big"), QueueView("busy"))
    config = SchedulerConfig(
        blocking=draw(st.sampled_from(["skip", "backfill"])), ordering=draw(st.sampled_from(["fifo", "las"]))
    )
    return Snapshot(nodes=nodes, pending=pending, queues=queues, running=tuple(running), config=config)


def _decided_with_and_without_passing_over() -> dict[str, object]:
    """In a process running the scheduler's source (`GPUPOOL_PURE_PYTHON=1`): what `decide` gives on the
    crowded snapshots as it is, and with every node weighed (`_cannot_beat` answering no), and how often
    a node was passed over."""
    from gpupool.scheduler import evict_search
    from tests.unit.scheduler.native_digest import canonical, drawn_from

    snapshots = drawn_from(crowded(), CROWDED_SNAPSHOTS)
    search = evict_search.EvictionSearch
    passes = 0
    cannot_beat = search._cannot_beat

    def counted(*args: object) -> bool:
        nonlocal passes
        passed = cannot_beat(*args)  # type: ignore[arg-type]
        passes += passed
        return passed

    search._cannot_beat = counted  # type: ignore[method-assign]
    as_is = [canonical(decide(s, NOW)) for s in snapshots]
    search._cannot_beat = lambda *args: False  # type: ignore[method-assign]
    weighed = [canonical(decide(s, NOW)) for s in snapshots]
    search._cannot_beat = cannot_beat  # type: ignore[method-assign]
    evictions = sum(d.count("'reclaim'") + d.count("'preempt'") for d in as_is)
    return {"as_is": as_is, "weighed": weighed, "passes": passes, "evictions": evictions}


def test_passing_over_nodes_that_cannot_beat_the_pick_changes_no_decision() -> None:
    code = (
        "import json; from tests.unit.scheduler import test_evict_search as t; "
        "print(json.dumps(t._decided_with_and_without_passing_over()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "GPUPOOL_PURE_PYTHON": "1"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["passes"] >= 10 and found["evictions"] >= 50  # the snapshots do reach the case
    differing = [i for i, (a, b) in enumerate(zip(found["as_is"], found["weighed"], strict=True)) if a != b]
    assert not differing, (
        f"{len(differing)} snapshots decided otherwise; first: {found['as_is'][differing[0]]}"
    )
