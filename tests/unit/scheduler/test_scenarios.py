"""Scheduler scenarios as data: every `scenarios/*.yaml` is one cluster state and the outcome it must get.

A file's name is the rule it proves. The format (read by `scenario_loader.py`; unknown keys are errors):

    description: One sentence saying the rule it proves.   # required
    now: 10000                   # the clock passed to decide (seconds; default 0)
    config: {placement: spread, blocking: strict, max_consolidation_moves: 1, usage_weight: 1}
                                 # any SchedulerConfig field; default SchedulerConfig()
    nodes:                       # defaults: 8 GPUs, model H100, GPU memory by model (H100 80GB, A100 80GB,
                                 # L4 24GB, ...), one NVLink island, 64 CPUs, 1000GB, state ready
      - {name: n1, gpus: 8, model: H100, gpu_memory: 80GB, islands: 4, labels: {rack: r1}}
      - {name: r2-, count: 2, labels: {rack: r2}}        # count expands the name: r2-1, r2-2
      - {name: x1, state: lost}   # ready|cordoned|draining|unhealthy|lost; schedulable = (state == ready)
                                  # unless `schedulable:` says otherwise. islands: a group size (4) or one
                                  # island number per GPU. foreign: {0: 0.5} = use outside the scheduler
    queues:                      # omitted: every queue a workload names exists with defaults; workloads
                                 # sit in leaf queues; ordering omitted = None (the config's ordering)
      - {name: a, gpu: 4}                                 # gpu: 4 is a quota of 4
      - {name: p, cpu: {quota: 16}, memory: {limit: 512GB}}
      - {name: b, parent: p, gpu: {quota: 4, limit: 8, weight: 2}, priority: 1, ordering: attained,
         min_runtime_preempt: 10m, min_runtime_reclaim: 600, usage: 36000}
    running:                     # id, queue (default q), gpus per pod, priority (number or class name,
                                 # default train = 50), preemptible (default true), start (default 0),
                                 # checkpoint (last_checkpoint_time), stopping, evicted_for (stopping
                                 # work: the pending workload its GPUs are for), max_duration, submit...
      - {id: 1, queue: a, on: {n1: [0, 1, 2, 3]}, start: 0}   # one entry per pod: node -> GPU indices
      - {id: 2, queue: a, gpus: 0.5, on: {n1: [4]}}            # a fraction: one index, gpus < 1
      - {id: 3, queue: a, on: [{r2-1: "0-3"}, {r2-1: "4-7"}]}  # list form: several pods on one node
    pending:                     # id, queue, gpus (4, "H100:2", "A100|H100:2", "80GB:1", 0.5; default 1),
                                 # nodes (gang size, default 1), priority, preemptible, submit (default =
                                 # the id, so ids give FIFO order), topology, topology_preferred,
                                 # max_duration, attained, estimate, cpus, memory, only_on (node names),
                                 # victims_stopped (work evicted for it has stopped since the last cycle),
                                 # nominated (the room an earlier cycle left it waiting for: {n1: "0-3"})
      - {id: 10, queue: b, gpus: 8, nodes: 2, topology: rack}
      - {id: 11, queue: a, gpus: "H100:2", priority: interactive, preemptible: false}
      - {id: 12, queue: b, gpus: 0.5, max_duration: 1h}
    expect:                      # each key is checked only when present; ids must exist in the scenario
      binds: {11: {n1: [5, 6]}, 12: any}     # EXACT set of bound ids; per id: any, a node per pod
                                 # (order-free: [r2-1, r2-2]), or node -> exact GPU indices; {} = none
      evictions: {3: reclaim for 10}         # EXACT set: code [for beneficiary]; {} = none
      reasons: {10: waiting-for-release}     # reason code of the listed pending workloads only
      fair_share: {a: 4, b: "14/3", p: {gpu: [">=4", "<6"], cpu: 16}}  # GPU unless a resource is
                                 # named; numbers match within 1e-6; comparisons: > < >= <=
      released_to: {}            # EXACT: stopping id -> the waiting id promised its GPUs; {} = none
      nominated: {10: {n2: "0-7"}}   # EXACT set, as binds: the room each waiting workload is to take

Every scenario is also checked against the invariants in `invariants.py` (no GPU over-committed, gangs
whole, limits kept, every unbound pending workload explained with a known code, ...).
"""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import pytest

from gpupool.scheduler import decide
from gpupool.scheduler.snapshot import Decisions, PodPlacement
from gpupool.spec.document import load_yaml
from tests.unit.scheduler.invariants import EVICTION_CODES, REASON_CODES, check_decisions
from tests.unit.scheduler.scenario_loader import PodWhere, Scenario, load_scenario, parse_scenario

SCENARIO_DIR = Path(__file__).parent / "scenarios"
SCENARIO_FILES = sorted(SCENARIO_DIR.glob("*.yaml"))


def test_the_scenario_set_is_complete_and_every_file_loads() -> None:
    assert len(SCENARIO_FILES) >= 45, f"only {len(SCENARIO_FILES)} scenarios in {SCENARIO_DIR}"
    for path in SCENARIO_FILES:
        scenario = load_scenario(path)
        expect = scenario.expect
        checked = [expect.binds, expect.evictions, expect.reasons, expect.fair_share, expect.released_to]
        assert any(x is not None for x in checked), f"{path.name} expects nothing"
        for code in (expect.reasons or {}).values():
            assert code in REASON_CODES, f"{path.name}: unknown reason code {code}"
        for code, _ in (expect.evictions or {}).values():
            assert code in EVICTION_CODES, f"{path.name}: unknown eviction code {code}"


def test_the_documented_format_loads() -> None:
    """The example in this module's docstring is a valid scenario, so the documentation cannot drift."""
    doc = __doc__ or ""
    block = doc[doc.index("    description:") : doc.index("Every scenario is also checked")]
    scenario = parse_scenario(load_yaml(textwrap.dedent(block), ""), "docstring")
    snapshot = scenario.snapshot
    assert [n.name for n in snapshot.nodes] == ["n1", "r2-1", "r2-2", "x1"]
    assert [g.nvlink_island for g in snapshot.nodes[0].gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert not snapshot.nodes[3].schedulable
    running = {w.id: w for w in snapshot.running}
    assert running[2].placement[0].gpu_fraction == 0.5
    assert [p.node for p in running[3].placement] == ["r2-1", "r2-1"]
    pending = {w.id: w for w in snapshot.pending}
    assert pending[11].gpus.models == ("H100",) and pending[11].priority == 75
    assert pending[12].max_duration == 3600
    queues = {q.name: q for q in snapshot.queues}
    assert queues["b"].min_runtime_preempt == 600 and queues["p"].memory.limit == 512e9
    assert scenario.expect.evictions == {3: ("reclaim", 10)}


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=[p.stem for p in SCENARIO_FILES])
def test_scenario(path: Path) -> None:
    scenario = load_scenario(path)
    decisions = decide(scenario.snapshot, scenario.now)
    mismatches = compare(scenario, decisions) + check_decisions(scenario.snapshot, scenario.now, decisions)
    if mismatches:
        pytest.fail(report(scenario, decisions, mismatches), pytrace=False)


def compare(scenario: Scenario, decisions: Decisions) -> list[str]:
    """What differs between the scenario's expectations and the decisions, one line each."""
    expect = scenario.expect
    out: list[str] = []
    binds = {b.workload_id: b.pods for b in decisions.binds}
    for label, expected, decided in (
        ("bind", expect.binds, binds),
        ("nominated", expect.nominated, decisions.nominated),
    ):
        if expected is None:
            continue
        if set(decided) != set(expected):
            out.append(f"{label}s: expected {sorted(expected)}, decided {sorted(decided)}")
        for wid, where in expected.items():
            if where is not None and wid in decided and not _pods_match(where, decided[wid]):
                shown = _show_pods(decided[wid])
                out.append(f"{label} {wid}: expected {_show_where(where)}, decided {shown}")
    evictions = {e.workload_id: e for e in decisions.evictions}
    if expect.evictions is not None:
        if set(evictions) != set(expect.evictions):
            wanted = {k: v[0] for k, v in expect.evictions.items()}
            got = {k: v.code for k, v in evictions.items()}
            out.append(f"evictions: expected {_show_map(wanted)}, decided {_show_map(got)}")
        for wid, (code, beneficiary) in expect.evictions.items():
            e = evictions.get(wid)
            if e is None:
                continue
            if e.code != code:
                out.append(f"eviction {wid}: expected code {code}, decided {e.code}")
            if beneficiary is not None and e.for_workload != beneficiary:
                out.append(f"eviction {wid}: expected for {beneficiary}, decided for {e.for_workload}")
    for wid, code in (expect.reasons or {}).items():
        if wid in binds:
            out.append(f"reason {wid}: expected pending with {code}, but it was bound")
        elif wid not in decisions.explanations:
            out.append(f"reason {wid}: expected {code}, decided no explanation")
        elif decisions.explanations[wid].code != code:
            out.append(f"reason {wid}: expected {code}, decided {decisions.explanations[wid].code}")
    if expect.released_to is not None and decisions.released_to != expect.released_to:
        out.append(f"released_to: expected {expect.released_to}, decided {decisions.released_to}")
    for queue, per_resource in (expect.fair_share or {}).items():
        for resource, conditions in per_resource.items():
            value = decisions.fair_shares.get(queue, {}).get(resource)
            if value is None:
                out.append(f"fair share {queue}.{resource}: expected {_show_conditions(conditions)}, missing")
                continue
            failed = [c for c in conditions if not c.holds(value)]
            if failed:
                wanted = _show_conditions(conditions)
                out.append(f"fair share {queue}.{resource}: expected {wanted}, decided {value:g}")
    return out


def _pods_match(expected: tuple[PodWhere, ...], pods: tuple[PodPlacement, ...]) -> bool:
    if len(expected) != len(pods):
        return False
    if Counter(p.node for p in expected) != Counter(p.node for p in pods):
        return False
    exact = Counter((p.node, tuple(sorted(p.gpus))) for p in expected if p.gpus is not None)
    decided = Counter((p.node, tuple(sorted(p.gpu_indices))) for p in pods)
    return all(decided[key] >= n for key, n in exact.items())


def report(scenario: Scenario, decisions: Decisions, mismatches: list[str]) -> str:
    """A failure a person can read: the rule, what differs, then everything the scheduler decided."""
    lines = [f"scenario {scenario.name}: {scenario.description}", ""]
    lines += [f"  MISMATCH  {m}" for m in mismatches]
    lines += ["", "decided:"]
    for b in sorted(decisions.binds, key=lambda b: b.workload_id):
        lines.append(f"  bind     {b.workload_id} -> {_show_pods(b.pods)}")
    for e in sorted(decisions.evictions, key=lambda e: e.workload_id):
        beneficiary = f" for {e.for_workload}" if e.for_workload is not None else ""
        lines.append(f"  evict    {e.workload_id} {e.code}{beneficiary}: {e.reason}")
    for wid, explanation in sorted(decisions.explanations.items()):
        lines.append(f"  pending  {wid} {explanation.code}: {explanation.message}")
    shares = ", ".join(f"{q}={r['gpu']:g}" for q, r in sorted(decisions.fair_shares.items()) if "gpu" in r)
    lines.append(f"  fair share (gpu): {shares or '-'}")
    return "\n".join(lines)


def _show_pods(pods: tuple[PodPlacement, ...]) -> str:
    parts = []
    for p in pods:
        share = f" x{p.gpu_fraction:g}" if p.gpu_fraction < 1 else ""
        parts.append(f"{p.node}{list(p.gpu_indices)}{share}")
    return " + ".join(parts) or "(no pods)"


def _show_where(where: tuple[PodWhere, ...]) -> str:
    return " + ".join(f"{p.node}{list(p.gpus) if p.gpus is not None else ''}" for p in where)


def _show_map(m: dict[int, str]) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in sorted(m.items())) + "}"


def _show_conditions(conditions: tuple[object, ...]) -> str:
    return " and ".join(str(c) for c in conditions)
