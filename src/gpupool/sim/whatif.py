"""`sim whatif`: the live cluster's own recent history replayed on a changed cluster.

The history comes as the API shows it (workloads, nodes and queues as JSON mappings), so this module reads
no store and the CLI stays a client. Each finished workload becomes a job that asks for its GPUs for as long
as its attempts ran, added up (a preempted job's wait between attempts is not work), less the attempts an
eviction stopped where the workload declares no checkpoint (its next attempt did that work again; the
replay evicts on its own); work still running, or pending again after an eviction or a lost node,
counts with the time it has run so far (the time its attempts ran, where it kept no work). gpupool's own
health check jobs (queue gpupool-system) are left out: the head places them outside the scheduler, on a
node it holds for them.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpupool.scheduler import GpuView, NodeView, QueueView
from gpupool.scheduler.placement import split_model
from gpupool.sim.cluster import DEFAULT_MODEL, Cluster, parse_groups
from gpupool.sim.errors import SimError
from gpupool.sim.metrics import summarize
from gpupool.sim.parallel import Replay, processes, replay_all
from gpupool.sim.policies import Policy
from gpupool.sim.results import SimOptions, SimResult
from gpupool.sim.trace import TraceJob
from gpupool.spec import SpecError
from gpupool.spec.quantities import parse_gpu_request
from gpupool.spec.queue import SYSTEM_QUEUE

FINISHED = ("succeeded", "failed", "cancelled")
# The states whose workloads may have run: ended, running, and pending again (evicted, requeued, held, its
# node lost) after they ran.
RAN = (*FINISHED, "running", "pending")


def _stamp(value: Any) -> float | None:
    if not value:
        return None
    stamp = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.UTC)
    return stamp.timestamp()


def history_jobs(workloads: Sequence[Mapping[str, Any]], since: float, now: float) -> list[TraceJob]:
    """Jobs submitted at or after `since` that ran: GPUs per pod x pods, for as long as they ran."""
    return [job for job, _ in _history(workloads, since, now)]


def measured_jcts(workloads: Sequence[Mapping[str, Any]], since: float, now: float) -> dict[int, float]:
    """The completion times the live cluster gave the jobs of `history_jobs` that ended, by their ids
    there: what the replay of the cluster as it is should come near."""
    return {job.id: jct for job, jct in _history(workloads, since, now) if jct is not None}


def _history(
    workloads: Sequence[Mapping[str, Any]], since: float, now: float
) -> list[tuple[TraceJob, float | None]]:
    """`history_jobs` with each job's measured completion time (None while it runs)."""
    jobs: list[tuple[TraceJob, float | None]] = []
    for w in workloads:
        submit, started = _stamp(w.get("created_at")), _stamp(w.get("started_at"))
        if submit is None or started is None or submit < since or w.get("kind", "job") != "job":
            continue
        if w.get("queue") == SYSTEM_QUEUE:
            continue
        ran = w.get("work_seconds")  # its attempts' run times, less the work lost to evictions
        if not isinstance(ran, int | float) or (ran <= 0 and w.get("state") not in FINISHED):
            # a head older than work_seconds: redone work counts again; and work pending again that kept
            # nothing of what it did (no checkpoint) needs at least about as long again
            ran = w.get("run_seconds")
        if isinstance(ran, int | float):
            duration = float(ran)
        else:  # a head older than run_seconds: from its first start to its end
            ended = _stamp(w.get("finished_at")) if w.get("state") in FINISHED else now
            duration = ended - started if ended is not None else 0.0
        if duration <= 0:
            continue
        try:
            request = parse_gpu_request(w.get("gpus") or 0)
        except SpecError:
            continue
        pods = int(w.get("nodes") or 1)
        if request.count <= 0:
            continue
        job = TraceJob(
            len(jobs),
            submit,
            duration,
            request.count * pods,
            str(w.get("queue") or "default"),
            user=str(w.get("user") or ""),
            gpu_models=request.models,
            nodes=pods if pods > 1 else 0,
            preemptible=w.get("preemptible") is not False,  # a head older than the field: as before
        )
        ended = _stamp(w.get("finished_at")) if w.get("state") in FINISHED else None
        jobs.append((job, ended - submit if ended is not None else None))
    jobs.sort(key=lambda pair: (pair[0].submit, pair[0].id))
    return [(replace(job, id=i), jct) for i, (job, jct) in enumerate(jobs)]


def cluster_from_nodes(nodes: Sequence[Mapping[str, Any]]) -> list[NodeView]:
    """The pool's nodes as the replays' cluster, every one in service whatever its state now: the history
    ran on them, and a node cordoned or lost today would leave the replay of the cluster as it is with
    less than that history had (with every node out, no job at all). `--remove` takes one out."""
    views = []
    for n in nodes:
        gpus = tuple(
            GpuView(
                int(g["index"]),
                str(g.get("model") or "GPU"),
                int(g.get("memory_bytes") or 0),
                int(g.get("nvlink_island") or 0),
            )
            for g in n.get("gpus") or []
        )
        views.append(NodeView(str(n["name"]), True, gpus))
    return views


def check_changes(add: Sequence[str] = (), quotas: Sequence[str] = ()) -> None:
    """Refuse a malformed `--add` or `--quota` before anything is asked of the server: whether the nodes
    and queues they name exist is known only with the live cluster (see `changed`)."""
    for spec in add:
        parse_groups(spec, "--add", prefix="added")
    given: dict[str, str] = {}  # queue -> its --quota item
    for item in quotas:
        name, _ = _quota_item(item)
        if name in given:  # the last would win in silence
            raise SimError(
                "--quota",
                f"queue {name!r} is given twice ({given[name]!r} and {item!r}); give one --quota {name}=GPUS",
            )
        given[name] = item


def check_models(add: Sequence[str], nodes: Sequence[NodeView], known: Collection[str]) -> None:
    """Refuse added nodes of a GPU model that no node of the pool has and `known` (the GPU catalog's
    families) lacks, as a submission asking for one is refused: a typo ("H10O") would replay new GPUs that
    no job asking for a model could use."""
    in_pool = {g.model.upper() for n in nodes for g in n.gpus}
    families = {m.upper() for m in known} | in_pool
    for spec in add:
        models = {g.model for node in parse_groups(spec, "--add", prefix="added") for g in node.gpus}
        for model in sorted(models):
            family = split_model(model)[0]
            if family != DEFAULT_MODEL and family not in families:  # `--add 2x8`: GPUs of no model
                raise SimError(
                    "--add",
                    f"unknown GPU model {model!r} in {spec!r}; models in this pool: "
                    f"{', '.join(sorted(in_pool)) or 'none'}; known models: {', '.join(sorted(families))}",
                )


def _quota_item(item: str) -> tuple[str, float]:
    """`nlp=16` as (queue, GPUs)."""
    name, sep, raw = item.partition("=")
    if not sep or not name:
        raise SimError("--quota", f"{item!r} is not QUEUE=GPUS; e.g. --quota nlp=16")
    try:
        quota = float(raw)
    except ValueError:
        raise SimError("--quota", f"{raw!r} is not a number of GPUs; e.g. --quota {name}=16") from None
    if not quota >= 0 or quota == float("inf"):
        raise SimError("--quota", f"{item!r}: a quota is a number of GPUs, 0 or more; e.g. --quota {name}=16")
    return name, quota


def changed(
    nodes: Sequence[NodeView],
    queues: Sequence[QueueView],
    add: Sequence[str] = (),
    remove: Sequence[str] = (),
    quotas: Sequence[str] = (),
) -> tuple[list[NodeView], list[QueueView]]:
    """The cluster and queues with nodes added (`4x8:H100`), removed (by name) and quotas set (`nlp=16`)."""
    names = {n.name for n in nodes}
    for name in remove:
        if name not in names:
            raise SimError("--remove", f"no node named {name!r}; nodes: {', '.join(sorted(names)) or 'none'}")
    kept = [n for n in nodes if n.name not in set(remove)]
    for spec in add:
        kept += parse_groups(spec, "--add", first_index=len(kept), prefix="added")
    by_name = {q.name: q for q in queues}
    for item in quotas:
        name, quota = _quota_item(item)
        if name not in by_name:
            raise SimError(
                "--quota", f"no queue named {name!r}; queues: {', '.join(sorted(by_name)) or 'none'}"
            )
        share = by_name[name].gpu
        limit = share.limit if share.limit is None or share.limit >= quota else quota
        by_name[name] = replace(by_name[name], gpu=replace(share, quota=quota, limit=limit))
    return kept, list(by_name.values())


def check_replays(jobs: Sequence[TraceJob], before: Sequence[NodeView], after: Sequence[NodeView]) -> None:
    """Refuse replays that could not run before saying that they do: no job in the period, or a cluster (as
    it is, or changed) without GPUs."""
    if not jobs:
        raise SimError("--since", "no finished or running jobs in that period; widen it (e.g. --since 30d)")
    if not any(n.gpus for n in before):
        raise SimError("--add", "the pool's nodes have no GPUs to replay the history on; add some, e.g. 4x8")
    if not any(n.gpus for n in after):
        raise SimError("--remove", "the changed cluster has no GPUs left; remove fewer nodes, or --add some")


def compare(
    jobs: Sequence[TraceJob],
    before: tuple[Sequence[NodeView], Sequence[QueueView]],
    after: tuple[Sequence[NodeView], Sequence[QueueView]],
    policy: Policy,
    options: SimOptions | None = None,
    workers: int | str = 1,
    measured: Mapping[int, float] | None = None,
    *,
    policy_after: Policy | None = None,
) -> dict[str, Any]:
    """Replay `jobs` on both clusters; per queue, the change in JCT and queueing delay. `measured`: the
    live cluster's completion times of the jobs that ended, by id (`measured_jcts`), set beside what the
    replay of the cluster as it is gives the same jobs, so a reader sees how near the model comes.

    `workers` is `--jobs`: 2 (or `auto` with 2 CPUs or more) replays both at once, each in its own process."""
    at_once = processes(workers, 2)
    check_replays(jobs, before[0], after[0])
    origin = jobs[0].submit
    replays = []
    policies = {"before": policy, "after": policy_after or policy}
    for name, (nodes, queues) in (("before", before), ("after", after)):
        cluster = Cluster(tuple(nodes), "")
        replays.append(Replay(name, jobs, origin, cluster, tuple(queues), policies[name], options))
    results = replay_all(replays, at_once)
    old, new = (
        summarize(result) | {"gpus": replay.cluster.gpus} | _unfinished(jobs, result, replay.queues)
        for replay, result in zip(replays, results, strict=True)
    )
    replayed = Counter(job.queue for job in jobs)
    per_queue = {}
    for name in sorted(set(old["queues"]) | set(new["queues"])):
        a, b = old["queues"].get(name, {}), new["queues"].get(name, {})
        per_queue[name] = {
            "jobs": replayed.get(name, 0),
            "avg_jct_s": [a.get("avg_jct_s"), b.get("avg_jct_s")],  # None: no job of it finished there
            "avg_queue_s": [a.get("avg_queue_s"), b.get("avg_queue_s")],
            "quota_gpus": [a.get("quota_gpus", 0.0), b.get("quota_gpus", 0.0)],
        }
    keys = ("avg_jct_s", "avg_queue_s", "gpu_util", "gpus", "dropped", "unfinished", "unfinished_by_queue",
            "unfinished_over_limit", "unfinished_nonpreemptible_over_quota", "makespan_s", "preemptions",
            "lost_gpu_h")  # fmt: skip
    ended = measured or {}
    as_replayed = [r.jct for r in results[0].jobs if r.id in ended and r.jct is not None]
    return {
        "jobs": len(jobs),
        "policy": policy.name,
        "policy_after": policies["after"].name,
        "before": {k: old[k] for k in keys},
        "after": {k: new[k] for k in keys},
        "queues": per_queue,
        "live": {
            "jobs": len(ended),
            "avg_jct_s": sum(ended.values()) / len(ended) if ended else None,
            "replayed_avg_jct_s": sum(as_replayed) / len(as_replayed) if as_replayed else None,
        },
    }


def _unfinished(jobs: Sequence[TraceJob], result: SimResult, queues: Sequence[QueueView]) -> dict[str, Any]:
    """The jobs a replay never finished, by queue, and how many of them are known never to start there: one
    asking for more GPUs than a limit on its queue's line, or non-preemptible work asking for more than a
    quota on it (non-preemptible work runs only within quota, as on the server)."""
    by_name = {q.name: q for q in queues}
    by_id = {job.id: job for job in jobs}
    left = [by_id[r.id] for r in result.jobs if r.finish is None]
    over_limit = over_quota = 0
    for job in left:
        line = _line(job.queue, by_name)
        if any(q.gpu.limit is not None and job.gpus > q.gpu.limit + 1e-9 for q in line):
            over_limit += 1
        elif not job.preemptible and any(job.gpus > q.gpu.quota + 1e-9 for q in line):
            over_quota += 1
    return {
        "unfinished_by_queue": dict(Counter(job.queue for job in left).most_common()),
        "unfinished_over_limit": over_limit,
        "unfinished_nonpreemptible_over_quota": over_quota,
    }


def _line(queue: str, by_name: Mapping[str, QueueView]) -> list[QueueView]:
    """`queue` and its ancestors, as far as they are known."""
    line: list[QueueView] = []
    view = by_name.get(queue)
    while view is not None and view not in line:
        line.append(view)
        view = by_name.get(view.parent) if view.parent is not None else None
    return line


def unfinished_note(when: str, figures: Mapping[str, Any]) -> str | None:
    """What `sim whatif` says of the jobs the `when` replay never finished (`figures`: its part of
    `compare`), the cause only where it is known."""
    never = int(figures.get("unfinished") or 0)
    if not never:
        return None
    causes = [
        (figures.get("unfinished_nonpreemptible_over_quota") or 0,
         "non-preemptible and asking for more GPUs than its queue's quota: non-preemptible work runs only "
         "within quota"),
        (figures.get("unfinished_over_limit") or 0, "asking for more GPUs than its queue's limit"),
    ]  # fmt: skip
    known = [(n, why) for n, why in causes if n]
    if len(known) == 1 and known[0][0] == never:
        why = known[0][1]
    elif known and sum(n for n, _ in known) == never:
        why = "; ".join(f"{n:,} {said}" for n, said in known)
    else:
        why = "still pending or running when the replay ended"
        why += "".join(f"; {n:,} of them {said}" for n, said in known)
    jobs = f"{never:,} job{'' if never == 1 else 's'}"
    where = in_queues(figures.get("unfinished_by_queue") or {})
    return (
        f"the {when} replay never finished {jobs}{f' ({where})' if where else ''}, {why}; its figures leave "
        f"them out ({when}.unfinished in --json)"
    )


def in_queues(counts: Mapping[str, int]) -> str:
    """Jobs counted by queue, most first, as said in a line: "in queue nlp", "in queues nlp 3, cv 1"."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    if not ranked:
        return ""
    if len(ranked) == 1:
        return f"in queue {ranked[0][0]}"
    said = "in queues " + ", ".join(f"{queue} {n:,}" for queue, n in ranked[:3])
    return said + (f" and {len(ranked) - 3} more" if len(ranked) > 3 else "")
