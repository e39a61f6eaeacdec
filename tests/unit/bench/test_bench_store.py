"""The head keeps a bounded history of bench results per node and series, on a real SQLite store."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.bench import results
from gpupool.bench.results import summarize
from gpupool.control import bench
from gpupool.control.errors import NotFound
from gpupool.store.db import Store
from gpupool.store.models import Gpu, Node
from tests.unit.bench.test_results import collective


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path / 'gpupool.db'}")
    with s.session() as session:
        for name in ("node-1", "node-2"):
            node = Node(name=name)
            node.gpus = [Gpu(index=0, uuid=f"GPU-{name}", model="H100")]
            session.add(node)
    return s


def test_history_is_bounded_per_series_and_latest_is_the_newest_of_each(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bench, "HISTORY_PER_SERIES", 3)
    for busbw in (100.0, 200.0, 300.0, 400.0, 500.0):
        report = collective()
        report["avg_busbw"] = busbw
        bench.record(store, summarize(report), ["node-1"], source="cli", actor="admin")
    bench.record(store, summarize(collective("all_gather")), ["node-1", "node-2"], source="job 4",
                 actor="bench-job", workload_id=4)  # fmt: skip
    kept = bench.history(store, node="node-1", key="all_reduce")
    assert [r["figures"]["avg_busbw"] for r in kept] == [500.0, 400.0, 300.0]  # the oldest two dropped
    latest = bench.latest_by_node(store)
    assert sorted((r["key"], r["figures"]["avg_busbw"]) for r in latest["node-1"]) == [
        ("all_gather", 287.0),
        ("all_reduce", 500.0),
    ]
    [other] = latest["node-2"]
    assert other["gpu_model"] == "H100" and other["nodes"] == ["node-1", "node-2"]
    assert other["source"] == "job 4" and other["workload_id"] == 4


def test_a_result_for_an_unknown_node_is_refused_naming_the_nodes(store: Store) -> None:
    with pytest.raises(NotFound, match=r"no node named 'node-9' \(nodes: node-1, node-2\)"):
        bench.record(store, summarize(collective()), ["node-9"], source="cli", actor="admin")
    assert bench.history(store) == []


def test_the_default_history_is_fifty_results_per_series() -> None:
    assert results.HISTORY_PER_SERIES == bench.HISTORY_PER_SERIES == 50
