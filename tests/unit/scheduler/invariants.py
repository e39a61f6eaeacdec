"""Rules every `decide` result must keep, whatever the policy: checked on every scenario and by hypothesis.

Each check returns a list of problems (empty when the decisions are sound), so a failure names all of them.
GPU accounting is strict: a GPU held by an evicted or stopping workload is not free until it has stopped,
so binds must fit on top of *all* running work. Limits and quotas are checked leniently (evicted and
stopping work no longer counts), so these checks never fail a policy choice the issue leaves open.
"""

from __future__ import annotations

from collections import defaultdict

from gpupool.scheduler.snapshot import Decisions, NodeView, QueueView, Snapshot, WorkloadView

EPS = 1e-6
REASON_CODES = frozenset(
    {
        "queue-limit",
        "over-quota-nonpreemptible",
        "no-capacity",
        "fragmented",
        "no-matching-gpu",
        "too-large",
        "waiting-for-release",
        "reserved",
        "blocked",
        "over-fair-share",
        "stopping-limit",
    }
)
EVICTION_CODES = frozenset({"reclaim", "preempt", "consolidate", "stale-gang"})
FAILED_NODE_STATES = frozenset({"lost", "unhealthy"})


def gpu_fits(gpu_model: str, gpu_memory: int, models: tuple[str, ...], min_memory: int | None) -> bool:
    """Whether a GPU satisfies a demand's model and memory constraints (models compare upper-cased)."""
    if min_memory is not None and gpu_memory < min_memory:
        return False
    return not models or gpu_model.upper() in {m.upper() for m in models}


def ancestors(queue: str, queues: dict[str, QueueView]) -> list[str]:
    """The queue itself, then its parent, up to the root."""
    chain: list[str] = []
    name: str | None = queue
    while name is not None and name in queues and name not in chain:
        chain.append(name)
        name = queues[name].parent
    return chain


def min_runtime(queue: str, queues: dict[str, QueueView], kind: str) -> float:
    """A queue's `min_runtime_preempt` / `min_runtime_reclaim`, inherited from its parents (0 at the root)."""
    for name in ancestors(queue, queues):
        value: float | None = getattr(queues[name], f"min_runtime_{kind}")
        if value is not None:
            return value
    return 0.0


def check_decisions(snapshot: Snapshot, now: float, decisions: Decisions) -> list[str]:
    """Every problem with `decisions` for `snapshot` that no policy may cause."""
    problems: list[str] = []
    problems += _check_ids(snapshot, decisions)
    if problems:
        return problems  # the other checks assume ids are sound
    problems += _check_bind_shapes(snapshot, decisions)
    problems += _check_no_overcommit(snapshot, decisions)
    problems += _check_limits_and_quotas(snapshot, decisions)
    problems += _check_evictions(snapshot, now, decisions)
    problems += _check_stopping_limit(snapshot, decisions)
    problems += _check_explanations(snapshot, decisions)
    return problems


def _check_stopping_limit(snapshot: Snapshot, decisions: Decisions) -> list[str]:
    """`max_stopping_gpus`: each gainer's evictions (reclaim, preempt, consolidate) keep the GPUs stopping for
    waiting work (the snapshot's stopping work that names its gainer, and this cycle's evictions before them)
    within the limit, unless nothing was stopping yet."""
    limit = snapshot.config.max_stopping_gpus
    if limit is None:
        return []
    running = {w.id: w for w in snapshot.running}
    stopping = sum(w.gpu_units for w in snapshot.running if w.stopping and w.evicted_for is not None)
    sets: list[tuple[int | None, float]] = []  # (gainer, GPUs), one entry per run of one gainer's evictions
    for e in decisions.evictions:
        if e.code == "stale-gang":
            continue
        gpus = running[e.workload_id].gpu_units
        if sets and sets[-1][0] == e.for_workload:
            sets[-1] = (e.for_workload, sets[-1][1] + gpus)
        else:
            sets.append((e.for_workload, gpus))
    problems = []
    for gainer, gpus in sets:
        if stopping > 0 and stopping + gpus > limit + EPS:
            problems.append(
                f"evictions for {gainer} stop {gpus:g} GPUs with {stopping:g} stopping: "
                f"over max_stopping_gpus {limit:g}"
            )
        stopping += gpus
    return problems


def _check_ids(snapshot: Snapshot, decisions: Decisions) -> list[str]:
    problems: list[str] = []
    pending = {w.id for w in snapshot.pending}
    running = {w.id for w in snapshot.running}
    bound = [b.workload_id for b in decisions.binds]
    evicted = [e.workload_id for e in decisions.evictions]
    for wid in sorted(set(bound)):
        if bound.count(wid) > 1:
            problems.append(f"workload {wid} is bound {bound.count(wid)} times")
        if wid not in pending:
            problems.append(f"bind of {wid}, which is not a pending workload")
    for wid in sorted(set(evicted)):
        if evicted.count(wid) > 1:
            problems.append(f"workload {wid} is evicted {evicted.count(wid)} times")
        if wid not in running:
            problems.append(f"eviction of {wid}, which is not a running workload")
    return problems


def _check_bind_shapes(snapshot: Snapshot, decisions: Decisions) -> list[str]:
    """Gangs are atomic and every pod sits on real, matching GPUs of a schedulable node."""
    problems: list[str] = []
    workloads = {w.id: w for w in snapshot.pending}
    nodes = {n.name: n for n in snapshot.nodes}
    for bind in decisions.binds:
        w = workloads[bind.workload_id]
        if len(bind.pods) != w.nodes:
            problems.append(f"bind {w.id}: {len(bind.pods)} pod(s) for a gang of {w.nodes}")
        taken: set[tuple[str, int]] = set()
        for pod in bind.pods:
            node = nodes.get(pod.node)
            if node is None:
                problems.append(f"bind {w.id}: unknown node {pod.node}")
                continue
            if not node.schedulable:
                problems.append(f"bind {w.id}: node {pod.node} is not schedulable ({node.state})")
            problems += _check_pod_gpus(w, node, pod.gpu_indices, pod.gpu_fraction)
            for index in pod.gpu_indices:
                if (pod.node, index) in taken:
                    problems.append(f"bind {w.id}: two pods of one gang share GPU {index} of {pod.node}")
                taken.add((pod.node, index))
        if w.topology is not None:
            domains = {nodes[p.node].label(w.topology) for p in bind.pods if p.node in nodes}
            if len(domains) != 1 or None in domains:
                problems.append(f"bind {w.id}: pods span {w.topology} domains {sorted(map(str, domains))}")
    return problems


def _check_pod_gpus(w: WorkloadView, node: NodeView, indices: tuple[int, ...], fraction: float) -> list[str]:
    problems: list[str] = []
    demand = w.gpus
    if len(set(indices)) != len(indices):
        problems.append(f"bind {w.id}: a GPU index repeats in one pod {indices}")
    if demand.count <= 0:
        if indices:
            problems.append(f"bind {w.id}: a pod that asks for no GPU got GPUs {indices}")
        return problems
    if demand.is_fractional:
        if len(indices) != 1 or abs(fraction - demand.count) > EPS:
            problems.append(f"bind {w.id}: a pod of {demand.count} GPU got {indices} x {fraction}")
    elif len(indices) != int(demand.count) or abs(fraction - 1.0) > EPS:
        problems.append(f"bind {w.id}: a pod of {demand.count:g} GPUs got {indices} x {fraction}")
    gpus = {g.index: g for g in node.gpus}
    for index in indices:
        gpu = gpus.get(index)
        if gpu is None:
            problems.append(f"bind {w.id}: {node.name} has no GPU {index}")
        elif not gpu_fits(gpu.model, gpu.memory_bytes, demand.models, demand.min_memory_bytes):
            problems.append(
                f"bind {w.id}: GPU {index} of {node.name} ({gpu.model}) does not match the demand"
            )
    return problems


def _check_no_overcommit(snapshot: Snapshot, decisions: Decisions) -> list[str]:
    """Binds fit on top of foreign use and ALL running work (evicted GPUs are busy until released)."""
    problems: list[str] = []
    used: dict[tuple[str, int], float] = defaultdict(float)
    cpus: dict[str, float] = defaultdict(float)
    memory: dict[str, float] = defaultdict(float)
    nodes = {n.name: n for n in snapshot.nodes}
    for node in snapshot.nodes:
        cpus[node.name] = node.cpus_allocated
        memory[node.name] = node.memory_allocated
        for gpu in node.gpus:
            used[(node.name, gpu.index)] = gpu.allocated
    for w in snapshot.running:
        for pod in w.placement:
            cpus[pod.node] += w.cpus
            memory[pod.node] += w.memory_bytes
            for index in pod.gpu_indices:
                used[(pod.node, index)] += pod.gpu_fraction
    touched_gpus: set[tuple[str, int]] = set()
    touched_nodes: set[str] = set()
    pending = {w.id: w for w in snapshot.pending}
    for bind in decisions.binds:
        w = pending[bind.workload_id]
        for pod in bind.pods:
            touched_nodes.add(pod.node)
            cpus[pod.node] += w.cpus
            memory[pod.node] += w.memory_bytes
            for index in pod.gpu_indices:
                used[(pod.node, index)] += pod.gpu_fraction
                touched_gpus.add((pod.node, index))
    for key in sorted(touched_gpus):
        if used[key] > 1 + EPS:
            problems.append(f"GPU {key[1]} of {key[0]} is over-committed: {used[key]:g} of 1")
    for name in sorted(touched_nodes & nodes.keys()):
        node = nodes[name]
        if node.cpus > 0 and cpus[name] > node.cpus + EPS:
            problems.append(f"node {name}: {cpus[name]:g} of {node.cpus:g} CPUs committed")
        if node.memory_bytes > 0 and memory[name] > node.memory_bytes + EPS:
            problems.append(f"node {name}: {memory[name]:g} of {node.memory_bytes} memory bytes committed")
    return problems


def _check_limits_and_quotas(snapshot: Snapshot, decisions: Decisions) -> list[str]:
    """Binds never take a queue (or an ancestor) past its limit, nor non-preemptible work past quota."""
    problems: list[str] = []
    queues = {q.name: q for q in snapshot.queues}
    evicted = {e.workload_id for e in decisions.evictions}
    bound = {b.workload_id for b in decisions.binds}
    staying = [w for w in snapshot.running if w.id not in evicted and not w.stopping]
    arriving = [w for w in snapshot.pending if w.id in bound]
    gaining: set[str] = {name for w in arriving for name in ancestors(w.queue, queues)}
    for name in sorted(gaining):
        queue = queues[name]
        for resource in ("gpu", "cpu", "memory"):
            limit = queue.share(resource).limit
            if limit is None:
                continue
            total = sum(w.demand(resource) for w in staying + arriving if name in ancestors(w.queue, queues))
            if total > limit + EPS:
                problems.append(
                    f"queue {name} exceeds its {resource} limit after binds: {total:g} > {limit:g}"
                )
    for w in arriving:
        if w.preemptible or w.queue not in queues:
            continue
        quota = queues[w.queue].gpu.quota
        total = sum(x.gpu_units for x in staying + arriving if x.queue == w.queue and not x.preemptible)
        if total > quota + EPS:
            problems.append(
                f"non-preemptible work of queue {w.queue} exceeds its GPU quota after binding {w.id}: "
                f"{total:g} > {quota:g}"
            )
    return problems


def _check_evictions(snapshot: Snapshot, now: float, decisions: Decisions) -> list[str]:
    problems: list[str] = []
    queues = {q.name: q for q in snapshot.queues}
    running = {w.id: w for w in snapshot.running}
    pending = {w.id: w for w in snapshot.pending}
    nodes = {n.name: n for n in snapshot.nodes}
    bound = {b.workload_id for b in decisions.binds}
    for e in decisions.evictions:
        victim = running[e.workload_id]
        if e.code not in EVICTION_CODES:
            problems.append(f"eviction {victim.id}: unknown code {e.code!r}")
            continue
        if victim.stopping:
            problems.append(f"eviction {victim.id} ({e.code}): it is already stopping")
        if e.code == "stale-gang":
            if not any(
                nodes.get(p.node) is None or nodes[p.node].state in FAILED_NODE_STATES
                for p in victim.placement
            ):
                problems.append(f"eviction {victim.id} (stale-gang): no pod is on a lost or unhealthy node")
            continue
        if not victim.preemptible:
            problems.append(f"eviction {victim.id} ({e.code}): it is not preemptible")
        beneficiary = pending.get(e.for_workload) if e.for_workload is not None else None
        if beneficiary is None:
            problems.append(f"eviction {victim.id} ({e.code}): for_workload {e.for_workload} is not pending")
            continue
        if beneficiary.id in bound:
            problems.append(
                f"eviction {victim.id} ({e.code}) for {beneficiary.id}, which is bound in the same cycle"
            )
        if e.code == "preempt":
            if victim.queue != beneficiary.queue:
                problems.append(
                    f"preempt of {victim.id} crosses queues ({victim.queue} -> {beneficiary.queue})"
                )
            if victim.priority >= beneficiary.priority:
                problems.append(
                    f"preempt of {victim.id} (priority {victim.priority}) for {beneficiary.id} "
                    f"(priority {beneficiary.priority})"
                )
        if e.code == "reclaim" and victim.queue == beneficiary.queue:
            problems.append(f"reclaim of {victim.id} inside its own queue {victim.queue}")
        if e.code in ("reclaim", "preempt"):
            age = now - (victim.start_time if victim.start_time is not None else now)
            protected = min_runtime(victim.queue, queues, "reclaim" if e.code == "reclaim" else "preempt")
            if age < protected - EPS:
                problems.append(
                    f"{e.code} of {victim.id} after {age:g}s, inside its min runtime {protected:g}s"
                )
    return problems


def _check_explanations(snapshot: Snapshot, decisions: Decisions) -> list[str]:
    problems: list[str] = []
    bound = {b.workload_id for b in decisions.binds}
    for w in snapshot.pending:
        if w.id in bound:
            continue
        explanation = decisions.explanations.get(w.id)
        if explanation is None:
            problems.append(f"pending workload {w.id} is neither bound nor explained")
        elif explanation.code not in REASON_CODES:
            problems.append(f"pending workload {w.id}: unknown reason code {explanation.code!r}")
        elif not explanation.message.strip():
            problems.append(f"pending workload {w.id}: explanation {explanation.code} has no message")
    # An explanation says why a workload still waits: none for work that starts, or that is not pending
    # (the scheduler counts on it, see Prepared.explained_all); room is nominated only for explained work.
    waiting = {w.id for w in snapshot.pending} - bound
    for workload_id in decisions.explanations:
        if workload_id not in waiting:
            problems.append(f"workload {workload_id} is explained but is not pending or is bound")
    for workload_id in decisions.nominated:
        if workload_id not in waiting or workload_id not in decisions.explanations:
            problems.append(f"workload {workload_id} has room nominated but is not a pending, explained one")
    return problems


def reclaim_problems(snapshot: Snapshot, decisions: Decisions) -> list[str]:
    """Reclaim keeps every victim queue (and its ancestors) at or above its fair share, and no reclaimer
    above its own; or, reclaiming by quota, takes from a victim queue only while it is above its GPU quota
    (it ends below it by less than its largest victim: a job that borrows goes whole) and keeps every queue
    it gave to within its own. Allocation = running, non-stopping GPU units, plus this cycle's binds,
    less work it evicts for other reasons but preemptions made after reclaim's (use on snapshots without
    stopping work)."""
    problems: list[str] = []
    queues = {q.name: q for q in snapshot.queues}
    running = {w.id: w for w in snapshot.running}
    pending = {w.id: w for w in snapshot.pending}
    allocated: dict[str, float] = defaultdict(float)
    for w in snapshot.running:
        for name in ancestors(w.queue, queues):
            allocated[name] += w.gpu_units
    # Fair shares hold for the allocation the decisions leave behind: this cycle's binds count, and work
    # evicted for any reason (a stale gang, say) no longer does.
    # (Preempt and consolidate hand the room to a workload of their own: that one counts instead.)
    # Preemptions decided after reclaim's last eviction (decisions list evictions in the order made) are
    # a queue's own choice among its work, made once reclaim was done: they do not count against it.
    last_reclaim = max((i for i, e in enumerate(decisions.evictions) if e.code == "reclaim"), default=-1)
    gainers: set[int] = set()
    for i, e in enumerate(decisions.evictions):
        if e.code == "preempt" and i > last_reclaim:
            continue
        if e.code != "reclaim" and e.workload_id in running:
            for name in ancestors(running[e.workload_id].queue, queues):
                allocated[name] -= running[e.workload_id].gpu_units
            if e.for_workload in pending:
                gainers.add(e.for_workload)
    for gainer in gainers:
        for name in ancestors(pending[gainer].queue, queues):
            allocated[name] += pending[gainer].gpu_units
    for bind in decisions.binds:
        if bind.workload_id in pending:
            for name in ancestors(pending[bind.workload_id].queue, queues):
                allocated[name] += pending[bind.workload_id].gpu_units
    reclaimed: dict[str, float] = defaultdict(float)
    largest: dict[str, float] = defaultdict(float)  # the largest victim reclaim took from each level
    beneficiaries: dict[str, set[int]] = defaultdict(set)
    for e in decisions.evictions:
        if e.code != "reclaim":
            continue
        for name in ancestors(running[e.workload_id].queue, queues):
            reclaimed[name] += running[e.workload_id].gpu_units
            largest[name] = max(largest[name], running[e.workload_id].gpu_units)
        if e.for_workload in pending:
            for name in ancestors(pending[e.for_workload].queue, queues):
                beneficiaries[name].add(e.for_workload)
    victims = set(reclaimed)
    for name in sorted(victims):
        share = decisions.fair_shares.get(name, {}).get("gpu")
        if share is None:
            problems.append(f"queue {name} lost work to reclaim but has no gpu fair share in the decisions")
            continue
        after = allocated[name] - reclaimed[name]
        if after < share - EPS and name not in beneficiaries:
            # By quota, a queue above its quota may lose a job that borrows whole: it ends below its
            # quota by less than its largest victim (it was above its quota before that one went).
            quota = _quota(queues, name)
            if after + largest[name] < quota + EPS:
                problems.append(
                    f"reclaim takes queue {name} below its fair share ({after:g} < {share:g}) and below its "
                    f"quota by its largest victim or more ({after:g} + {largest[name]:g} <= {quota:g})"
                )
            for gainer, line in _gainers_of(name, decisions, running, pending, queues):
                if gainer in victims:
                    continue
                gained = allocated[gainer] + sum(pending[i].gpu_units for i in beneficiaries[gainer])
                if gained > _quota(queues, gainer) + EPS:
                    problems.append(
                        f"reclaim takes queue {name} below its fair share ({after:g} < {share:g}) for queue "
                        f"{gainer} ({line}), which ends above its quota ({gained:g})"
                    )
    for name, ids in sorted(beneficiaries.items()):
        if name in victims:
            continue  # a common ancestor of reclaimer and victim: its total does not grow
        share = decisions.fair_shares.get(name, {}).get("gpu")
        if share is None:
            continue
        after = allocated[name] + sum(pending[i].gpu_units for i in ids)
        if after > share + EPS:
            problems.append(f"reclaim takes queue {name} above its fair share: {after:g} > {share:g}")
    return problems


def _quota(queues: dict[str, QueueView], name: str) -> float:
    queue = queues.get(name)
    return queue.gpu.quota if queue is not None else 0.0


def _gainers_of(
    victim: str,
    decisions: Decisions,
    running: dict[int, WorkloadView],
    pending: dict[int, WorkloadView],
    queues: dict[str, QueueView],
) -> list[tuple[str, str]]:
    """The queues (and their ancestors) that reclaim evicted work under `victim` for, with the line."""
    out: list[tuple[str, str]] = []
    for e in decisions.evictions:
        if e.code != "reclaim" or e.for_workload not in pending:
            continue
        if victim not in ancestors(running[e.workload_id].queue, queues):
            continue
        line = pending[e.for_workload].queue
        out.extend((name, line) for name in ancestors(line, queues))
    return out
