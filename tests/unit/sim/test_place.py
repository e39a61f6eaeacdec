"""`sim place`: pods drawn from an openb pod list, placed with no departures, measured as FGD measures."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim import place as pl
from gpupool.sim.cluster import load_cluster
from gpupool.sim.errors import SimError

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
    "scheduled_time"
)


def write_cpu_starved(tmp_path: Path) -> tuple[Path, Path]:
    """Four 8-GPU nodes with 3 CPUs per GPU and four 2-GPU nodes with 32: pods of 2 CPUs per GPU fit the
    first kind, pods of 12 CPUs per GPU must go to the second or they strand GPUs."""
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"]
    nodes += [f"poor-{i},24000,262144,8,G2" for i in range(4)]
    nodes += [f"rich-{i},64000,262144,2,T4" for i in range(4)]
    shapes = [(2000, 1, 1000)] * 6 + [(12000, 1, 1000)] * 2 + [(16000, 0, 0), (2000, 1, 500)]
    pods = [HEADER] + [
        f"pod-{i},{cpu},4096,{n},{milli},,LS,Running,0,100,0" for i, (cpu, n, milli) in enumerate(shapes)
    ]
    (tmp_path / "nodes.csv").write_text("\n".join(nodes) + "\n")
    (tmp_path / "pods.csv").write_text("\n".join(pods) + "\n")
    return tmp_path / "pods.csv", tmp_path / "nodes.csv"


def test_pods_are_read_as_fractions_whole_gpus_cpu_only_and_model_lists(fixtures: Path) -> None:
    pods = {p.name: p for p in pl.load_pods(f"alibaba-openb:{fixtures / 'openb_pods.csv'}")}
    assert pods["openb-pod-0002"].gpus == 0.25 and pods["openb-pod-0002"].cpus == 16.0
    assert pods["openb-pod-0001"].gpus == 4 and pods["openb-pod-0001"].demand.models == ()
    assert pods["openb-pod-0004"].gpus == 0
    assert pods["openb-pod-0017"].demand.models == ("T4", "V100M32")  # as the product spells a request


def test_the_draw_is_seeded_and_stops_at_the_demand_asked(fixtures: Path) -> None:
    pods = pl.load_pods(f"alibaba-openb:{fixtures / 'openb_pods.csv'}")
    drawn = pl.draw(pods, 40.0, seed=42)
    assert [p.name for p in drawn] == [p.name for p in pl.draw(pods, 40.0, seed=42)]
    assert [p.name for p in drawn] != [p.name for p in pl.draw(pods, 40.0, seed=43)]
    arrived = sum(p.gpus for p in drawn)
    assert 1.3 * 40 <= arrived < 1.3 * 40 + max(p.gpus for p in pods)


def test_fragmentation_allocates_more_than_binpack_and_spread_where_cpus_run_out(tmp_path: Path) -> None:
    pods_csv, nodes_csv = write_cpu_starved(tmp_path)
    pods = pl.load_pods(f"alibaba-openb:{pods_csv}")
    cluster = load_cluster(f"alibaba-openb:{nodes_csv}")
    for seed in (1, 2, 42):
        drawn = pl.draw(pods, cluster.gpus, seed)
        at_100 = {name: pl.place(drawn, cluster, name)["alloc_ratio_at_100"] for name in pl.PLACEMENTS}
        assert at_100["fragmentation"] >= max(at_100["binpack"], at_100["spread"]) + 0.04, (seed, at_100)


def test_the_curve_rises_to_the_figure_at_full_demand(tmp_path: Path) -> None:
    pods_csv, nodes_csv = write_cpu_starved(tmp_path)
    cluster = load_cluster(f"alibaba-openb:{nodes_csv}")
    drawn = pl.draw(pl.load_pods(f"alibaba-openb:{pods_csv}"), cluster.gpus, 42)
    result = pl.place(drawn, cluster, "fragmentation")
    curve = list(result["curve"].values())
    assert curve == sorted(curve)
    assert result["curve"]["1.00"] == result["alloc_ratio_at_100"]
    for key, allocated in result["curve"].items():  # never more allocated than arrived, nor before the mark
        assert float(key) - 1e-9 <= result["curve_arrived"][key] and allocated <= result["curve_arrived"][key]
    assert result["alloc_ratio_at_100"] <= result["alloc_ratio_at_end"] <= 1.0
    assert result["pods_placed"] + result["gpu_pods_failed"] <= result["pods_drawn"]


def test_an_unknown_placement_names_the_flag_and_the_choices(fixtures: Path) -> None:
    cluster = load_cluster(f"alibaba-openb:{fixtures / 'openb_nodes.csv'}")
    pods = pl.load_pods(f"alibaba-openb:{fixtures / 'openb_pods.csv'}")
    with pytest.raises(SimError, match="binpack, spread, fragmentation") as raised:
        pl.place(pods[:3], cluster, "tetris")
    assert "--policy" in str(raised.value)
