"""`same_shape`, asked field by field, agrees with comparing the shapes `Prepared._shape` builds."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from gpupool.scheduler.prepare import Prepared, same_shape
from gpupool.scheduler.snapshot import GpuDemand, SchedulerConfig, Snapshot
from tests.unit.scheduler.strategies import LEAF_NAMES, NOW, nodes, workload_specs

# The fields a copy takes from another workload, one at a time: each one the shape reads, and some not.
FIELDS = (
    "queue", "gpus", "cpus", "memory_bytes", "nodes", "topology", "topology_preferred", "node_names",
    "priority", "submit_time", "attained_service", "preemptible", "max_duration",
)  # fmt: skip


@given(st.data())
def test_same_shape_says_what_comparing_queue_and_shape_says(data: st.DataObject) -> None:
    a = data.draw(workload_specs(100, LEAF_NAMES))
    other = data.draw(workload_specs(101, LEAF_NAMES))
    labels = st.sampled_from([None, "rack"])
    other = replace(
        other,
        node_names=data.draw(st.sampled_from([frozenset(), frozenset({"n1"})])),
        topology=data.draw(labels),
        topology_preferred=data.draw(labels),
    )
    copies = [replace(a, id=101), replace(a, id=101, gpus=GpuDemand(a.gpus.count, a.gpus.models))]
    copies += [replace(a, id=101, **{field: getattr(other, field)}) for field in FIELDS]
    cluster = data.draw(nodes())
    for b in copies:
        prepared = Prepared(Snapshot(cluster, (a, b), (), (), SchedulerConfig()), NOW)
        assert prepared.state.reservation is None  # as reclaim asks it: with no reservation in force
        shapes_equal = (a.queue, prepared._shape(a)) == (b.queue, prepared._shape(b))
        assert same_shape(a, b) == shapes_equal, b
        assert same_shape(b, a) == shapes_equal, b
