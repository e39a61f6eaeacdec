"""The first scheduling policy, as a specification: priority, FIFO, whole GPUs, fractions, limits."""

from __future__ import annotations

from gpupool.scheduler import GpuDemand, GpuView, NodeView, QueueView, Snapshot, WorkloadView, decide

GB = 1_000_000_000


def node(
    name: str = "n1",
    gpus: int = 8,
    model: str = "H100",
    memory: int = 85 * GB,
    *,
    allocated: dict[int, float] | None = None,
    islands: list[int] | None = None,
    schedulable: bool = True,
    state: str = "ready",
) -> NodeView:
    allocated = allocated or {}
    islands = islands or [0] * gpus
    return NodeView(
        name=name,
        schedulable=schedulable,
        state=state,
        gpus=tuple(GpuView(i, model, memory, islands[i], allocated.get(i, 0.0)) for i in range(gpus)),
    )


def job(
    wid: int,
    gpus: float = 1,
    *,
    priority: int = 50,
    submit: float | None = None,
    queue: str = "q",
    models: tuple[str, ...] = (),
    memory: int | None = None,
    nodes: int = 1,
) -> WorkloadView:
    return WorkloadView(
        wid, queue, priority, float(wid if submit is None else submit), nodes, GpuDemand(gpus, models, memory)
    )


def test_whole_gpus_are_bound_lowest_index_first() -> None:
    d = decide(Snapshot((node(),), (job(1, 2), job(2, 3))), now=0)
    assert [(b.workload_id, b.gpu_indices) for b in d.binds] == [(1, (0, 1)), (2, (2, 3, 4))]


def test_higher_priority_goes_first_then_submit_order() -> None:
    d = decide(Snapshot((node(gpus=2),), (job(1, 2, priority=50), job(2, 2, priority=100))), now=0)
    assert [b.workload_id for b in d.binds] == [2]
    assert "waiting for 2 GPUs" in d.pending_reasons[1]


def test_a_gpu_is_never_given_twice() -> None:
    d = decide(Snapshot((node(gpus=4, allocated={0: 1.0, 2: 1.0}),), (job(1, 2), job(2, 1))), now=0)
    assert d.binds[0].gpu_indices == (1, 3)
    assert d.pending_reasons[2].endswith("0 of 4 matching GPUs free")


def test_a_multi_gpu_job_prefers_one_nvlink_island() -> None:
    islands = [0, 0, 0, 0, 1, 1, 1, 1]
    d = decide(Snapshot((node(allocated={0: 1.0, 1: 1.0}, islands=islands),), (job(1, 3),)), now=0)
    assert d.binds[0].gpu_indices == (4, 5, 6)


def test_fractions_share_one_gpu_before_opening_another() -> None:
    d = decide(Snapshot((node(gpus=2, allocated={1: 0.5}),), (job(1, 0.5), job(2, 0.5))), now=0)
    assert [(b.gpu_indices, b.gpu_fraction) for b in d.binds] == [((1,), 0.5), ((0,), 0.5)]


def test_gpu_model_and_memory_constraints_are_honoured() -> None:
    nodes = (node("a100", 4, "A100", 42 * GB), node("h100", 4, "H100", 85 * GB))
    d = decide(
        Snapshot(
            nodes,
            (
                job(1, 1, models=("H100",)),
                job(2, 1, memory=80 * GB),
                job(3, 1, models=("A100-80GB",)),
                job(4, 1, models=("A100", "L4")),
            ),
        ),
        now=0,
    )
    placed = {b.workload_id: b.node for b in d.binds}
    assert placed == {1: "h100", 2: "h100", 4: "a100"}
    assert "no GPU matching A100-80GB" in d.pending_reasons[3]


def test_cordoned_nodes_take_no_work_and_say_so() -> None:
    d = decide(Snapshot((node(schedulable=False, state="cordoned"),), (job(1),)), now=0)
    assert not d.binds and "n1 is cordoned" in d.pending_reasons[1]


def test_queue_gpu_limit_is_never_exceeded() -> None:
    queues = (QueueView("q", gpu_limit=4, gpus_allocated=2),)
    d = decide(Snapshot((node(),), (job(1, 2), job(2, 1)), queues), now=0)
    assert [b.workload_id for b in d.binds] == [1]
    assert "GPU limit" in d.pending_reasons[2]


def test_smaller_jobs_behind_a_blocked_one_still_start() -> None:
    d = decide(Snapshot((node(gpus=4, allocated={0: 1.0}),), (job(1, 4), job(2, 1))), now=0)
    assert [b.workload_id for b in d.binds] == [2]


def test_multi_node_gangs_wait_with_a_reason() -> None:
    d = decide(Snapshot((node(),), (job(1, 8, nodes=2),)), now=0)
    assert not d.binds and "needs 2 nodes" in d.pending_reasons[1]


def test_zero_gpu_jobs_run_without_gpus() -> None:
    d = decide(Snapshot((node(allocated=dict.fromkeys(range(8), 1.0)),), (job(1, 0),)), now=0)
    assert d.binds[0].gpu_indices == ()


def test_decide_is_deterministic() -> None:
    snapshot = Snapshot((node(), node("n2")), tuple(job(i, (i % 3) + 1) for i in range(1, 12)))
    assert decide(snapshot, 0) == decide(snapshot, 0)
