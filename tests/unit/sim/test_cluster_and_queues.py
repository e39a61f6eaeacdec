"""Clusters and queues of a simulation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim.cluster import load_cluster
from gpupool.sim.errors import SimError
from gpupool.sim.queues import auto_queues, load_queue_file, proportional, resolve_queues
from gpupool.sim.trace import TraceJob


def test_a_cluster_spec_builds_named_nodes_of_each_model() -> None:
    cluster = load_cluster("2x8:H100,1x4:A100")
    assert [n.name for n in cluster.nodes] == ["node-0", "node-1", "node-2"]
    assert [len(n.gpus) for n in cluster.nodes] == [8, 8, 4]
    assert cluster.nodes[2].gpus[0].model == "A100" and cluster.gpus == 20


def test_tiresias_and_openb_node_files(fixtures: Path, tmp_path: Path) -> None:
    spec = tmp_path / "n4g2.csv"
    spec.write_text("num_switch,num_node_p_switch,num_gpu_p_node,num_cpu_p_node,mem_p_node\n2,2,2,8,64\n")
    tiresias = load_cluster(f"tiresias:{spec}")
    assert tiresias.gpus == 8 and tiresias.nodes[3].label("rack") == "switch-1"
    openb = load_cluster(f"alibaba-openb:{fixtures / 'openb_nodes.csv'}")
    assert len(openb.nodes) == 11 and openb.gpus == 6 * 8 + 4 * 2
    assert openb.nodes[0].cpus == 96.0


@pytest.mark.parametrize("spec", ["64by8", "0x8", "slurm:foo"])
def test_a_bad_cluster_names_the_flag_and_the_expected_form(spec: str) -> None:
    with pytest.raises(SimError, match=r"--cluster: .*(NODESxGPUS|at least 1)"):
        load_cluster(spec)


def test_auto_quotas_follow_demanded_gpu_time_and_sum_to_the_cluster() -> None:
    jobs = [TraceJob(0, 0, 3600, 8, "big"), TraceJob(1, 0, 3600, 3, "mid"), TraceJob(2, 0, 60, 1, "tiny")]
    quotas = {q.name: q.gpu.quota for q in auto_queues(jobs, 64)}
    assert sum(quotas.values()) == 64
    assert quotas["big"] > quotas["mid"] > quotas["tiny"]
    assert proportional({"a": 1, "b": 1, "c": 1}, 10) == {"a": 4, "b": 3, "c": 3}


def test_a_queue_file_uses_the_products_queue_specs(fixtures: Path, tmp_path: Path) -> None:
    queues = {q.name: q for q in load_queue_file(fixtures / "queues.yaml")}
    assert queues["nlp"].gpu.quota == 12 and queues["vision"].gpu.limit == 16
    bad = tmp_path / "q.yaml"
    bad.write_text("- {name: nlp, resources: {gpu: {quota: 8, limit: 4}}}\n")
    with pytest.raises(SimError, match=r"--queues: .*queue 1.*limit"):
        load_queue_file(bad)
    with pytest.raises(SimError, match=r"--queues: .*no such file"):
        load_queue_file(tmp_path / "missing.yaml")


def test_an_openb_node_list_names_each_node_once_with_0_gpus_or_more(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    header = "sn,cpu_milli,memory_mib,gpu,model\n"
    nodes.write_text(header + "n0,8000,16384,2,A\nn1,8000,16384,2,A\nn0,8000,16384,2,A\n")
    with pytest.raises(SimError, match=r"--nodes: .* line 4: node 'n0' is listed twice \(line 2 too\)"):
        load_cluster(f"alibaba-openb:{nodes}", "--nodes")
    nodes.write_text(header + "n0,8000,16384,-2,A\n")
    with pytest.raises(SimError, match=r"--nodes: .* line 2: gpu -2 is negative"):
        load_cluster(f"alibaba-openb:{nodes}", "--nodes")


def test_a_queue_file_defines_each_queue_once_and_one_for_every_tenant(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text("- {name: a, resources: {gpu: {quota: 1}}}\n- {name: a, resources: {gpu: {quota: 3}}}\n")
    with pytest.raises(
        SimError, match=r"--queues: .*, queue 2: 'a' is defined twice; give each queue one entry"
    ):
        load_queue_file(path)
    path.write_text("- {name: a, resources: {gpu: {quota: 3}}}\n")
    jobs = [TraceJob(0, 0, 60, 1, "a"), TraceJob(1, 0, 60, 1, "b"), TraceJob(2, 5, 60, 1, "b")]
    with pytest.raises(SimError) as caught:
        resolve_queues(str(path), jobs, 8)
    assert "has no queue for the trace's tenant(s) 'b' (2 jobs); add them (quota 0" in str(caught.value)
    assert [q.name for q in resolve_queues(str(path), jobs[:1], 8)] == ["a"]
