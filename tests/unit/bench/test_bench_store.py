"""The head keeps a bounded history of bench results per node and series, on a real SQLite store."""

from __future__ import annotations

from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpupool.backends.agent_records import rank_log_path
from gpupool.bench import results
from gpupool.bench.results import result_line, summarize
from gpupool.control import bench
from gpupool.control.errors import Conflict, NotFound
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Gpu, Node, Workload
from gpupool.timeutil import utcnow
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
    book = bench.BenchBook(store)
    book.refresh()
    assert sorted((r["key"], r["figures"]["avg_busbw"]) for r in book.latest("node-1")) == [
        ("all_gather", 287.0),
        ("all_reduce", 500.0),
    ]
    assert [r["key"] for r in bench.history(store, node="node-1", latest=True)] == [
        "all_gather",
        "all_reduce",
    ]
    [other] = book.latest("node-2")
    assert other["gpu_model"] == "H100" and other["nodes"] == ["node-1", "node-2"]
    assert other["source"] == "job 4" and other["workload_id"] == 4


def test_a_result_for_an_unknown_node_is_refused_naming_the_nodes(store: Store) -> None:
    with pytest.raises(NotFound, match=r"no node named 'node-9' \(nodes: node-1, node-2\)"):
        bench.record(store, summarize(collective()), ["node-9"], source="cli", actor="admin")
    assert bench.history(store) == []


def test_the_default_history_is_fifty_results_per_series() -> None:
    assert results.HISTORY_PER_SERIES == bench.HISTORY_PER_SERIES == 50


def ended_bench_job(store: Store, tmp_path: Path, logs: dict[int, str], *, command: str) -> int:
    """A two-node job that ended two minutes ago, with the given text in each rank's log."""
    log_path = tmp_path / "logs" / "attempt-0.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    for rank, text in logs.items():
        rank_log_path(log_path, rank).write_text(text)
    ended = utcnow() - timedelta(minutes=2)
    with store.session() as s:
        w = Workload(name="bench", queue="default", spec={"commands": [command]}, nodes=2, state="succeeded",
                     finished_at=ended)  # fmt: skip
        s.add(w)
        s.flush()
        pods = [{"node": "node-1", "gpu_indices": [0]}, {"node": "node-2", "gpu_indices": [0]}]
        s.add(Attempt(workload_id=w.id, queue="default", number=0, state="succeeded", node_name="node-1",
                      pods=pods, log_path=str(log_path), finished_at=ended))  # fmt: skip
        return w.id


BENCH = "py -m gpupool.main bench {} --json out.json --emit-result"


def test_the_head_records_a_bench_jobs_results_for_the_nodes_its_ranks_ran_on(
    store: Store, tmp_path: Path
) -> None:
    from tests.unit.bench.test_results import gemm, gemm_row

    # gemm: each node its own result, found by the rank the line names even in one shared file (Slurm).
    shared = "\n".join(result_line(gemm(gemm_row("cuda:0", 64, float(r + 1))), r) for r in (0, 1))
    gemm_job = ended_bench_job(store, tmp_path / "g", {0: shared}, command=BENCH.format("gemm"))
    # collective: one result from global rank 0 for the gang.
    coll_job = ended_bench_job(store, tmp_path / "c", {0: result_line(collective(), 0), 1: "rank 1\n"},
                               command=BENCH.format("collective"))  # fmt: skip
    # a job that is not a bench job: its marker lines are not read.
    ended_bench_job(store, tmp_path / "o", {0: result_line(collective(), 0)}, command="echo hi")
    jobs = bench.JobResults(store)
    assert jobs.sweep() == 4
    assert jobs.sweep() == 0  # read once
    got = {(r["node"], r["kind"], r["workload_id"]): r for r in bench.history(store)}
    assert sorted(got) == [
        ("node-1", "collective", coll_job), ("node-1", "gemm", gemm_job),
        ("node-2", "collective", coll_job), ("node-2", "gemm", gemm_job),
    ]  # fmt: skip
    assert got[("node-2", "gemm", gemm_job)]["figures"]["best_tflops"] == 2.0
    assert got[("node-2", "collective", coll_job)]["nodes"] == ["node-1", "node-2"]
    assert bench.JobResults(store).sweep() == 0  # a restarted head does not record them again


def test_metrics_export_the_newest_result_of_every_series(store: Store) -> None:
    from tests.unit.bench.test_results import TRAIN, gemm, gemm_row

    book = bench.BenchBook(store)
    bench.record(store, summarize(gemm(gemm_row("cuda:0", 8192, 1.0))), ["node-1"], source="cli", actor="a")
    book.refresh()
    for report in (collective(), gemm(gemm_row("cuda:0", 8192, 700.0)), TRAIN):
        bench.record(store, summarize(report), ["node-1"], source="cli", actor="admin")
    book.refresh()  # reads only what was added since
    assert sorted(r["key"] for r in book.latest("node-1")) == ["all_reduce", "bf16", "bf16"]
    samples = {
        (m.name, s.labels.get("op") or s.labels.get("size") or s.labels.get("precision")): s.value
        for m in bench.metric_families(book.every_latest())
        for s in m.samples
        if s.labels["node"] == "node-1" and m.name != "gpupool_bench_result_timestamp_seconds"
    }
    assert samples == {
        ("gpupool_bench_busbw_gbps", "all_reduce"): 470.5,
        ("gpupool_bench_avg_busbw_gbps", "all_reduce"): 287.0,
        ("gpupool_bench_wrong", "all_reduce"): 0.0,
        ("gpupool_bench_gemm_tflops", "8192x8192x8192"): 700.0,
        ("gpupool_bench_gemm_fraction_of_peak", "8192x8192x8192"): pytest.approx(700.0 / 989.0),
        ("gpupool_bench_train_tokens_per_second", "bf16"): 65536.0,
        ("gpupool_bench_train_tflops_per_gpu", "bf16"): 400.0,
        ("gpupool_bench_train_mfu", "bf16"): pytest.approx(400.0 / 989.0),
    }


def test_a_nodes_bench_verdict_is_judged_again_when_its_results_change_or_age_out(store: Store) -> None:
    from gpupool.health.thresholds import parse_config

    config = parse_config({"thresholds": {"*": {"allreduce_gpus": 8}}, "bench": {"max_age": 100}})
    book = bench.BenchBook(store)
    slow = collective()
    slow["rows"][-1]["out_of_place"]["busbw"] = 300.0  # below H100's 460 GB/s
    bench.record(store, summarize(slow), ["node-1"], source="cli", actor="admin")
    book.refresh()
    measured = book.latest("node-1")[0]["measured_at_unix"]
    assert book.verdict("node-1", config, measured + 1).health == "warning"
    assert book.verdict("node-2", config, measured + 1).checks == ()  # no results: nothing judged
    assert book.verdict("node-1", config, measured + 101).checks == ()  # aged out
    bench.record(store, summarize(collective()), ["node-1"], source="cli", actor="admin")
    book.refresh()
    now = book.latest("node-1")[0]["measured_at_unix"] + 1
    assert book.verdict("node-1", config, now).health == "healthy"


def test_a_result_is_stored_at_the_time_it_was_measured_and_an_older_one_never_replaces_a_newer(
    store: Store,
) -> None:
    now = utcnow()

    def at(moment: datetime, busbw: float = 470.5) -> list[results.BenchSummary]:
        report = collective()
        report["rows"][-1]["out_of_place"]["busbw"] = busbw
        return summarize({**report, "measured_at": moment.isoformat()})

    [first] = bench.record(store, at(now - timedelta(hours=2), 300.0), ["node-1"], source="cli", actor="a")
    assert first["measured_at"] == (now - timedelta(hours=2)).isoformat()
    # an older file sent later (a passing one, say): refused, for every node named, and nothing stored
    with pytest.raises(Conflict, match=r"is before the newest collective all_reduce result of node node-1"):
        bench.record(store, at(now - timedelta(days=3)), ["node-2", "node-1"], source="file", actor="a")
    assert [r["id"] for r in bench.history(store)] == [first["id"]]
    # the same report again changes nothing and is taken; a newer one becomes the newest
    bench.record(store, at(now - timedelta(hours=2), 300.0), ["node-1"], source="file", actor="a")
    [newer] = bench.record(store, at(now - timedelta(hours=1)), ["node-1"], source="cli", actor="a")
    assert bench.history(store, node="node-1", latest=True)[0]["id"] == newer["id"]
    # a report from the future (a clock ahead) is taken as now, so it cannot block the results after it
    [ahead] = bench.record(store, at(now + timedelta(days=1)), ["node-1"], source="cli", actor="a")
    assert datetime.fromisoformat(ahead["measured_at"]) <= utcnow()
    # a report without measured_at (an older gpupool wrote it) is stored at the time it arrives
    [undated] = bench.record(store, summarize(collective()), ["node-1"], source="file", actor="a")
    assert datetime.fromisoformat(undated["measured_at"]) >= datetime.fromisoformat(ahead["measured_at"])
    # other nodes and series are their own: an old result is taken where nothing newer is
    [elsewhere] = bench.record(store, at(now - timedelta(days=3)), ["node-2"], source="file", actor="a")
    assert elsewhere["node"] == "node-2"


def test_a_bench_jobs_result_older_than_the_newest_is_logged_and_skipped(
    store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    newest = utcnow()
    bench.record(store, summarize({**collective(), "measured_at": newest.isoformat()}), ["node-1"],
                 source="cli", actor="a")  # fmt: skip
    old = {**collective(), "measured_at": (newest - timedelta(days=1)).isoformat()}
    ended_bench_job(store, tmp_path, {0: result_line(old, 0)}, command=BENCH.format("collective"))
    assert bench.JobResults(store).sweep() == 0
    assert "event=bench_result_refused" in caplog.text and "is before the newest" in caplog.text
    assert len(bench.history(store)) == 1
