"""Scheduler scenario files (YAML) -> a `Snapshot`, a `now` and the expected outcome.

The format is documented in the header of `test_scenarios.py`, which runs every file in `scenarios/`.
Every unknown key, missing field or unreadable value raises `ScenarioError` naming the file and the field,
so a typo in a scenario fails loudly instead of silently testing something else.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from fractions import Fraction
from pathlib import Path
from typing import Any

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
from gpupool.spec import PRIORITY_CLASSES, SpecError, parse_duration, parse_gpu_request, parse_size
from gpupool.spec.document import load_yaml

GB = 1_000_000_000

# GPU memory a node's GPUs have when the file does not say (`gpu_memory:`), by model.
DEFAULT_GPU_MEMORY = {
    "B200": 180 * GB,
    "H200": 141 * GB,
    "H100": 80 * GB,
    "A100": 80 * GB,
    "L40S": 48 * GB,
    "L4": 24 * GB,
    "A10": 24 * GB,
    "T4": 16 * GB,
    "V100": 32 * GB,
}
FALLBACK_GPU_MEMORY = 80 * GB
DEFAULT_NODE_CPUS = 64.0
DEFAULT_NODE_MEMORY = 1000 * GB
DEFAULT_PRIORITY = PRIORITY_CLASSES["train"]
DEFAULT_QUEUE = "q"

SCHEDULABLE_STATES = frozenset({"ready"})
NODE_STATES = frozenset({"ready", "cordoned", "draining", "unhealthy", "lost"})

_TOP_KEYS = frozenset({"description", "now", "config", "nodes", "queues", "running", "pending", "expect"})
_NODE_KEYS = frozenset(
    {
        "name",
        "count",
        "gpus",
        "model",
        "gpu_memory",
        "islands",
        "cpus",
        "memory",
        "labels",
        "state",
        "schedulable",
        "foreign",
    }
)
_QUEUE_KEYS = frozenset(
    {
        "name",
        "parent",
        "priority",
        "gpu",
        "cpu",
        "memory",
        "ordering",
        "min_runtime_preempt",
        "min_runtime_reclaim",
        "usage",
    }
)
_SHARE_KEYS = frozenset({"quota", "limit", "weight"})
_WORKLOAD_KEYS = frozenset(
    {
        "id",
        "queue",
        "priority",
        "submit",
        "nodes",
        "gpus",
        "cpus",
        "memory",
        "preemptible",
        "topology",
        "topology_preferred",
        "only_on",
        "max_duration",
        "attained",
        "estimate",
    }
)
_RUNNING_KEYS = _WORKLOAD_KEYS | {"on", "start", "checkpoint", "stopping", "evicted_for"}
_PENDING_KEYS = _WORKLOAD_KEYS | {"victims_stopped", "nominated"}
_EXPECT_KEYS = frozenset({"binds", "evictions", "reasons", "fair_share", "released_to", "nominated"})
_CONFIG_FIELDS = {f.name for f in fields(SchedulerConfig)}
_COMPARISON = re.compile(r"^\s*(>=|<=|>|<|==|~)?\s*(.+?)\s*$")
_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


class ScenarioError(ValueError):
    """A scenario file that cannot be read; the message names the file and the field."""


@dataclass(frozen=True, slots=True)
class PodWhere:
    """Where one expected pod lands: a node, and optionally the exact GPU indices."""

    node: str
    gpus: tuple[int, ...] | None = None


@dataclass(frozen=True, slots=True)
class Condition:
    """One check of a number: `op` is one of ~ (equal within 1e-6), >, <, >=, <=."""

    op: str
    value: float

    def holds(self, x: float) -> bool:
        tolerance = 1e-6
        if self.op == "~":
            return abs(x - self.value) <= tolerance
        if self.op == ">":
            return x > self.value + tolerance
        if self.op == "<":
            return x < self.value - tolerance
        if self.op == ">=":
            return x >= self.value - tolerance
        return x <= self.value + tolerance

    def __str__(self) -> str:
        return f"{'' if self.op == '~' else self.op}{self.value:g}"


@dataclass(frozen=True, slots=True)
class Expectations:
    """What a scenario asserts; a None field (key absent from the file) is not checked."""

    binds: dict[int, tuple[PodWhere, ...] | None] | None = None  # exact set; None value = anywhere
    evictions: dict[int, tuple[str, int | None]] | None = None  # exact set: code and optional beneficiary
    reasons: dict[int, str] | None = None  # only the listed workloads are checked
    fair_share: dict[str, dict[str, tuple[Condition, ...]]] | None = None  # queue -> resource -> checks
    released_to: dict[int, int] | None = None  # exact: stopping (or evicted) work -> the one promised it
    nominated: dict[int, tuple[PodWhere, ...] | None] | None = None  # exact set, as binds: waiting -> room


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    now: float
    snapshot: Snapshot
    expect: Expectations


def load_scenario(path: Path) -> Scenario:
    """Read one scenario file."""
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), "description: ...")
    except SpecError as exc:
        raise ScenarioError(f"{path.name}: {exc}") from None
    return parse_scenario(data, path.stem)


def parse_scenario(data: object, name: str) -> Scenario:
    """Build a scenario from already-loaded YAML data; `name` appears in every error."""
    top = _mapping(data, name, "<scenario>", _TOP_KEYS)
    where = _Where(name)
    description = top.get("description")
    if not isinstance(description, str) or not description.strip():
        raise where.error(
            "description", description, "every scenario needs one sentence saying what it proves"
        )
    now = where.number("now", top.get("now", 0))
    config = _config(top.get("config"), where)
    nodes = _nodes(top.get("nodes"), where)
    running = tuple(
        _workload(item, where.at(f"running[{i}]"), True)
        for i, item in enumerate(_list(top.get("running"), where, "running"))
    )
    pending = tuple(
        _workload(item, where.at(f"pending[{i}]"), False)
        for i, item in enumerate(_list(top.get("pending"), where, "pending"))
    )
    queues = _queues(top.get("queues"), running + pending, where)
    _check_ids(running, pending, where)
    _check_placements(running, nodes, where)
    nominated = _nominated(_list(top.get("pending"), where, "pending"), pending, where)
    snapshot = Snapshot(
        nodes=nodes, pending=pending, queues=queues, running=running, config=config, nominated=nominated
    )
    expect = _expectations(top.get("expect"), where)
    _check_expected_ids(expect, running, pending, queues, where)
    return Scenario(name=name, description=description.strip(), now=now, snapshot=snapshot, expect=expect)


# --- small readers --------------------------------------------------------------------------------


class _Where:
    """The file and field path an error should name."""

    def __init__(self, file: str, path: str = "") -> None:
        self.file = file
        self.path = path

    def at(self, field: str) -> _Where:
        return _Where(self.file, f"{self.path}.{field}" if self.path else field)

    def error(self, field: str, value: object, message: str) -> ScenarioError:
        full = f"{self.path}.{field}" if self.path and field else (self.path or field)
        return ScenarioError(f"{self.file}: {full} = {value!r}: {message}")

    def number(self, field: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(field, value, "must be a number")
        return float(value)

    def seconds(self, field: str, value: object) -> float:
        try:
            return parse_duration(value, field)  # type: ignore[arg-type]
        except SpecError as exc:
            raise self.error(
                field, value, f"must be seconds or a duration like '10m' ({exc.message})"
            ) from None

    def size(self, field: str, value: object) -> int:
        try:
            return parse_size(value, field)  # type: ignore[arg-type]
        except SpecError as exc:
            raise self.error(field, value, f"must be bytes or a size like '80GB' ({exc.message})") from None

    def text(self, field: str, value: object) -> str:
        if isinstance(value, bool) or not isinstance(value, str | int) or not str(value).strip():
            raise self.error(field, value, "must be a name")
        return str(value).strip()

    def flag(self, field: str, value: object) -> bool:
        if not isinstance(value, bool):
            raise self.error(field, value, "must be true or false")
        return value


def _names(data: object, at: _Where) -> list[str]:
    if not isinstance(data, list) or not all(isinstance(n, str) and n for n in data):
        raise at.error("only_on", data, "must be a list of node names, e.g. [n1, n2]")
    return data


def _mapping(data: object, file: str, field: str, allowed: frozenset[str]) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{file}: {field} must be a mapping, not {data!r}")
    unknown = sorted(str(k) for k in data if k not in allowed)
    if unknown:
        raise ScenarioError(f"{file}: {field} has unknown key(s) {unknown}; known: {sorted(allowed)}")
    return dict(data)


def _list(data: object, where: _Where, field: str) -> list[Any]:
    if data is None:
        return []
    if not isinstance(data, list):
        raise where.error(field, data, "must be a list")
    return data


# SchedulerConfig fields that default to None and are numbers when given
_OPTIONAL_NUMBERS = frozenset({"max_stopping_gpus"})


def _config(data: object, where: _Where) -> SchedulerConfig:
    if data is None:
        return SchedulerConfig()
    raw = _mapping(data, where.file, "config", frozenset(_CONFIG_FIELDS))
    values: dict[str, Any] = {}
    for key, value in raw.items():
        default = getattr(SchedulerConfig(), key)
        if isinstance(default, tuple):
            values[key] = tuple(value)
        elif isinstance(default, bool):
            values[key] = where.at("config").flag(key, value)
        elif isinstance(default, int | float) or key in _OPTIONAL_NUMBERS:
            number = where.at("config").number(key, value)
            values[key] = int(number) if isinstance(default, int) else number
        else:
            values[key] = where.at("config").text(key, value)
    return SchedulerConfig(**values)


# --- nodes ----------------------------------------------------------------------------------------


def _nodes(data: object, where: _Where) -> tuple[NodeView, ...]:
    items = _list(data, where, "nodes")
    if not items:
        raise where.error("nodes", data, "a scenario needs at least one node")
    nodes: list[NodeView] = []
    for i, item in enumerate(items):
        at = where.at(f"nodes[{i}]")
        raw = _mapping(item, where.file, at.path, _NODE_KEYS)
        name = at.text("name", raw.get("name"))
        count = raw.get("count")
        if count is None:
            nodes.append(_node(name, raw, at))
            continue
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise at.error("count", count, "must be a whole number >= 1 (expands name into name1..nameN)")
        nodes.extend(_node(f"{name}{k}", raw, at) for k in range(1, count + 1))
    names = [n.name for n in nodes]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise where.error("nodes", duplicates, "node names must be unique")
    return tuple(nodes)


def _node(name: str, raw: dict[str, Any], at: _Where) -> NodeView:
    count = raw.get("gpus", 8)
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise at.error("gpus", count, "must be a whole number of GPUs")
    model = at.text("model", raw.get("model", "H100")).upper()
    memory = (
        at.size("gpu_memory", raw["gpu_memory"])
        if "gpu_memory" in raw
        else DEFAULT_GPU_MEMORY.get(model, FALLBACK_GPU_MEMORY)
    )
    islands = _islands(raw.get("islands"), count, at)
    foreign = _foreign(raw.get("foreign"), count, at)
    state = at.text("state", raw.get("state", "ready"))
    if state not in NODE_STATES:
        raise at.error("state", state, f"must be one of {sorted(NODE_STATES)}")
    schedulable = (
        at.flag("schedulable", raw["schedulable"]) if "schedulable" in raw else state in SCHEDULABLE_STATES
    )
    labels = raw.get("labels") or {}
    if not isinstance(labels, Mapping):
        raise at.error("labels", labels, "must be a mapping like {rack: r1}")
    return NodeView(
        name=name,
        schedulable=schedulable,
        gpus=tuple(GpuView(k, model, memory, islands[k], foreign.get(k, 0.0)) for k in range(count)),
        cpus=at.number("cpus", raw.get("cpus", DEFAULT_NODE_CPUS)),
        memory_bytes=at.size("memory", raw["memory"]) if "memory" in raw else DEFAULT_NODE_MEMORY,
        state=state,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
    )


def _islands(data: object, count: int, at: _Where) -> list[int]:
    if data is None:
        return [0] * count
    if isinstance(data, int) and not isinstance(data, bool) and data >= 1:
        return [k // data for k in range(count)]  # `islands: 4` = NVLink islands of 4 GPUs each
    if isinstance(data, list) and len(data) == count and all(isinstance(x, int) for x in data):
        return list(data)
    raise at.error("islands", data, f"must be an island size (4) or one island number per GPU ({count})")


def _foreign(data: object, count: int, at: _Where) -> dict[int, float]:
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise at.error("foreign", data, "must map GPU index to the fraction used outside the scheduler")
    out: dict[int, float] = {}
    for k, v in data.items():
        if not isinstance(k, int) or not 0 <= k < count:
            raise at.error("foreign", k, f"is not a GPU index 0..{count - 1}")
        fraction = at.number(f"foreign.{k}", v)
        if not 0 <= fraction <= 1:
            raise at.error(f"foreign.{k}", v, "must be a fraction 0..1")
        out[k] = fraction
    return out


# --- queues ---------------------------------------------------------------------------------------


def _queues(data: object, workloads: tuple[WorkloadView, ...], where: _Where) -> tuple[QueueView, ...]:
    if data is None:
        # No `queues:` at all: every queue a workload names exists with default fields.
        return tuple(QueueView(name) for name in sorted({w.queue for w in workloads}))
    queues: list[QueueView] = []
    for i, item in enumerate(_list(data, where, "queues")):
        at = where.at(f"queues[{i}]")
        raw = _mapping(item, where.file, at.path, _QUEUE_KEYS)
        queues.append(
            QueueView(
                name=at.text("name", raw.get("name")),
                parent=at.text("parent", raw["parent"]) if raw.get("parent") is not None else None,
                priority=int(at.number("priority", raw.get("priority", 0))),
                gpu=_share(raw.get("gpu"), at.at("gpu"), sizes=False),
                cpu=_share(raw.get("cpu"), at.at("cpu"), sizes=False),
                memory=_share(raw.get("memory"), at.at("memory"), sizes=True),
                ordering=at.text("ordering", raw["ordering"]) if raw.get("ordering") is not None else None,
                min_runtime_preempt=_optional_seconds(raw, "min_runtime_preempt", at),
                min_runtime_reclaim=_optional_seconds(raw, "min_runtime_reclaim", at),
                usage=at.number("usage", raw.get("usage", 0.0)),
            )
        )
    names = {q.name for q in queues}
    if len(names) != len(queues):
        raise where.error("queues", [q.name for q in queues], "queue names must be unique")
    for q in queues:
        if q.parent is not None and q.parent not in names:
            raise where.error("queues", q.parent, f"queue {q.name}'s parent is not declared")
    parents = {q.parent for q in queues}
    for w in workloads:
        if w.queue not in names:
            raise where.error("queue", w.queue, f"workload {w.id} names a queue that is not declared")
        if w.queue in parents:
            raise where.error("queue", w.queue, f"workload {w.id} is in a parent queue; use a leaf")
    return tuple(queues)


def _share(data: object, at: _Where, *, sizes: bool) -> Share:
    def amount(field: str, value: object) -> float:
        return float(at.size(field, value)) if sizes and isinstance(value, str) else at.number(field, value)

    if data is None:
        return Share()
    if not isinstance(data, Mapping):
        return Share(quota=amount("", data))  # `gpu: 4` is a quota of 4
    raw = _mapping(data, at.file, at.path, _SHARE_KEYS)
    return Share(
        quota=amount("quota", raw.get("quota", 0.0)),
        limit=amount("limit", raw["limit"]) if raw.get("limit") is not None else None,
        weight=at.number("weight", raw.get("weight", 1.0)),
    )


def _optional_seconds(raw: dict[str, Any], key: str, at: _Where) -> float | None:
    return at.seconds(key, raw[key]) if raw.get(key) is not None else None


# --- workloads ------------------------------------------------------------------------------------


def _workload(item: object, at: _Where, running: bool) -> WorkloadView:
    raw = _mapping(item, at.file, at.path, _RUNNING_KEYS if running else _PENDING_KEYS)
    wid = raw.get("id")
    if isinstance(wid, bool) or not isinstance(wid, int):
        raise at.error("id", wid, "every workload needs a whole-number id")
    pods = _pods(raw.get("on"), at) if running else ()
    if running and not pods:
        raise at.error("on", raw.get("on"), "a running workload needs `on: {node: [gpu indices]}`")
    demand = _gpu_demand(raw, pods, at)
    nodes = raw.get("nodes", len(pods) if running else 1)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise at.error("nodes", nodes, "must be a whole number of pods >= 1")
    if running and nodes != len(pods):
        raise at.error("nodes", nodes, f"but `on` places {len(pods)} pod(s)")
    fraction = demand.count if demand.is_fractional else 1.0
    placement = tuple(PodPlacement(node, gpus, fraction) for node, gpus in pods)
    start = at.number("start", raw.get("start", 0.0)) if running else None
    return WorkloadView(
        id=wid,
        queue=at.text("queue", raw.get("queue", DEFAULT_QUEUE)),
        priority=_priority(raw.get("priority", DEFAULT_PRIORITY), at),
        submit_time=at.number("submit", raw.get("submit", start if start is not None else wid)),
        nodes=nodes,
        gpus=demand,
        cpus=at.number("cpus", raw.get("cpus", 0.0)),
        memory_bytes=at.size("memory", raw["memory"]) if "memory" in raw else 0,
        preemptible=at.flag("preemptible", raw.get("preemptible", True)),
        topology=at.text("topology", raw["topology"]) if raw.get("topology") else None,
        topology_preferred=(
            at.text("topology_preferred", raw["topology_preferred"])
            if raw.get("topology_preferred")
            else None
        ),
        node_names=frozenset(_names(raw.get("only_on", []), at)),
        max_duration=_optional_seconds(raw, "max_duration", at),
        attained_service=at.number("attained", raw.get("attained", 0.0)),
        duration_estimate=_optional_seconds(raw, "estimate", at),
        placement=placement,
        start_time=start,
        last_checkpoint_time=(
            at.number("checkpoint", raw["checkpoint"]) if raw.get("checkpoint") is not None else None
        ),
        stopping=at.flag("stopping", raw.get("stopping", False)),
        evicted_for=_evicted_for(raw, at),
        victims_stopped=at.flag("victims_stopped", raw.get("victims_stopped", False)),
    )


def _nominated(
    items: list[Any], pending: tuple[WorkloadView, ...], where: _Where
) -> dict[int, tuple[PodPlacement, ...]]:
    """`nominated: {node: [gpu indices]}` on pending work: the room an earlier cycle left it waiting for."""
    out: dict[int, tuple[PodPlacement, ...]] = {}
    for i, (item, w) in enumerate(zip(items, pending, strict=True)):
        if isinstance(item, Mapping) and item.get("nominated") is not None:
            at = where.at(f"pending[{i}]")
            fraction = w.gpus.count if w.gpus.is_fractional else 1.0
            pods = _pods(item["nominated"], at)
            out[w.id] = tuple(PodPlacement(node, gpus, fraction) for node, gpus in pods)
    return out


def _evicted_for(raw: Mapping[str, Any], at: _Where) -> int | None:
    """`evicted_for: ID`, the pending workload a stopping one's eviction was for."""
    if raw.get("evicted_for") is None:
        return None
    if not raw.get("stopping"):
        raise at.error("evicted_for", raw["evicted_for"], "is only for stopping work: add stopping: true")
    number = at.number("evicted_for", raw["evicted_for"])
    if not number.is_integer():
        raise at.error("evicted_for", raw["evicted_for"], "must be a workload id (a whole number)")
    return int(number)


def _priority(value: object, at: _Where) -> int:
    if isinstance(value, str) and value.strip().lower() in PRIORITY_CLASSES:
        return PRIORITY_CLASSES[value.strip().lower()]
    number = at.number("priority", value)
    if not number.is_integer():
        raise at.error("priority", value, "must be a whole number or a class (train, interactive, ...)")
    return int(number)


def _gpu_demand(raw: dict[str, Any], pods: list[tuple[str, tuple[int, ...]]], at: _Where) -> GpuDemand:
    if "gpus" not in raw:
        if not pods:
            return GpuDemand(1.0)  # a pending workload asks for one GPU unless it says otherwise
        counts = {len(gpus) for _, gpus in pods}
        if len(counts) != 1:
            raise at.error("on", raw.get("on"), "pods use different GPU counts; give `gpus:` per pod")
        return GpuDemand(float(counts.pop()))
    try:
        request = parse_gpu_request(raw["gpus"], "gpus")
    except SpecError as exc:
        raise at.error("gpus", raw["gpus"], exc.message) from None
    demand = GpuDemand(request.count, request.models, request.min_memory_bytes)
    for node, gpus in pods:
        expected = 1 if demand.is_fractional else int(demand.count)
        if len(gpus) != expected:
            raise at.error("on", {node: list(gpus)}, f"a pod of {request} needs {expected} GPU index(es)")
    return demand


def _pods(data: object, at: _Where) -> list[tuple[str, tuple[int, ...]]]:
    """`on: {n1: [0,1], n2: [0,1]}` (one pod per node) or `on: [{n1: [0]}, {n1: [1]}]` (any pods)."""
    if data is None:
        return []
    entries: list[tuple[object, object]] = []
    if isinstance(data, Mapping):
        entries = list(data.items())
    elif isinstance(data, list) and all(isinstance(x, Mapping) and len(x) == 1 for x in data):
        entries = [next(iter(x.items())) for x in data]
    else:
        raise at.error("on", data, "must be {node: [gpu indices]} or a list of such one-entry mappings")
    return [(at.text("on", node), _indices(gpus, at)) for node, gpus in entries]


def _indices(data: object, at: _Where) -> tuple[int, ...]:
    if isinstance(data, int) and not isinstance(data, bool):
        return (data,)
    if isinstance(data, str) and (match := _RANGE.match(data)):
        first, last = int(match[1]), int(match[2])
        return tuple(range(first, last + 1))  # "0-3" means 0, 1, 2, 3
    if isinstance(data, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in data):
        return tuple(data)
    if data is None:
        return ()
    raise at.error("on", data, "GPU indices must be a list like [0, 1], a range like '0-3', or one index")


def _check_ids(running: tuple[WorkloadView, ...], pending: tuple[WorkloadView, ...], where: _Where) -> None:
    ids = [w.id for w in running + pending]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise where.error("id", duplicates, "workload ids must be unique across running and pending")


def _check_placements(running: tuple[WorkloadView, ...], nodes: tuple[NodeView, ...], where: _Where) -> None:
    """Running work must sit on real GPUs without over-committing them (a scenario must be a real state)."""
    by_name = {n.name: n for n in nodes}
    used: dict[tuple[str, int], float] = {(n.name, g.index): g.allocated for n in nodes for g in n.gpus}
    for w in running:
        for pod in w.placement:
            node = by_name.get(pod.node)
            if node is None:
                raise where.error("on", pod.node, f"workload {w.id} runs on a node that is not declared")
            for index in pod.gpu_indices:
                if (pod.node, index) not in used:
                    raise where.error("on", index, f"workload {w.id}: {pod.node} has no GPU {index}")
                used[(pod.node, index)] += pod.gpu_fraction
                if used[(pod.node, index)] > 1 + 1e-9:
                    raise where.error("on", index, f"workload {w.id} over-commits GPU {index} of {pod.node}")


def _check_expected_ids(
    expect: Expectations,
    running: tuple[WorkloadView, ...],
    pending: tuple[WorkloadView, ...],
    queues: tuple[QueueView, ...],
    where: _Where,
) -> None:
    """An expectation about a workload or queue the scenario does not have is a typo, not a check."""
    pending_ids = {w.id for w in pending}
    running_ids = {w.id for w in running}
    for field, ids, known in (
        ("binds", expect.binds, pending_ids),
        ("nominated", expect.nominated, pending_ids),
        ("reasons", expect.reasons, pending_ids),
        ("evictions", expect.evictions, running_ids),
    ):
        unknown = sorted(set(ids or ()) - known)
        if unknown:
            kind = "running" if field == "evictions" else "pending"
            raise where.error(f"expect.{field}", unknown, f"not {kind} workload ids of this scenario")
    for _, beneficiary in (expect.evictions or {}).values():
        if beneficiary is not None and beneficiary not in pending_ids:
            raise where.error("expect.evictions", beneficiary, "'for' must name a pending workload")
    running_ids = {w.id for w in running}
    for wid, waiting in (expect.released_to or {}).items():
        if wid not in running_ids:
            # stopping work, or work the cycle evicts for no one (a stale gang)
            raise where.error("expect.released_to", wid, "keys must be running workload ids")
        if waiting not in pending_ids:
            raise where.error("expect.released_to", waiting, "values must be pending workload ids")
    names = {q.name for q in queues}
    unknown_queues = sorted(set(expect.fair_share or ()) - names)
    if unknown_queues:
        raise where.error("expect.fair_share", unknown_queues, "not queues of this scenario")


# --- expectations ---------------------------------------------------------------------------------


def _expectations(data: object, where: _Where) -> Expectations:
    if data is None:
        raise where.error("expect", data, "a scenario needs an `expect:` section")
    raw = _mapping(data, where.file, "expect", _EXPECT_KEYS)
    at = where.at("expect")
    return Expectations(
        binds=_expected_binds(raw["binds"], at) if "binds" in raw else None,
        evictions=_expected_evictions(raw["evictions"], at) if "evictions" in raw else None,
        reasons=_expected_reasons(raw["reasons"], at) if "reasons" in raw else None,
        fair_share=_expected_fair_share(raw["fair_share"], at) if "fair_share" in raw else None,
        released_to=_expected_released_to(raw["released_to"], at) if "released_to" in raw else None,
        nominated=_expected_binds(raw["nominated"], at) if "nominated" in raw else None,
    )


def _ids_mapping(data: object, at: _Where, field: str) -> dict[int, Any]:
    if data is None:
        return {}
    if isinstance(data, list):
        return dict.fromkeys(data)
    if not isinstance(data, Mapping):
        raise at.error(field, data, "must map workload id -> expectation (or be a list of ids)")
    for key in data:
        if isinstance(key, bool) or not isinstance(key, int):
            raise at.error(field, key, "keys must be workload ids")
    return dict(data)


def _expected_binds(data: object, at: _Where) -> dict[int, tuple[PodWhere, ...] | None]:
    out: dict[int, tuple[PodWhere, ...] | None] = {}
    for wid, where in _ids_mapping(data, at, "binds").items():
        if where is None or where == "any":
            out[wid] = None
        elif isinstance(where, str):
            out[wid] = (PodWhere(where),)
        elif isinstance(where, Mapping):
            out[wid] = tuple(PodWhere(str(node), _indices(gpus, at)) for node, gpus in where.items())
        elif isinstance(where, list):
            pods: list[PodWhere] = []
            for entry in where:
                if isinstance(entry, str):
                    pods.append(PodWhere(entry))
                elif isinstance(entry, Mapping) and len(entry) == 1:
                    node, gpus = next(iter(entry.items()))
                    pods.append(PodWhere(str(node), _indices(gpus, at)))
                else:
                    raise at.error(f"binds.{wid}", entry, "a pod is a node name or {node: [gpu indices]}")
            out[wid] = tuple(pods)
        else:
            raise at.error(f"binds.{wid}", where, "must be any, a node, [nodes], or {node: [gpu indices]}")
    return out


EVICTION_PATTERN = re.compile(r"^\s*([a-z-]+)\s*(?:for\s+(\d+))?\s*$")


def _expected_evictions(data: object, at: _Where) -> dict[int, tuple[str, int | None]]:
    out: dict[int, tuple[str, int | None]] = {}
    for wid, text in _ids_mapping(data, at, "evictions").items():
        match = EVICTION_PATTERN.match(str(text)) if text is not None else None
        if match is None:
            raise at.error(
                f"evictions.{wid}", text, "must be a code, optionally with 'for ID': 'reclaim for 10'"
            )
        out[wid] = (match[1], int(match[2]) if match[2] else None)
    return out


def _expected_reasons(data: object, at: _Where) -> dict[int, str]:
    out: dict[int, str] = {}
    for wid, code in _ids_mapping(data, at, "reasons").items():
        if not isinstance(code, str):
            raise at.error(f"reasons.{wid}", code, "must be a reason code like no-capacity")
        out[wid] = code
    return out


def _expected_released_to(data: object, at: _Where) -> dict[int, int]:
    out: dict[int, int] = {}
    for wid, waiting in _ids_mapping(data, at, "released_to").items():
        if isinstance(waiting, bool) or not isinstance(waiting, int):
            raise at.error(f"released_to.{wid}", waiting, "must be the pending workload's id")
        out[wid] = waiting
    return out


def _expected_fair_share(data: object, at: _Where) -> dict[str, dict[str, tuple[Condition, ...]]]:
    if not isinstance(data, Mapping):
        raise at.error("fair_share", data, "must map queue -> GPUs (or -> {gpu: .., cpu: ..})")
    out: dict[str, dict[str, tuple[Condition, ...]]] = {}
    for queue, value in data.items():
        per_resource = value if isinstance(value, Mapping) else {"gpu": value}
        out[str(queue)] = {
            str(resource): _conditions(checks, at.at(f"fair_share.{queue}"))
            for resource, checks in per_resource.items()
        }
    return out


def _conditions(value: object, at: _Where) -> tuple[Condition, ...]:
    items = value if isinstance(value, list) else [value]
    out: list[Condition] = []
    for item in items:
        if isinstance(item, int | float) and not isinstance(item, bool):
            out.append(Condition("~", float(item)))
            continue
        match = _COMPARISON.match(str(item))
        try:
            number = float(Fraction(match[2])) if match else None
        except (ValueError, ZeroDivisionError):
            number = None
        if match is None or number is None:
            raise at.error("", item, "must be a number, a fraction like '14/3', or a comparison like '>4'")
        op = match[1] or "~"
        out.append(Condition("~" if op == "==" else op, number))
    return tuple(out)
