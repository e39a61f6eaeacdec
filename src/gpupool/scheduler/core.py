"""`decide(snapshot, now) -> Decisions`: the scheduler's single entry point. Pure: no I/O, no clock.

This first policy is priority, then FIFO, with skipping: each pending workload in order takes the first
node that fits it; queue GPU limits are never exceeded. The full policy (fair share, reclaim, preemption,
gangs across nodes) replaces this body behind the same signature.
"""

from __future__ import annotations

from dataclasses import replace

from gpupool.scheduler.placement import EPSILON, choose_gpus, why_not
from gpupool.scheduler.snapshot import Bind, Decisions, NodeView, Snapshot, WorkloadView


def decide(snapshot: Snapshot, now: float) -> Decisions:
    del now  # no time-based policy yet; kept so every policy has the same signature
    decisions = Decisions()
    nodes = {node.name: node for node in snapshot.nodes}
    queue_used = {q.name: q.gpus_allocated for q in snapshot.queues}
    queue_limit = {q.name: q.gpu_limit for q in snapshot.queues}
    schedulable = [n for n in snapshot.nodes if n.schedulable]

    for workload in sorted(snapshot.pending, key=lambda w: (-w.priority, w.submit_time, w.id)):
        if workload.nodes > 1:
            decisions.pending_reasons[workload.id] = (
                f"needs {workload.nodes} nodes at once; multi-node gangs are placed by node agents, "
                f"and this pool has {len(schedulable)} schedulable node(s)"
            )
            continue
        limit = queue_limit.get(workload.queue)
        if limit is not None and queue_used.get(workload.queue, 0.0) + workload.gpus.count > limit + EPSILON:
            decisions.pending_reasons[workload.id] = (
                f"queue {workload.queue} is at its GPU limit "
                f"({queue_used.get(workload.queue, 0.0):g} of {limit:g} in use)"
            )
            continue
        placed = _place(workload, [nodes[n.name] for n in schedulable])
        if placed is None:
            decisions.pending_reasons[workload.id] = _explain(workload, list(nodes.values()))
            continue
        bind, node = placed
        nodes[node.name] = node
        queue_used[workload.queue] = queue_used.get(workload.queue, 0.0) + workload.gpus.count
        decisions.binds.append(bind)
    return decisions


def _place(workload: WorkloadView, candidates: list[NodeView]) -> tuple[Bind, NodeView] | None:
    for node in candidates:
        if node.cpus and node.cpus - node.cpus_allocated + EPSILON < workload.cpus:
            continue
        if node.memory_bytes and node.memory_bytes - node.memory_allocated < workload.memory_bytes:
            continue
        chosen = choose_gpus(node, workload.gpus)
        if chosen is None:
            continue
        indices, fraction = chosen
        taken = set(indices)
        gpus = tuple(
            replace(g, allocated=g.allocated + fraction) if g.index in taken else g for g in node.gpus
        )
        updated = replace(
            node,
            gpus=gpus,
            cpus_allocated=node.cpus_allocated + workload.cpus,
            memory_allocated=node.memory_allocated + workload.memory_bytes,
        )
        return Bind(workload.id, node.name, indices, fraction), updated
    return None


def _explain(workload: WorkloadView, nodes: list[NodeView]) -> str:
    if not nodes:
        return "no nodes in the pool"
    wanted = workload.gpus
    what = f"{wanted.count:g} GPU" + ("" if wanted.count == 1 else "s")
    if wanted.models:
        what += f" ({'|'.join(wanted.models)})"
    details = []
    for node in nodes:
        if node.schedulable and node.cpus and node.cpus - node.cpus_allocated + EPSILON < workload.cpus:
            details.append(f"{node.name}: {node.cpus - node.cpus_allocated:g} of {node.cpus:g} CPUs free")
        elif (
            node.schedulable
            and node.memory_bytes
            and (node.memory_bytes - node.memory_allocated < workload.memory_bytes)
        ):
            details.append(f"{node.name}: not enough free memory")
        else:
            details.append(why_not(node, wanted))
    return f"waiting for {what} on one node; " + "; ".join(details)
