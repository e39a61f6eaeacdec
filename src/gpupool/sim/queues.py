"""Queues for a simulation: `--queues auto` (a quota per tenant in proportion to the GPU-time it asks
for) or `--queues FILE` (queue specs in the product's own YAML format, docs/specs.md)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpupool.scheduler import QueueView, Share
from gpupool.sim.errors import SimError
from gpupool.sim.input_files import read_text
from gpupool.sim.trace import TraceJob
from gpupool.spec import SpecError, parse_queue_spec
from gpupool.spec.views import queue_view


def auto_queues(jobs: Sequence[TraceJob], cluster_gpus: int) -> tuple[QueueView, ...]:
    """One queue per tenant; GPU quotas proportional to the GPU-time each demands, summing to the cluster
    (largest remainder), over-quota weight 1, no limit."""
    demand: dict[str, float] = {}
    for job in jobs:
        demand[job.queue] = demand.get(job.queue, 0.0) + job.gpu_time
    quotas = proportional(demand, cluster_gpus)
    return tuple(QueueView(name, gpu=Share(quota=float(quotas[name]))) for name in sorted(demand))


def proportional(weights: Mapping[str, float], total: int) -> dict[str, int]:
    """Whole shares of `total` in proportion to `weights` that sum to `total` (largest remainder)."""
    whole = sum(weights.values())
    if whole <= 0:
        return dict.fromkeys(weights, 0)
    exact = {k: total * v / whole for k, v in weights.items()}
    shares = {k: int(v) for k, v in exact.items()}
    left = total - sum(shares.values())
    for k in sorted(exact, key=lambda k: (shares[k] - exact[k], k))[:left]:
        shares[k] += 1
    return shares


# What a queue spec may set that no replay models: their queues run as though these were not set.
UNMODELLED = ("max_priority", "user_limits", "budget")


class QueueFile(tuple[QueueView, ...]):
    """The queues of a `--queues` file, and what in it the replays do not model (`unmodelled`, one note or
    ""), which `quota_warnings` says with the rest."""

    unmodelled: str = ""


def load_queue_file(path: Path) -> QueueFile:
    """Queue specs (a YAML list, `queues: [...]`, or several YAML documents), each once, their parents
    defined in the file and no queue under itself (as the server refuses both)."""
    try:
        text = read_text(path, "--queues")
    except FileNotFoundError:
        raise SimError("--queues", f"{path}: no such file; give a queue file or 'auto'") from None
    except OSError as exc:
        raise SimError("--queues", f"cannot read {path}: {exc.strerror}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SimError("--queues", yaml_problem(path, exc)) from None
    items: list[Any] = []
    for doc in documents:
        if isinstance(doc, dict) and "queues" in doc:
            doc = doc["queues"]
        items.extend(doc if isinstance(doc, list) else [doc])
    if not items:
        raise SimError(
            "--queues", f"{path} defines no queues; e.g. '- {{name: nlp, resources: {{gpu: {{quota: 16}}}}}}'"
        )
    views: list[QueueView] = []
    unmodelled: dict[str, list[str]] = {}  # field -> the queues that set it
    for i, item in enumerate(items):
        try:
            spec = parse_queue_spec(item)
        except SpecError as exc:
            raise SimError("--queues", f"{path}, queue {i + 1}: {exc}") from None
        if any(v.name == spec.name for v in views):
            raise SimError(
                "--queues",
                f"{path}, queue {i + 1}: {spec.name!r} is defined twice; give each queue one entry",
            )
        for name in UNMODELLED:
            if getattr(spec, name) is not None:
                unmodelled.setdefault(name, []).append(spec.name)
        views.append(queue_view(spec.model_dump(mode="json")))
    _check_parents(views, path)
    queues = QueueFile(views)
    if unmodelled:
        fields = ", ".join(
            f"{name} (queue{'s' if len(named) > 1 else ''} {', '.join(named)})"
            for name, named in unmodelled.items()
        )
        queues.unmodelled = (
            f"{path} sets what the simulator does not model, so the replays run as though it were not set: "
            f"{fields}"
        )
    return queues


def yaml_problem(path: Path, exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line: "q.yaml line 2, column 1: not valid YAML: expected ',' or '}', but got
    '<stream end>' (a flow mapping begun at line 1, column 3); correct it there"."""
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem_mark is None:
        return f"{path} is not valid YAML: {' '.join(str(exc).split())}"
    mark = exc.problem_mark
    where = f"{path} line {mark.line + 1}, column {mark.column + 1}"
    began = ""
    if exc.context and exc.context_mark is not None:
        what = exc.context.removeprefix("while ").removeprefix("parsing ").removeprefix("scanning ")
        began = f" ({what} begun at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
    problem = " ".join((exc.problem or "unreadable").split())
    return f"{where}: not valid YAML: {problem}{began}; correct it there"


def _check_parents(views: Sequence[QueueView], path: Path) -> None:
    """Refuse a parent the file does not define, and queues under themselves, as the server's
    `_check_parent` does (a queue its own parent is the spec's own error)."""
    parents = {v.name: v.parent for v in views}
    for v in views:
        if v.parent is None:
            continue
        if v.parent not in parents:
            raise SimError(
                "--queues",
                f"{path}, queue {v.name!r}: parent queue {v.parent!r} does not exist; define it in the file, "
                "or leave parent out",
            )
        chain, above = [v.parent], parents[v.parent]
        while above is not None and above not in chain:
            if above == v.name:
                loop = " under ".join([*chain, v.name])
                raise SimError(
                    "--queues",
                    f"{path}, queue {v.name!r}: parent: {v.parent!r} is under {v.name!r} ({loop}), so the "
                    f"queues would form a loop; choose a parent outside {v.name!r} and the queues under it",
                )
            chain.append(above)
            above = parents.get(above)


def resolve_queues(value: str, jobs: Sequence[TraceJob], cluster_gpus: int) -> tuple[QueueView, ...]:
    """`auto` (`auto_queues`), or the queues of a file (`load_queue_file`), one for every tenant of `jobs`."""
    if value == "auto":
        return auto_queues(jobs, cluster_gpus)
    views = load_queue_file(Path(value))
    named = {q.name for q in views}
    jobs_of: dict[str, int] = {}
    for job in jobs:
        if job.queue not in named:
            jobs_of[job.queue] = jobs_of.get(job.queue, 0) + 1
    if jobs_of:  # as the server refuses work for a queue it does not have
        tenants = ", ".join(
            f"{name!r} ({n:,} job{'' if n == 1 else 's'})" for name, n in sorted(jobs_of.items())[:5]
        )
        more = f" and {len(jobs_of) - 5} more" if len(jobs_of) > 5 else ""
        raise SimError(
            "--queues",
            f"{value} has no queue for the trace's tenant(s) {tenants}{more}; add them (quota 0 lets a queue "
            "only borrow), or use --queues auto",
        )
    return views


def quota_warnings(queues: Sequence[QueueView], cluster_gpus: int) -> list[str]:
    """What a queue file promises that the cluster cannot hold, as the server warns of it: top-level GPU
    quotas adding up to more than the cluster's GPUs, or a parent's children to more than its quota. The
    replay runs all the same (fair shares scale the quotas down), but a quota is then no guarantee. First,
    for the queues of a file, the fields it sets that the replay does not model (`QueueFile`)."""
    said: list[str] = [queues.unmodelled] if isinstance(queues, QueueFile) and queues.unmodelled else []
    for above in (None, *sorted({q.parent for q in queues if q.parent is not None})):
        promised = sum(q.gpu.quota for q in queues if q.parent == above)
        if above is None:
            room, whose, level = float(cluster_gpus), "the cluster has", "top-level queues"
        else:
            parent = next((q for q in queues if q.name == above), None)
            if parent is None:
                continue
            room, whose, level = parent.gpu.quota, f"queue {above}'s quota is", f"the queues under {above}"
        if promised > room + 1e-9:
            said.append(
                f"the GPU quotas of {level} add up to {promised:g}, but {whose} {room:g}: more than the "
                "cluster can guarantee; when all of them want their quota, each gets less (fair shares scale "
                "the quotas down)"
            )
    return said


def leaf_names(queues: Iterable[QueueView]) -> set[str]:
    queues = list(queues)
    parents = {q.parent for q in queues if q.parent is not None}
    return {q.name for q in queues if q.name not in parents}
