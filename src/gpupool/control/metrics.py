"""Prometheus metrics of the head (`GET /metrics`): GPU series under dcgm-exporter's names, and gpupool's own.

GPU series carry dcgm-exporter's labels (`gpu`, `UUID`, `device`, `modelName`, `Hostname`) and nothing
else, so dashboards built for dcgm-exporter work unchanged and a series stays one series while jobs come and
go (an alert's `for:` and a counter's increase() span them). Who holds a GPU is its own series,
`gpupool_gpu_allocation_info` (one per holder: two for a GPU two fractional workloads share), to join on
(Hostname, gpu). Units are dcgm-exporter's: framebuffer in MiB, energy in mJ, clocks in MHz. Values are
read at scrape time from the telemetry cache and the store; the scheduler cycle histogram is observed by
the reconcile loop. The list with meanings is in docs/telemetry.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from gpupool.control import bench
from gpupool.control.autoscale import Word
from gpupool.control.budgets import BudgetState
from gpupool.control.health import HealthMonitor
from gpupool.control.health_judge import STALE_AFTER
from gpupool.control.lifecycle import PENDING, RUNNING, SERVICE, STATES
from gpupool.control.queues import list_queues
from gpupool.control.readiness import Readiness, word_on
from gpupool.control.retention import retired_gpu_hours
from gpupool.control.telemetry import TelemetryCache
from gpupool.control.usage import attempt_gpus
from gpupool.gpu.types import THROTTLE
from gpupool.scheduler import Explanation
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Gpu, Node, Workload
from gpupool.timeutil import as_utc

MIB = 1024 * 1024
GPU_LABELS = ("gpu", "UUID", "device", "modelName", "Hostname")  # the GPU's own, never its holder's
HOLDER_LABELS = ("Hostname", "gpu", "UUID", "workload", "queue", "user")  # one GPU and one holder
GPU_HOURS_REFRESH = 15.0  # seconds between recomputations of GPU-hours from the attempts
NODE_STATES = ("ready", "cordoned", "draining", "unhealthy", "lost")
HEALTH_STATES = ("healthy", "warning", "unhealthy", "unknown")
CYCLE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# (name, help, type, value of a sample row); gauges unless "counter"
# What a GPU that fell off the bus still exports: its counters as last read, its last Xid, that it is lost.
_KNOWN_WHEN_LOST = frozenset({"DCGM_FI_DEV_XID_ERRORS", "gpupool_gpu_lost"})
_GPU_SERIES: tuple[tuple[str, str, str, Callable[[dict[str, Any]], float | None]], ...] = (
    ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", "gauge", lambda s: s.get("utilization_pct")),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "Memory utilization (in %).",
        "gauge",
        lambda s: s.get("memory_copy_util_pct"),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        "gauge",
        lambda s: s["memory_used_bytes"] / MIB,
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        "gauge",
        lambda s: max(0, s["memory_total_bytes"] - s["memory_used_bytes"]) / MIB,
    ),
    ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", "gauge", lambda s: s.get("temperature_c")),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "Memory temperature (in C).",
        "gauge",
        lambda s: s.get("memory_temperature_c"),
    ),
    ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", "gauge", lambda s: s.get("power_w")),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "Total energy consumption since the sampler started (in mJ).",
        "counter",
        lambda s: float(s.get("energy_j", 0.0)) * 1000.0,
    ),
    ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", "gauge", lambda s: s.get("sm_clock_mhz")),
    ("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", "gauge", lambda s: s.get("mem_clock_mhz")),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        "gauge",
        lambda s: float((s.get("xid_errors") or [0])[-1]),
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "Total number of PCIe retries.",
        "counter",
        lambda s: s.get("pcie_replay_errors", 0),
    ),
    (
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        "Current clock throttle reasons (NVML bit mask).",
        "gauge",
        lambda s: float(sum(bit for bit, n in THROTTLE.items() if n in (s.get("throttle_reasons") or ()))),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "Total number of single-bit volatile ECC errors.",
        "counter",
        lambda s: s.get("ecc_corrected", 0),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        "counter",
        lambda s: s.get("ecc_uncorrected", 0),
    ),
    (
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        "counter",
        lambda s: s.get("ecc_corrected_aggregate", 0),
    ),
    (
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        "counter",
        lambda s: s.get("ecc_uncorrected_aggregate", 0),
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors.",
        "counter",
        lambda s: s.get("remapped_rows_correctable", 0),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors.",
        "counter",
        lambda s: s.get("remapped_rows_uncorrectable", 0),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "Whether remapping of rows has failed.",
        "gauge",
        lambda s: float(bool(s.get("remapped_rows_failure"))),
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        "Whether a row remap waits for a GPU reset.",
        "gauge",
        lambda s: float(bool(s.get("remapped_rows_pending"))),
    ),
    (
        "gpupool_gpu_nvlink_links_down",
        "NVLink links of the GPU not in the active state.",
        "gauge",
        lambda s: max(0, int(s.get("nvlink_links_total", 0)) - int(s.get("nvlink_links_up", 0))),
    ),
    (
        "gpupool_gpu_lost",
        "1 when the GPU stopped answering (fallen off the bus).",
        "gauge",
        lambda s: float(bool(s.get("lost"))),
    ),
)


class PoolCollector(Collector):
    """Builds every series at scrape time."""

    def __init__(
        self,
        store: Store,
        telemetry: TelemetryCache,
        health: HealthMonitor | None,
        fair_shares: Callable[[], dict[str, dict[str, float]]],
        explanations: Callable[[], Mapping[int, Explanation]] = dict,
        readiness: Callable[[], Mapping[int, Readiness]] = dict,
        autoscaling: Callable[[], Mapping[int, Word]] = dict,
        budgets: Callable[[], Mapping[str, BudgetState]] = dict,
    ) -> None:
        self.store, self.telemetry, self.health, self.fair_shares = store, telemetry, health, fair_shares
        self.budgets = budgets  # the loop's last count of each budgeted queue's GPU-hours this period
        self.autoscaling = autoscaling  # the autoscaler's last look at each service with `scaling`
        self.explanations = explanations  # the reconcile loop's latest reason for each pending workload
        self.readiness = readiness  # the readiness prober's last word on each running service with a probe
        self._gpu_hours: tuple[float, dict[str, float]] | None = None

    def describe(self) -> list[Metric]:
        return []  # collected at scrape time only (no registration-time scrape of the store)

    def collect(self) -> Iterator[Metric]:
        yield from self._gpus()
        yield from self._pool()
        if self.health is not None:  # the newest bench results per node, as the health loop read them
            yield from bench.metric_families(self.health.bench.every_latest())

    def _gpus(self) -> Iterator[Metric]:
        with self.store.read() as s:
            models = {(node, idx): (model, name, uuid) for node, idx, model, name, uuid in s.execute(
                select(Node.name, Gpu.index, Gpu.model, Gpu.product_name, Gpu.uuid)
                .join(Gpu, Gpu.node_id == Node.id)
            )}  # fmt: skip
            lost_nodes = set(s.scalars(select(Node.name).where(Node.state == "lost")))
            held = s.execute(
                select(Attempt.workload_id, Attempt.node_name, Attempt.gpu_indices, Attempt.gpu_fraction,
                       Attempt.pods, Workload.queue, Workload.user)
                .join(Workload, Attempt.workload_id == Workload.id)
                .where(Attempt.state == RUNNING)
            ).all()  # fmt: skip
        yield from _allocations(held, {key: uuid for key, (_, _, uuid) in models.items()})
        # dcgm-exporter types its cumulative fields (energy, ECC, PCIe replays, remapped rows) as counters
        # under names without `_total`; the Python client would append `_total` to a counter, so they are
        # exposed as gauges under dcgm-exporter's exact names (rate() and increase() read them the same).
        families = [GaugeMetricFamily(name, doc, labels=GPU_LABELS) for name, doc, _, _ in _GPU_SERIES]
        for (node, index), sample in sorted(self.telemetry.latest().items()):
            age = self.telemetry.age(node)
            if node in lost_nodes or age is None or age > STALE_AFTER:
                continue  # a node that stopped sending (lost): its last samples are not its GPUs now
            lost = bool(sample.get("lost"))
            model, product, _ = models.get((node, index), ("", "", ""))
            labels = {
                "gpu": str(index),
                "UUID": str(sample.get("uuid", "")),
                "device": f"nvidia{index}",
                "modelName": product or model,
                "Hostname": node,
            }
            for family, (name, _, kind, read) in zip(families, _GPU_SERIES, strict=True):
                if lost and kind == "gauge" and name not in _KNOWN_WHEN_LOST:
                    continue  # a GPU off the bus answers nothing: no made-up 0 C, 0 W, all memory free
                try:
                    value = read(sample)
                except (KeyError, TypeError, ValueError):
                    value = None
                if value is None:
                    continue
                family.add_metric([labels[k] for k in GPU_LABELS], float(value))
        yield from families

    def _pool(self) -> Iterator[Metric]:
        queues = list_queues(self.store, self.fair_shares(), self.explanations())
        quota = GaugeMetricFamily(
            "gpupool_queue_quota_gpus", "GPUs guaranteed to the queue.", labels=["queue"]
        )
        limit = GaugeMetricFamily(
            "gpupool_queue_limit_gpus", "Hard cap on the queue's GPUs (absent: none).", labels=["queue"]
        )
        share = GaugeMetricFamily(
            "gpupool_queue_fair_share_gpus", "GPUs the queue deserves now (water-filling).", labels=["queue"]
        )
        allocated = GaugeMetricFamily(
            "gpupool_queue_allocated_gpus", "GPUs the queue's running work holds.", labels=["queue"]
        )
        pending = GaugeMetricFamily(
            "gpupool_queue_pending_gpus", "GPUs the queue's pending work asks for.", labels=["queue"]
        )
        held_back = GaugeMetricFamily(
            "gpupool_queue_held_back_gpus",
            "GPUs of the queue's pending work that waits for a reason reclaiming from other queues cannot "
            "fix, so no fair share counts it (part of pending_gpus), by its reason code: held, dependency, "
            "array-limit (an array's %N), restart-backoff, user-limit, budget (spent), queue-limit (its own "
            "queue's), too-large or no-matching-gpu (a size or GPU model the pool cannot give).",
            labels=["queue"],
        )
        for q in queues:
            gpu = (q.get("resources") or {}).get("gpu") or {}
            quota.add_metric([q["name"]], float(gpu.get("quota") or 0.0))
            if gpu.get("limit") is not None:
                limit.add_metric([q["name"]], float(gpu["limit"]))
            share.add_metric([q["name"]], float((q.get("fair_share") or {}).get("gpu", 0.0)))
            allocated.add_metric([q["name"]], float(q["gpus_allocated"]))
            pending.add_metric([q["name"]], float(q["gpus_pending"]))
            held_back.add_metric([q["name"]], float(q["gpus_held_back"]))
        yield from (quota, limit, share, allocated, pending, held_back)

        workloads = GaugeMetricFamily(
            "gpupool_workloads", "Workloads by state and queue.", labels=["state", "queue"]
        )
        nodes = GaugeMetricFamily("gpupool_nodes", "Nodes by state.", labels=["state"])
        node_state = GaugeMetricFamily(
            "gpupool_node_state", "1 for the node's current state.", labels=["node", "state"]
        )
        waiting = GaugeMetricFamily(
            "gpupool_pending_workloads",
            "Pending workloads by queue and the reason code of why they wait (docs/scheduler.md).",
            labels=["queue", "reason"],
        )
        live = self.explanations()
        with self.store.read() as s:
            # every state of every queue, 0 included: an alert on "nothing running" needs the series
            by_state = {(state, q["name"]): 0 for q in queues for state in STATES}
            for state, queue, count in s.execute(
                select(Workload.state, Workload.queue, func.count()).group_by(Workload.state, Workload.queue)
            ):
                by_state[(state, queue)] = count
            for (state, queue), count in by_state.items():
                workloads.add_metric([state, queue], float(count))
            reasons: dict[tuple[str, str], int] = {}
            for wid, queue, stored in s.execute(
                select(Workload.id, Workload.queue, Workload.reason_code).where(Workload.state == PENDING)
            ):
                known = live.get(wid)
                key = (queue, known.code if known is not None else stored or "unexplained")
                reasons[key] = reasons.get(key, 0) + 1
            node_rows = s.execute(select(Node.name, Node.state, Node.state_reason).order_by(Node.name)).all()
            stopping_rows = s.execute(
                select(
                    Workload.queue,
                    Attempt.stop_reason,
                    Attempt.gpu_indices,
                    Attempt.gpu_fraction,
                    Attempt.pods,
                )
                .join(Attempt, Attempt.workload_id == Workload.id)
                .where(Attempt.state == RUNNING, Attempt.stop_requested_at.is_not(None))
            ).all()
            services = s.execute(
                select(Workload.id, Workload.name, Workload.queue, Workload.spec, Attempt.number)
                .join(Attempt, Attempt.workload_id == Workload.id)
                .where(Workload.kind == SERVICE, Workload.state == RUNNING, Attempt.state == RUNNING)
                .order_by(Workload.id)
            ).all()
        for (queue, reason), count in sorted(reasons.items()):
            waiting.add_metric([queue, reason], float(count))
        yield waiting
        yield _stopping(stopping_rows)
        ready = GaugeMetricFamily(
            "gpupool_service_ready",
            "1 while a running service's readiness probe passes (the head's proxy passes requests on), "
            "else 0; only services that declare a readiness_probe.",
            labels=["workload", "name", "queue"],
        )
        probed = self.readiness()
        for wid, name, queue, spec, attempt in services:
            if (spec or {}).get("readiness_probe"):
                up = word_on(probed, wid, attempt).ready
                ready.add_metric([str(wid), name, queue], 1.0 if up else 0.0)
        yield ready
        yield from self._autoscaled()
        yield from self._budgets()
        counts = dict.fromkeys(NODE_STATES, 0)
        for name, state, _ in node_rows:
            counts[state] = counts.get(state, 0) + 1
            node_state.add_metric([name, state], 1.0)
        for state, count in counts.items():
            nodes.add_metric([state], float(count))
        yield from (workloads, nodes, node_state)

        hours = Metric(
            "gpupool_gpu_hours", "GPU-hours used by each queue's attempts (running ones so far).", "counter"
        )
        for queue, value in sorted(self._hours().items()):
            hours.add_sample("gpupool_gpu_hours_total", {"queue": queue}, value)
        yield hours

        health = GaugeMetricFamily(
            "gpupool_node_health", "1 for the node's current health verdict.", labels=["node", "health"]
        )
        verdicts = Metric("gpupool_health_verdicts", "Changes of a node's health verdict.", "counter")
        failures = Metric(
            "gpupool_health_check_failures", "Findings that set a health verdict, by check.", "counter"
        )
        if self.health is not None:
            # judged with the state read above, as `gpupool nodes` judges it: the verdicts of a read of their
            # own could call a node unhealthy that this read found back in service (or the reverse)
            for name, state, reason in node_rows:
                health.add_metric([name, self.health.view(name, state, reason).get("health", "unknown")], 1.0)
            for (name, verdict), count in sorted(self.health.verdicts_total.items()):
                verdicts.add_sample(
                    "gpupool_health_verdicts_total", {"node": name, "health": verdict}, float(count)
                )
            for check, count in sorted(self.health.failed_checks_total.items()):
                failures.add_sample("gpupool_health_check_failures_total", {"check": check}, float(count))
        yield from (health, verdicts, failures)

    def _hours(self) -> dict[str, float]:
        now = time.time()
        if self._gpu_hours is not None and now - self._gpu_hours[0] < GPU_HOURS_REFRESH:
            return self._gpu_hours[1]
        hours: dict[str, float] = {}
        with self.store.read() as s:
            for queue, indices, fraction, pods, started, finished in s.execute(
                select(
                    Attempt.queue,
                    Attempt.gpu_indices,
                    Attempt.gpu_fraction,
                    Attempt.pods,
                    Attempt.started_at,
                    Attempt.finished_at,
                )
            ):
                start, end = as_utc(started), as_utc(finished)
                if start is None:
                    continue
                seconds = max(0.0, (end.timestamp() if end else now) - start.timestamp())
                gpu_hours = attempt_gpus(indices, fraction, pods) * seconds / 3600.0
                hours[queue] = hours.get(queue, 0.0) + gpu_hours
            for queue, retired in retired_gpu_hours(s).items():  # deleted workloads' (control/retention.py)
                hours[queue] = hours.get(queue, 0.0) + retired
        self._gpu_hours = (now, hours)
        return hours

    def _autoscaled(self) -> Iterator[Metric]:
        load = GaugeMetricFamily(
            "gpupool_service_load",
            "A service's load through the head's proxy over its scaling window, as its autoscaler measured "
            "it: requests per second (metric rps) or requests in flight (metric concurrency).",
            labels=["workload", "name", "queue", "metric"],
        )
        replicas = GaugeMetricFamily(
            "gpupool_service_replicas",
            "An autoscaled service's replicas: wanted (ceil(load / target), within its range), the count "
            "(pending or running, not stopping), and its range's min and max.",
            labels=["workload", "name", "queue", "kind"],
        )
        words = sorted(self.autoscaling().items())
        queues: dict[int, str] = {}
        if words:
            with self.store.read() as s:
                ids = [wid for wid, _ in words]
                queues = {wid: queue for wid, queue in s.execute(
                    select(Workload.id, Workload.queue).where(Workload.id.in_(ids))
                )}  # fmt: skip
        for wid, word in words:
            if wid not in queues:
                continue  # deleted since the autoscaler's last look
            labels = [str(wid), word.name, queues[wid]]
            load.add_metric([*labels, word.metric], word.load)
            for kind, value in (("wanted", word.wanted), ("count", word.replicas), ("min", word.min),
                                ("max", word.max)):  # fmt: skip
                replicas.add_metric([*labels, kind], float(value))
        yield from (load, replicas)

    def _budgets(self) -> Iterator[Metric]:
        limit = GaugeMetricFamily(
            "gpupool_queue_budget_gpu_hours",
            "A queue's GPU-hour budget for its current period (day, week or month, UTC).",
            labels=["queue", "period"],
        )
        used = GaugeMetricFamily(
            "gpupool_queue_budget_used_gpu_hours",
            "GPU-hours the queue and the queues below it used in its budget's current period, as the "
            "control loop last counted them (every 10 s); at or above the budget, its new work waits.",
            labels=["queue", "period"],
        )
        for name, budget in sorted(self.budgets().items()):
            limit.add_metric([name, budget.period], budget.gpu_hours)
            used.add_metric([name, budget.period], budget.used)
        yield from (limit, used)


class Metrics:
    """One registry per server: the scrape-time collector and the scheduler cycle histogram."""

    def __init__(
        self,
        store: Store,
        telemetry: TelemetryCache,
        health: HealthMonitor | None,
        fair_shares: Callable[[], dict[str, dict[str, float]]],
        explanations: Callable[[], Mapping[int, Explanation]] = dict,
        readiness: Callable[[], Mapping[int, Readiness]] = dict,
        autoscaling: Callable[[], Mapping[int, Word]] = dict,
        budgets: Callable[[], Mapping[str, BudgetState]] = dict,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.cycle_seconds = Histogram(
            "gpupool_scheduler_cycle_seconds",
            "Duration of one scheduling pass of the reconcile loop (snapshot, decide, apply).",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "gpupool_api_rate_limited",
            "API calls refused (429) because their token was over its rate limit (docs/operations.md).",
            ["token"],
            registry=self.registry,
        )
        self.registry.register(
            PoolCollector(
                store, telemetry, health, fair_shares, explanations, readiness, autoscaling, budgets
            )
        )


def _allocations(rows: Iterable[Any], uuids: Mapping[tuple[str, int], str]) -> Iterator[Metric]:
    """Who holds each GPU, one series per GPU and holder, from the running attempts (every pod of a gang):
    kube-state-metrics' *_info pattern, so the GPU's own series keep their identity when its holder changes.
    """
    info = GaugeMetricFamily(
        "gpupool_gpu_allocation_info",
        "1 for each workload holding the GPU (two for a GPU two fractional workloads share); join it to a "
        "GPU series on (Hostname, gpu), this series on the many side.",
        labels=HOLDER_LABELS,
    )
    fraction = GaugeMetricFamily(
        "gpupool_gpu_allocation_fraction",
        "The part of the GPU the workload holds (1 for a whole GPU, 0.5 for half of it).",
        labels=HOLDER_LABELS,
    )
    parts: dict[tuple[str, int, int, str, str], float] = {}
    for wid, node, indices, gpu_fraction, pods, queue, user in rows:
        for pod in pods or [{"node": node, "gpu_indices": indices, "gpu_fraction": gpu_fraction}]:
            for index in pod.get("gpu_indices") or ():
                key = (str(pod.get("node") or node), int(index), int(wid), str(queue), str(user))
                parts[key] = parts.get(key, 0.0) + float(pod.get("gpu_fraction") or 1.0)
    for (node, index, wid, queue, user), part in sorted(parts.items()):
        labels = [node, str(index), uuids.get((node, index), ""), str(wid), queue, user]
        info.add_metric(labels, 1.0)
        fraction.add_metric(labels, part)
    yield from (info, fraction)


def _stopping(rows: Iterable[Any]) -> GaugeMetricFamily:
    """GPUs held by running work asked to stop, by queue and why (an eviction's code, or the attempt's other
    stop reasons): how much is being released now, what `max_stopping_gpus` bounds for preempt, reclaim
    and consolidate."""
    family = GaugeMetricFamily(
        "gpupool_stopping_gpus",
        "GPUs held by running work asked to stop, by queue and why it stops (preempt, reclaim, consolidate, "
        "stale-gang, cancelled, max_duration, drain, held, requeue); scheduling.yaml's max_stopping_gpus "
        "bounds those stopped for waiting work.",
        labels=["queue", "reason"],
    )
    gpus: dict[tuple[str, str], float] = {}
    for queue, reason, indices, fraction, pods in rows:
        key = (queue, reason or "unknown")
        gpus[key] = gpus.get(key, 0.0) + attempt_gpus(indices, fraction, pods)
    for (queue, reason), value in sorted(gpus.items()):
        family.add_metric([queue, reason], value)
    return family
