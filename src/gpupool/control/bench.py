"""Bench results on the head: recorded per node (from `gpupool bench --record` and from bench jobs' logs),
kept as a bounded history per series, read back for `node show`, /metrics and the health checks.

A bench submitted with `gpupool bench ... --submit` prints its report as one marked line in its log
(gpupool.bench.results.RESULT_MARKER); when the job ends the head reads it from the attempt's rank logs,
which every backend delivers to the head, and records it for the node each rank ran on (gemm: every node
its own; collective and train: the gang's result, from global rank 0, for every node of the gang). No
credential is needed inside the job, and the node is the one the head placed the rank on.

A result is stored at the time its report says it was measured (`measured_at`; one from the future is
taken as now; a report without it, from before gpupool wrote it, at the time it arrives). A result measured
before the newest one of its series on a node is refused (409): the newest result is what the health
checks judge, and an old passing file sent again must never put back in service a node that a newer, slow
result drained.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, defer

from gpupool.backends.agent_records import rank_log_path
from gpupool.bench.results import (
    HISTORY_PER_SERIES,
    BenchResultError,
    BenchSummary,
    reports_in_log,
    summarize,
)
from gpupool.control.errors import Conflict, Invalid, NotFound
from gpupool.health.bench import judge
from gpupool.health.checks import Verdict
from gpupool.health.thresholds import HealthConfig
from gpupool.store.db import Store
from gpupool.store.models import BenchResult, Node, Workload
from gpupool.timeutil import as_utc, utcnow

log = logging.getLogger("gpupool.bench")

BENCH_COMMAND = "-m gpupool.main bench "  # what gpupool.bench.submit puts in a bench job's command
EMIT_FLAG = "--emit-result"
LOG_TAIL_BYTES = 4 << 20  # the result lines are at the end of a bench job's log
INGEST_LOOKBACK = timedelta(days=1)  # bench jobs that ended longer ago than this are not read at start
SETTLE = timedelta(seconds=2)  # a job's logs are read this long after it ended (agents ship the tail late)
SETTLE_MARGIN = timedelta(seconds=10)
GIVE_UP = 60.0  # seconds after it ended: a bench job whose logs still hold no result reported none


def result_view(row: BenchResult) -> dict[str, Any]:
    return {
        "id": row.id,
        "node": row.node_name,
        "kind": row.kind,
        "key": row.key,
        "gpu_model": row.gpu_model,
        "nodes": list(row.nodes or []),
        "workload_id": row.workload_id,
        "source": row.source,
        "actor": row.actor,
        "measured_at": (as_utc(row.measured_at) or utcnow()).isoformat(),
        "measured_at_unix": (as_utc(row.measured_at) or utcnow()).timestamp(),
        "parameters": row.parameters,
        "figures": row.figures,
    }


def _check_nodes(s: Session, names: Sequence[str], hint: str = "; name one with --node") -> dict[str, str]:
    """Each node's GPU model (its first GPU's; "" without GPUs); NotFound naming the nodes there are."""
    found = {n.name: n for n in s.scalars(select(Node).where(Node.name.in_(list(names))))}
    for name in names:
        if name not in found:
            known = ", ".join(s.scalars(select(Node.name).order_by(Node.name))) or "none"
            raise NotFound(f"no node named {name!r} (nodes: {known}){hint}", field="node")
    return {name: (found[name].gpus[0].model if found[name].gpus else "") for name in names}


def record(
    store: Store,
    summaries: Sequence[BenchSummary],
    nodes: Sequence[str],
    *,
    source: str,
    actor: str,
    workload_id: int | None = None,
    measured_together: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Store each series for each node at the time it was measured; keeps the newest HISTORY_PER_SERIES
    per (node, kind, key). Conflict, and nothing stored, when a series already has a newer result."""
    if not nodes:
        raise Invalid("node: give the node the bench ran on, e.g. node-1", field="node")
    together = list(measured_together or nodes)
    now = utcnow()
    with store.session() as s:
        models = _check_nodes(s, nodes)
        for name in nodes:
            for summary in summaries:
                _refuse_older(s, name, summary, min(summary.measured_at or now, now))
        rows = []
        for name in nodes:
            for summary in summaries:
                row = BenchResult(
                    node_name=name, kind=summary.kind, key=summary.key[:64], gpu_model=models[name],
                    nodes=together, workload_id=workload_id, source=source, actor=actor,
                    parameters=summary.parameters, figures=summary.figures, report=summary.report,
                    measured_at=min(summary.measured_at or now, now),
                )  # fmt: skip
                s.add(row)
                rows.append(row)
        s.flush()
        for name in nodes:
            for summary in summaries:
                _prune(s, name, summary.kind, summary.key[:64])
        views = [result_view(r) for r in rows]
    for v in views:
        log.info(
            "event=bench_recorded node=%s kind=%s key=%s source=%r figures=%r",
            v["node"], v["kind"], v["key"], v["source"], v["figures"],
        )  # fmt: skip
    return views


def _refuse_older(s: Session, node: str, summary: BenchSummary, at: datetime) -> None:
    """Conflict when `node`'s newest result of the series was measured after `at` (the same time is a
    report sent again: taken, it changes nothing)."""
    series = (
        BenchResult.node_name == node,
        BenchResult.kind == summary.kind,
        BenchResult.key == summary.key[:64],
    )
    newest = as_utc(
        s.scalar(select(BenchResult.measured_at).where(*series).order_by(BenchResult.id.desc()).limit(1))
    )
    if newest is None or newest <= at:
        return
    raise Conflict(
        f"report.measured_at: {at.isoformat()} is before the newest {summary.kind} {summary.key} result of "
        f"node {node} (measured {newest.isoformat()}); an older result cannot replace a newer one (it "
        f"could return a node that the newer result drained); `gpupool bench results {node} --history` "
        "lists them",
        field="report.measured_at",
    )


def _prune(s: Session, node: str, kind: str, key: str) -> None:
    series = (BenchResult.node_name == node, BenchResult.kind == kind, BenchResult.key == key)
    keep = select(BenchResult.id).where(*series).order_by(BenchResult.id.desc()).limit(HISTORY_PER_SERIES)
    s.execute(delete(BenchResult).where(*series, BenchResult.id.not_in(keep)))


def history(
    store: Store,
    *,
    node: str | None = None,
    kind: str | None = None,
    key: str | None = None,
    latest: bool = False,
    limit: int = HISTORY_PER_SERIES,
) -> list[dict[str, Any]]:
    """Results newest first; `latest`: only the newest of each (node, kind, key)."""
    with store.read() as s:
        if node is not None:
            _check_nodes(s, [node], hint="")
        query = select(BenchResult).options(defer(BenchResult.report))  # views never show the report
        if node is not None:
            query = query.where(BenchResult.node_name == node)
        if kind is not None:
            query = query.where(BenchResult.kind == kind)
        if key is not None:
            query = query.where(BenchResult.key == key)
        if latest:
            newest = select(func.max(BenchResult.id)).group_by(
                BenchResult.node_name, BenchResult.kind, BenchResult.key
            )
            query = query.where(BenchResult.id.in_(newest))
        rows = s.scalars(query.order_by(BenchResult.id.desc()).limit(limit)).all()
        return [result_view(r) for r in rows]


class BenchBook:
    """What the health loop and /metrics ask of bench results: newly ended bench jobs recorded, and the
    newest result of every series per node, kept in memory and read incrementally (rows are only ever
    added; pruning drops old rows of a series, never its newest)."""

    OVERLAP = 1000  # ids read again each time: a concurrent writer may commit a lower id after a higher one

    def __init__(self, store: Store) -> None:
        self.store = store
        self.jobs = JobResults(store)
        self._series: dict[tuple[str, str, str], dict[str, Any]] = {}
        self._latest: dict[str, list[dict[str, Any]]] = {}
        self._newest: int | None = None  # the highest id read; None: nothing read yet
        self._read: set[int] = set()  # ids read within OVERLAP of the newest
        # node -> (config, valid until (unix), verdict); dropped when the node's newest results change
        self._verdicts: dict[str, tuple[HealthConfig, float, Verdict]] = {}

    def refresh(self) -> None:
        """Never raises: a failed pass keeps the last results, so the health loop goes on judging."""
        try:
            self.jobs.sweep()
            self._read_new()
        except Exception:
            log.exception("event=bench_refresh_failed")

    def _read_new(self) -> None:
        with self.store.read() as s:
            newest = s.scalar(select(func.max(BenchResult.id)))
        if newest is None or newest == self._newest:
            return
        if self._newest is None:
            views = history(self.store, latest=True, limit=1 << 40)
            with self.store.read() as s:  # the older rows of the window need no reading either
                self._read = set(
                    s.scalars(select(BenchResult.id).where(BenchResult.id > newest - self.OVERLAP))
                )
        else:
            with self.store.read() as s:
                window = s.scalars(select(BenchResult.id).where(BenchResult.id > self._newest - self.OVERLAP))
                unread = [i for i in window if i not in self._read]
                rows = s.scalars(
                    select(BenchResult).options(defer(BenchResult.report)).where(BenchResult.id.in_(unread))
                ).all()
                views = [result_view(r) for r in rows]
        series = dict(self._series)
        for v in sorted(views, key=lambda v: int(v["id"])):
            here = (v["node"], v["kind"], v["key"])
            if here not in series or series[here]["id"] <= v["id"]:
                series[here] = v
        by_node: dict[str, list[dict[str, Any]]] = {}
        for v in series.values():
            by_node.setdefault(v["node"], []).append(v)
        self._series, self._latest = series, by_node
        for v in views:
            self._verdicts.pop(str(v["node"]), None)
        self._newest = max([newest, *(int(v["id"]) for v in views)])
        self._read = {
            i for i in (*self._read, *(int(v["id"]) for v in views)) if i > self._newest - self.OVERLAP
        }

    def latest(self, node: str) -> list[dict[str, Any]]:
        return self._latest.get(node, [])

    def verdict(self, node: str, config: HealthConfig, now: float) -> Verdict:
        """health.bench.judge of the node's newest results, judged again only when they change or one of
        them reaches `bench.max_age` (the health loop asks for every node every second)."""
        hit = self._verdicts.get(node)
        if hit is not None and hit[0] is config and now < hit[1]:
            return hit[2]
        results = self.latest(node)
        judged = judge(results, config, now)
        ages = [float(r["measured_at_unix"]) + config.bench.max_age for r in results]
        until = min([t for t in ages if t > now], default=math.inf) if config.bench.max_age else math.inf
        self._verdicts[node] = (config, until, judged)
        return judged

    def every_latest(self) -> list[dict[str, Any]]:
        return list(self._series.values())


# -- bench jobs ------------------------------------------------------------------------------------------


class JobResults:
    """Records the results of bench jobs once they end (the health loop calls `sweep` every second)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._since: datetime | None = None  # jobs that ended before this were read (or are too old)
        self._done: dict[int, datetime] = {}  # workload id -> when it ended, for jobs read since `_since`

    def sweep(self, now: datetime | None = None) -> int:
        """Read every newly ended bench job's logs and record what they report; returns results recorded."""
        now = now or utcnow()
        with self.store.read() as s:
            if self._since is None:
                self._since = now - INGEST_LOOKBACK
                read = s.scalars(
                    select(BenchResult.workload_id).where(BenchResult.workload_id.is_not(None)).distinct()
                )
                self._done = dict.fromkeys((int(w) for w in read if w is not None), now)
            ended = s.execute(
                select(Workload.id, Workload.spec, Workload.finished_at).where(
                    Workload.state.in_(("succeeded", "failed")),
                    Workload.finished_at >= self._since,
                    Workload.finished_at <= now - SETTLE,
                )
            ).all()
        recorded = 0
        waiting: list[datetime] = []
        for workload_id, spec, finished in ended:
            finished = as_utc(finished) or now
            if workload_id in self._done or not _is_bench_job(spec):
                continue
            try:
                found = self._ingest(workload_id)
            except Exception:  # one unreadable job must not stop the others; it is logged with its id
                log.exception("event=bench_ingest_failed workload=%s", workload_id)
                found = -1
            recorded += max(0, found)
            if found or (now - finished).total_seconds() > GIVE_UP:
                self._done[workload_id] = finished
            else:
                waiting.append(finished)  # its last log lines may not have reached the head yet
        # Rows commit a moment after their finished_at: look back a little further than the newest seen.
        self._since = min([*waiting, now - SETTLE]) - SETTLE_MARGIN
        self._done = {w: t for w, t in self._done.items() if t >= self._since}
        return recorded

    def _ingest(self, workload_id: int) -> int:
        with self.store.read() as s:
            workload = s.get(Workload, workload_id)
            if workload is None or not workload.attempts:
                return 0
            attempt = workload.attempts[-1]
            pods = attempt.pods or [{"node": attempt.node_name}]
            log_path = Path(attempt.log_path)
        gang = [str(p["node"]) for p in pods]
        recorded = 0
        for node, report in job_reports(log_path, gang):
            try:
                summaries = summarize(report)
            except BenchResultError as exc:
                log.warning(
                    "event=bench_result_refused workload=%s node=%s error=%r", workload_id, node, str(exc)
                )
                continue
            # gemm measures each node's own GPUs; a collective or training run measures the gang.
            targets = [node] if summaries[0].kind == "gemm" else gang
            try:
                recorded += len(
                    record(self.store, summaries, targets, source=f"job {workload_id}", actor="bench-job",
                           workload_id=workload_id, measured_together=gang)
                )  # fmt: skip
            except (NotFound, Conflict) as exc:  # the node left the pool since; a newer result is there
                log.warning("event=bench_result_refused workload=%s error=%r", workload_id, exc.message)
        return recorded


def job_reports(log_path: Path, gang: Sequence[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(node, report) for every result line (bench.results.result_line) in an attempt's rank logs on the
    head, in rank order; `gang` is the node of each rank. Health check jobs report this way too."""
    for rank in range(len(gang)):
        for said, report in reports_in_log(_tail(rank_log_path(log_path, rank))):
            # The rank the line names wins: a backend may write every node's output into one file.
            yield (gang[said] if said is not None and 0 <= said < len(gang) else gang[rank]), report


def _is_bench_job(spec: dict[str, Any]) -> bool:
    commands = spec.get("commands") or []
    return bool(commands) and BENCH_COMMAND in commands[0] and EMIT_FLAG in commands[0]


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - LOG_TAIL_BYTES))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# -- /metrics ------------------------------------------------------------------------------------------


def metric_families(results: Iterable[Mapping[str, Any]]) -> Iterator[Metric]:
    """The newest result of every series (BenchBook.every_latest) as gauges (docs/bench.md lists them)."""
    base = ["node", "gpu_model"]
    coll = [*base, "op", "dtype", "nranks", "backend"]
    busbw = GaugeMetricFamily(
        "gpupool_bench_busbw_gbps",
        "Collective bus bandwidth at the largest size measured (GB/s).",
        labels=coll,
    )
    avg = GaugeMetricFamily(
        "gpupool_bench_avg_busbw_gbps",
        "Collective bus bandwidth averaged over every size (GB/s).",
        labels=coll,
    )
    wrong = GaugeMetricFamily(
        "gpupool_bench_wrong", "Collective results that were wrong (#wrong).", labels=coll
    )
    gemm = GaugeMetricFamily(
        "gpupool_bench_gemm_tflops", "Each GPU's best matmul TFLOPS and the size (m x n x k) of it.",
        labels=[*base, "device", "dtype", "size"],
    )  # fmt: skip
    fraction = GaugeMetricFamily(
        "gpupool_bench_gemm_fraction_of_peak", "Matmul TFLOPS over the GPU model's dense peak.",
        labels=[*base, "device", "dtype", "size"],
    )  # fmt: skip
    train_labels = [*base, "precision", "parallel", "parameters", "world_size"]
    tokens = GaugeMetricFamily(
        "gpupool_bench_train_tokens_per_second", "GPT training tokens/s.", labels=train_labels
    )
    tflops = GaugeMetricFamily(
        "gpupool_bench_train_tflops_per_gpu", "GPT training TFLOP/s per GPU (Megatron-LM formula).",
        labels=train_labels,
    )  # fmt: skip
    mfu = GaugeMetricFamily(
        "gpupool_bench_train_mfu", "GPT training model FLOPs utilization.", labels=train_labels
    )
    when = GaugeMetricFamily(
        "gpupool_bench_result_timestamp_seconds", "When the newest result of the series was measured (unix).",
        labels=[*base, "kind", "key"],
    )  # fmt: skip
    for r in sorted(results, key=lambda r: int(r["id"])):
        p, f, key = r["parameters"], r["figures"], str(r["key"])
        head = [str(r["node"]), str(r["gpu_model"])]
        when.add_metric([*head, str(r["kind"]), key], float(r["measured_at_unix"]))
        if r["kind"] == "collective":
            labels = [
                *head,
                key,
                str(p.get("dtype", "")),
                str(p.get("nranks", "")),
                str(p.get("backend", "")),
            ]
            if f.get("busbw") is not None:
                busbw.add_metric(labels, float(f["busbw"]))
            avg.add_metric(labels, float(f.get("avg_busbw") or 0.0))
            wrong.add_metric(labels, float(f.get("wrong") or 0))
        elif r["kind"] == "gemm":
            best: dict[str, Mapping[str, Any]] = {}  # each GPU's best size: 8 series a node, not 8 x sizes
            for row in f.get("by_size") or []:
                if row["device"] not in best or row["tflops"] > best[row["device"]]["tflops"]:
                    best[row["device"]] = row
            for row in best.values():
                labels = [*head, str(row["device"]), str(p.get("dtype", key)), str(row["size"])]
                gemm.add_metric(labels, float(row["tflops"]))
                if row.get("fraction_of_peak") is not None:
                    fraction.add_metric(labels, float(row["fraction_of_peak"]))
        elif r["kind"] == "train":
            model = p.get("model") or {}
            labels = [*head, key, str(p.get("parallel", "")), str(model.get("parameters", "")),
                      str(p.get("world_size", ""))]  # fmt: skip
            tokens.add_metric(labels, float(f["tokens_per_s"]))
            tflops.add_metric(labels, float(f["tflops_per_gpu"]))
            if f.get("mfu") is not None:
                mfu.add_metric(labels, float(f["mfu"]))
    yield from (busbw, avg, wrong, gemm, fraction, tokens, tflops, mfu, when)
