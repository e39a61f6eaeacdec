"""Reason codes and the sentences that explain them ("why is my job pending?")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Final, TypeAlias, cast

from gpupool.scheduler.snapshot import Explanation, NodeView, WorkloadView
from gpupool.scheduler.state import EPSILON
from gpupool.spec.quantities import format_figure, format_size

QUEUE_LIMIT: Final = "queue-limit"
OVER_QUOTA_NONPREEMPTIBLE: Final = "over-quota-nonpreemptible"
NO_CAPACITY: Final = "no-capacity"
FRAGMENTED: Final = "fragmented"
NO_MATCHING_GPU: Final = "no-matching-gpu"
TOO_LARGE: Final = "too-large"
WAITING_FOR_RELEASE: Final = "waiting-for-release"
RESERVED: Final = "reserved"
BLOCKED: Final = "blocked"
OVER_FAIR_SHARE: Final = "over-fair-share"
STOPPING_LIMIT: Final = "stopping-limit"

CODES: Final = (
    QUEUE_LIMIT,
    OVER_QUOTA_NONPREEMPTIBLE,
    NO_CAPACITY,
    FRAGMENTED,
    NO_MATCHING_GPU,
    TOO_LARGE,
    WAITING_FOR_RELEASE,
    RESERVED,
    BLOCKED,
    OVER_FAIR_SHARE,
    STOPPING_LIMIT,
)


def cured_by_capacity(code: str) -> bool:
    """Whether more capacity (an eviction) could cure a workload waiting for `code`: reclaim, preempt and
    consolidate look at these. Asked of each pending workload in a cycle: compiled, `in` a tuple written
    out compares with each code in turn, the usual one first (a string compared with itself is a pointer
    compared), where a set's lookup hashes and probes."""
    return code in (NO_CAPACITY, OVER_FAIR_SHARE, FRAGMENTED)


# A queue's standing as the over-fair-share sentence gives it: (the queue, its GPUs allocated, its fair
# share), and, where given, fourth: how many of those GPUs stopping work is still releasing for its waiting
# work (allocated to it after release: its fair share counts them, `gpupool queues` does not yet). Typed
# as any tuple so that compiled code keeps it as one Python tuple that every sentence of the queue shares:
# as `tuple[str, float, float]`, mypyc keeps it unboxed and makes a new tuple, with new floats, each time
# a sentence takes it.
Standing: TypeAlias = tuple[object, ...]

UNITS: Final = {"gpu": ("GPU", ""), "cpu": ("CPU", ""), "memory": ("byte", " of memory")}  # see `counted`


def counted(count: float, noun: str) -> str:
    """`count` and the noun, plural but for one: "1 GPU", "0.5 GPUs", "2 schedulable nodes"."""
    return f"{count:g} {noun}" if count == 1 else f"{count:g} {noun}s"


def size_text(n: float) -> str:
    """Bytes as a reason says them: a request as it was written where it is round ("512GB", "64GiB"), a
    node's memory in GiB as `gpupool nodes` shows it ("23.5GiB"; it read "25.2762GB")."""
    whole = int(n)
    if whole == n and whole >= 0:
        said = format_size(whole)  # in its largest exact unit: "512GB", but also "26503040KiB"
        if len(said.rstrip("BiKMGTPE")) <= 4 or whole < 2**20:
            return said
    return f"{format_figure(n / 2**30)}GiB"


def gpu_text(w: WorkloadView) -> str:
    demand = w.gpus
    what = "|".join(demand.models)
    if demand.min_memory_bytes:
        what = f">={size_text(demand.min_memory_bytes)}"
    return counted(demand.count, f"{what} GPU".lstrip())


def queue_limit(queue: str, resource: str, allocated: float, limit: float, wants: float) -> Explanation:
    """`wants` more of `resource` would take `queue` past its limit. Work that alone asks for more than the
    limit waits until the limit is raised, however idle the queue: said so, with the command."""
    noun, after = UNITS.get(resource, (resource, ""))
    if wants > limit + EPSILON:
        fix = (
            f"`gpupool queue update {queue} --gpu-limit {wants:g}`"
            if resource == "gpu"
            else f"its {resource} limit in the queue's spec"
        )
        return Explanation(
            QUEUE_LIMIT,
            f"needs {counted(wants, noun)}{after}, more than queue {queue}'s limit of {limit:g}: it starts "
            f"only once an admin raises the limit ({fix}) or it asks for less",
        )
    if allocated + EPSILON >= limit:
        return Explanation(
            QUEUE_LIMIT, f"queue {queue} is at its limit ({allocated:g}/{counted(limit, noun)}{after})"
        )
    return Explanation(
        QUEUE_LIMIT,
        f"queue {queue} would pass its limit: {allocated:g} of {counted(limit, noun)}{after} in use, and "
        f"this needs {wants:g}",
    )


def over_quota_nonpreemptible(over: Sequence[tuple[str, float, float]]) -> Explanation:
    """Run:ai's rule (no borrowed GPU may be held by work that reclaim could not take back), with both ways
    out: quotas that cover it, or the work made preemptible. `over`: (queue, non-preemptible GPUs it would
    hold, its quota) for every level of the queue's chain it would pass, its own first: a fix for one level
    alone would leave the work waiting on the next."""
    said = [
        f"queue {queue} would hold {counted(would, 'non-preemptible GPU')}, over its quota of {quota:g}"
        for queue, would, quota in over
    ]
    fixes = ", ".join(f"`gpupool queue update {queue} --gpu-quota {would:g}`" for queue, would, _ in over)
    return Explanation(
        OVER_QUOTA_NONPREEMPTIBLE,
        f"non-preemptible work runs only within quota: {'; and '.join(said)}; it starts once "
        f"{'the quota covers' if len(over) == 1 else 'these quotas cover'} it ({fixes}), or submit it "
        "preemptible (`gpupool run --preemptible`, `preemptible: true`)",
    )


def _quota_not_reclaimable(why: Explanation, queue: str, allocated: float, quota: float) -> str:
    return (
        f"{why.message}; queue {queue} is within its quota ({allocated:g} of {counted(quota, 'GPU')} in "
        "use), but reclaim found nothing to take for it: the work beyond other queues' quotas is "
        "non-preemptible or within its minimum runtime, or stopping it would not free room this work can use"
    )


# The sentences written when first read, each as a constant: compiled, a constant is one C variable, where
# naming the function itself looks it up in the module's dict at every call (once per workload explained).
_QUOTA_NOT_RECLAIMABLE: Final[Callable[..., str]] = _quota_not_reclaimable


def quota_not_reclaimable(why: Explanation, queue: str, allocated: float, quota: float) -> Explanation:
    """`why` (a capacity explanation) of work whose queue is within its quota, for which reclaim found
    nothing it may take: the person expecting the quota's guarantee is told what stands in its way."""
    return Explanation(why.code, render=_QUOTA_NOT_RECLAIMABLE, args=(why, queue, allocated, quota))


def too_large(w: WorkloadView, why: str) -> Explanation:
    return Explanation(TOO_LARGE, f"can never fit this pool: {why}")


def no_nodes(w: WorkloadView) -> Explanation:
    """The pool has no node at all (a head whose agents have not joined yet, or every node deleted): work
    waits for one."""
    pods = counted(w.nodes, "node") if w.nodes > 1 else "a node"
    return Explanation(
        NO_CAPACITY,
        f"needs {pods}; the pool has no nodes (none has joined, or all were deleted: `gpupool nodes`)",
    )


def unschedulable_nodes(w: WorkloadView, nodes: Sequence[NodeView]) -> Explanation:
    out = [f"{n.name} {n.state}" for n in nodes if not n.schedulable]
    shown = ", ".join(out[:5]) + (f" and {len(out) - 5} more" if len(out) > 5 else "")
    ready = len(nodes) - len(out)
    sick = any(n.state == "unhealthy" for n in nodes if not n.schedulable)
    evidence = "; why a node is unhealthy: `gpupool health status`" if sick else ""
    return Explanation(
        NO_CAPACITY,
        f"needs {counted(w.nodes, 'schedulable node')}; {ready} can take work now ({shown}){evidence}",
    )


def named_nodes(w: WorkloadView, listed: str, why: str) -> Explanation:
    return Explanation(
        NO_CAPACITY,
        f"needs {counted(w.nodes, 'schedulable node')} among its placement.nodes ({listed}): {why}",
    )


def named_nodes_full(w: WorkloadView, listed: str, free: float) -> Explanation:
    return Explanation(
        NO_CAPACITY,
        f"needs {gpu_text(w)} free on {w.nodes} of its placement.nodes ({listed}); they have "
        f"{counted(free, 'GPU')} free",
    )


def no_matching_gpu(w: WorkloadView) -> Explanation:
    return Explanation(NO_MATCHING_GPU, f"no schedulable node has GPUs matching {gpu_text(w)}")


def fragmented(w: WorkloadView, block: int, node: str | None) -> Explanation:
    where = f" on {node}" if node else ""
    pods = (
        f"{w.nodes} nodes with {gpu_text(w)} free each" if w.nodes > 1 else f"{gpu_text(w)} free on one node"
    )
    return Explanation(FRAGMENTED, f"needs {pods}; the largest free block is {counted(block, 'GPU')}{where}")


def node_resources_short(w: WorkloadView, resource: str, most: float, node: str) -> Explanation:
    """The GPUs `w` needs are free on some node, but none of those nodes has its CPUs and memory free as
    well. `resource`: "cpu" or "memory" when every such node lacks that one (`most`: the most any of
    them has free, on `node`), "both" when each lacks one or the other."""
    gpus = f"{gpu_text(w)} free" if w.gpus.count > 0 else "room"
    memory = f"{size_text(w.memory_bytes)} of memory"
    if resource == "cpu":
        why = (
            f"needs {counted(w.cpus, 'CPU')} on a node with {gpus}; those nodes have at most "
            f"{counted(most, 'CPU')} free"
        )
    elif resource == "memory":
        why = f"needs {memory} on a node with {gpus}; those nodes have at most {size_text(most)} free"
    else:
        both = f"needs {counted(w.cpus, 'CPU')} and {memory} on a node with {gpus}"
        return Explanation(FRAGMENTED, f"{both}; no such node has both free")
    return Explanation(FRAGMENTED, f"{why} ({node})")


def _no_capacity(w: WorkloadView, free: float, ahead: int) -> str:
    pods = f"{w.nodes} x {gpu_text(w)}" if w.nodes > 1 else gpu_text(w)
    behind = f"; {_ahead(ahead)} in queue {w.queue}" if ahead else ""
    return f"needs {pods}; {counted(free, 'GPU')} free in the pool{behind}"


_NO_CAPACITY: Final[Callable[..., str]] = _no_capacity


def no_capacity(w: WorkloadView, free: float, ahead: int) -> Explanation:
    return Explanation(NO_CAPACITY, render=_NO_CAPACITY, args=(w, free, ahead))


def _ahead(count: int) -> str:
    return f"{counted(count, 'workload')} ahead"


def _over_fair_share(standing: Standing, ahead: int) -> str:
    queue, allocated, fair = standing[0], cast(float, standing[1]), cast(float, standing[2])
    freeing = cast(float, standing[3]) if len(standing) > 3 else 0.0
    behind = f"; {_ahead(ahead)}" if ahead else ""
    # The GPUs its running work holds (the allocation `gpupool queues` shows), and apart from them those
    # being released for its waiting work, which its fair share counts too: "holds 13 GPUs" beside the
    # queue's "allocated 9" read as a mistake.
    held, running = counted(allocated, "GPU"), allocated - freeing
    if freeing > EPSILON:
        held = (
            f"{counted(running, 'GPU')} and {freeing:g} more being freed for its work"
            if running > EPSILON
            else f"no GPUs but {counted(freeing, 'GPU')} being freed for its work"
        )
    # Capacity first, as Slurm's "Resources": a full pool read as a fairness problem ("at or over its fair
    # share (4 >= 4 GPUs)") to a user whose queue was the only one.
    return (
        f"waiting for GPUs to come free: queue {queue} holds {held}, at or over its fair share of "
        f"{format_figure(fair)}, so no other queue's work is reclaimed for it{behind}"
    )


_OVER_FAIR_SHARE: Final[Callable[..., str]] = _over_fair_share


def over_fair_share(standing: Standing, ahead: int) -> Explanation:
    """`standing`: the queue, the GPUs allocated to it, its fair share, and optionally those of them being
    freed for its waiting work (one tuple serves all its work)."""
    return Explanation(OVER_FAIR_SHARE, render=_OVER_FAIR_SHARE, args=(standing, ahead))


def stopping_limit(limit: float, stopping: float, wanted: float) -> Explanation:
    """Room for the workload would have to be made by stopping work (`wanted` GPUs of it; 0 where no search
    was made) while work stopped for others holds `stopping` GPUs, and `max_stopping_gpus` is `limit`."""
    needs = f"making room for it would stop {wanted:g} more; " if wanted > 0 else ""
    return Explanation(
        STOPPING_LIMIT,
        f"{_count_gpus(stopping)} being released by work stopped for waiting workloads; {needs}at most "
        f"{limit:g} may be stopping at once (scheduling.yaml max_stopping_gpus): it is tried again as they "
        "are released",
    )


def _count_gpus(count: float) -> str:
    return f"{counted(count, 'GPU')} {'is' if count == 1 else 'are'}"


def waiting_for_release(w: WorkloadView, victims: Sequence[int] = ()) -> Explanation:
    """`victims`: the ids of the work stopping for `w` (evicted for it, now or in an earlier cycle, or
    cancelled with its GPUs promised to it): "stopping", not "evicted", says both."""
    why = f"waiting for {counted(w.gpu_units, 'GPU')} being released by stopping work"
    if victims:
        ids = sorted(set(victims))
        listed = ", ".join(str(i) for i in ids[:5])
        if len(ids) > 5:
            listed += f" and {len(ids) - 5} more"
        why += f" (workload {listed} stops for it)" if len(ids) == 1 else f" (workloads {listed} stop for it)"
    return Explanation(WAITING_FOR_RELEASE, why)


def reserved(holder: int, start: float, now: float) -> Explanation:
    """The sentence names the reservation's start as a UTC time (not "in N s"), so it stays the same from
    one cycle to the next and an unchanged cluster needs no new cycle to explain itself."""
    if start == float("inf"):
        when = "until the running work there ends"
    elif start <= now:
        when = "from now"
    else:
        when = "from " + datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return Explanation(
        RESERVED,
        f"held back by backfill: the nodes it could use are reserved for workload {holder} {when}; "
        "a declared max_duration that ends before then lets it start now",
    )


def blocked(ahead_of: int) -> Explanation:
    return Explanation(BLOCKED, f"waiting behind workload {ahead_of} (strict order)")
