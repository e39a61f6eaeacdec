"""Jobs the cluster cannot hold: a trace's single pod stays one pod, why each job is dropped is known (and
said) before the replay, and `--queues auto` shares the quotas among the jobs that are replayed."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim import experiment as ex
from gpupool.sim.cluster import load_cluster
from gpupool.sim.engine import Simulation, drop_reasons, shape
from gpupool.sim.errors import SimError
from gpupool.sim.policies import BY_NAME
from gpupool.sim.queues import auto_queues
from gpupool.sim.results import SimOptions
from gpupool.sim.trace import TraceJob

POD_COLUMNS = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time,scheduled_time"
)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_a_job_the_trace_calls_one_pod_must_fit_one_node_or_is_dropped() -> None:
    assert shape(8, 4, 1) == (1, 8)
    assert shape(8, 4) == (2, 4.0)  # the trace says nothing: a gang of whole nodes
    cluster = load_cluster("2x4")
    jobs = [TraceJob(0, 0.0, 100.0, 8, "a", nodes=1), TraceJob(1, 10.0, 100.0, 8, "a")]
    queues = auto_queues(jobs, cluster.gpus)
    result = Simulation(jobs, 0.0, cluster, queues, BY_NAME["fifo"], SimOptions()).run()
    assert result.dropped == [0]
    assert [(j.id, j.start, j.finish) for j in result.jobs] == [(1, 10.0, 110.0)]
    assert drop_reasons(jobs, cluster) == ["gpus", None]


def test_each_drop_has_its_own_reason_gpus_first_then_model_cpus_and_memory(tmp_path: Path) -> None:
    nodes = write(
        tmp_path / "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,4096,4,V100M32\nn2,32000,262144,2,T4\nn3,64000,262144,0,\n",
    )
    cluster = load_cluster(f"alibaba-openb:{nodes}", "--nodes")
    jobs = [
        TraceJob(0, 0.0, 60.0, 8, "a", nodes=1),  # no node has 8 GPUs
        TraceJob(1, 0.0, 60.0, 4, "a", gpu_models=("T4",), nodes=1),  # the T4 node has 2
        TraceJob(2, 0.0, 60.0, 1, "a", nodes=1, cpus=40.0),  # 64 CPUs only on the node without GPUs
        TraceJob(3, 0.0, 60.0, 4, "a", nodes=1, memory_bytes=8192 * 2**20),  # the 4-GPU node has 4 GiB
        TraceJob(4, 0.0, 60.0, 1, "a", nodes=1, memory_bytes=8192 * 2**20),  # fits the T4 node
        TraceJob(5, 0.0, 60.0, 0.5, "a", gpu_models=("A100",), nodes=1),
    ]
    assert drop_reasons(jobs, cluster) == ["gpus", "model", "cpus", "memory", None, "model"]
    sim = Simulation(jobs, 0.0, cluster, auto_queues(jobs, cluster.gpus), BY_NAME["gpupool"], SimOptions())
    assert sim.run().dropped == [0, 1, 2, 3, 5]  # the engine drops what was foreseen


def test_a_pod_list_none_of_whose_pods_fits_is_refused_before_any_replay_naming_memory_and_nodes(
    tmp_path: Path,
) -> None:
    """The node has 1,000 MiB, each pod asks 8,192: the error names --nodes (as given) and memory, and comes
    from `prepare`, before anything runs."""
    rows = "p1,4000,8192,1,500,,LS,0,3600,\np2,4000,8192,1,1000,,BE,10,70,20\n"
    pods = write(tmp_path / "pods.csv", f"{POD_COLUMNS}\n{rows}")
    nodes = write(tmp_path / "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model\nn1,32000,1000,2,V100\n")
    with pytest.raises(SimError) as caught:
        ex.prepare(f"alibaba-openb:{pods}", None, f"alibaba-openb:{nodes}", policies="fifo")
    assert caught.value.flag == "--nodes"
    message = str(caught.value)
    assert f"2 jobs selected and none fits 'alibaba-openb:{nodes}'" in message
    assert "2 ask for more memory per pod than any node with their GPUs has" in message, message
    assert "GPU model" not in message and "more GPUs" not in message


def test_the_drops_are_counted_by_reason_before_the_replay_and_said_with_the_flag(tmp_path: Path) -> None:
    trace = write(
        tmp_path / "jobs.csv",
        "submit_time,duration,num_gpus,queue,gpu_model\n0,600,2,a,\n5,60,16,a,\n9,60,1,b,H100\n12,60,4,b,\n",
    )
    experiment = ex.prepare(f"csv:{trace}", "1x8", policies="fifo")
    assert experiment.drops == {"gpus": 1, "model": 1}
    assert ex.dropped(experiment) == (
        "2 jobs of 4 dropped (--cluster): 1 asks for more GPUs than the cluster's nodes hold, 1 for a GPU "
        "model none of the nodes with enough GPUs has"
    )
    ex.run(experiment)
    assert experiment.metrics["fifo"]["dropped"] == 2


def test_auto_quotas_share_the_cluster_among_the_jobs_that_are_replayed(tmp_path: Path) -> None:
    """On 1x4, b's 8- and 16-GPU jobs and c's only job (a model the cluster lacks) are dropped: they demand
    nothing of the cluster. a's 7,230 and b's 28,800 GPU-seconds share its 4 GPUs, 1 and 3; c keeps a queue
    with no quota."""
    trace = write(
        tmp_path / "small.csv",
        "submit_time,duration,num_gpus,queue,gpu_model\n0,3600,1,a,\n10,1800,2,a,\n20,7200,4,b,\n"
        "30,600,8,b,H100\n40,60,0.5,a,\n50,1200,16,b,\n60,300,1,c,A100|H100\n",
    )
    experiment = ex.prepare(f"csv:{trace}", "1x4", queues="auto", policies="fifo")
    assert {q.name: q.gpu.quota for q in experiment.queues} == {"a": 1.0, "b": 3.0, "c": 0.0}
    assert [q.name for q in experiment.queues] == ["a", "b", "c"]
    assert all(q.gpu.limit is None and q.gpu.weight == 1.0 for q in experiment.queues)
