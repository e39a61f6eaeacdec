"""What /metrics exports about GPUs: each GPU's own series under its hardware labels only, and who holds it as
series of their own (`gpupool_gpu_allocation_info`, one per holder), so a GPU's series stay one series while
its holders come and go."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from prometheus_client.samples import Sample
from sqlalchemy import select

from gpupool.control import queues
from gpupool.control.autoscale import Word
from gpupool.control.metrics import GPU_LABELS, PoolCollector
from gpupool.control.telemetry import Holder, TelemetryCache
from gpupool.gpu.types import GpuSample
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Gpu, Node, Workload

PRODUCT = "NVIDIA H100 80GB HBM3"


def add_node(store: Store, name: str, gpus: int) -> None:
    with store.session() as s:
        node = Node(name=name, state="ready", state_reason="", labels={})
        s.add(node)
        s.flush()
        for index in range(gpus):
            s.add(Gpu(node_id=node.id, index=index, uuid=f"GPU-{name}-{index}", model="H100",
                      product_name=PRODUCT))  # fmt: skip


def run(
    store: Store,
    queue: str,
    user: str,
    node: str,
    indices: list[int],
    fraction: float = 0.0,
    pods: list[dict[str, Any]] | None = None,
    kind: str = "job",
) -> int:
    """A running workload with its running attempt; its id."""
    with store.session() as s:
        workload = Workload(name=f"{queue}-{user}", kind=kind, queue=queue, user=user, spec={},
                            state="running", version=1)  # fmt: skip
        s.add(workload)
        s.flush()
        s.add(Attempt(workload_id=workload.id, queue=queue, number=0, state="running", node_name=node,
                      gpu_indices=indices, gpu_fraction=fraction, pods=pods or [],
                      started_at=datetime.now(UTC)))  # fmt: skip
        return workload.id


def finish(store: Store, wid: int) -> None:
    with store.session() as s:
        s.scalars(select(Workload).where(Workload.id == wid)).one().state = "succeeded"
        s.scalars(select(Attempt).where(Attempt.workload_id == wid)).one().state = "succeeded"


def sample(node: str, index: int) -> dict[str, object]:
    reading = GpuSample(index=index, uuid=f"GPU-{node}-{index}", at=0.0, utilization_pct=50.0,
                        memory_used_bytes=1 << 30, memory_total_bytes=80 << 30, temperature_c=60.0,
                        power_w=300.0, energy_j=10.0, sm_clock_mhz=1980.0, mem_clock_mhz=2619.0)  # fmt: skip
    return reading.to_dict()


def scrape(collector: PoolCollector) -> dict[str, list[Sample]]:
    samples: dict[str, list[Sample]] = {}
    for family in collector.collect():
        for s in family.samples:
            samples.setdefault(s.name, []).append(s)
    return samples


def rows(samples: list[Sample], *keys: str) -> set[tuple[str | float, ...]]:
    return {(*(s.labels[k] for k in keys), s.value) for s in samples}


def test_two_holders_of_one_fractional_gpu_are_two_allocation_rows(store: Store) -> None:
    add_node(store, "node-1", 8)
    nlp = run(store, "nlp", "alice", "node-1", [7], fraction=0.5)
    cv = run(store, "cv", "bob", "node-1", [7], fraction=0.5)
    telemetry = TelemetryCache()
    telemetry.put("node-1", [sample("node-1", 7)])

    scraped = scrape(PoolCollector(store, telemetry, None, dict))

    info = scraped["gpupool_gpu_allocation_info"]
    assert rows(info, "Hostname", "gpu", "UUID", "workload", "queue", "user") == {
        ("node-1", "7", "GPU-node-1-7", str(nlp), "nlp", "alice", 1.0),
        ("node-1", "7", "GPU-node-1-7", str(cv), "cv", "bob", 1.0),
    }
    assert rows(scraped["gpupool_gpu_allocation_fraction"], "workload", "queue") == {
        (str(nlp), "nlp", 0.5),
        (str(cv), "cv", 0.5),
    }
    (util,) = scraped["DCGM_FI_DEV_GPU_UTIL"]  # the GPU is one series, whoever shares it
    assert util.labels == {"gpu": "7", "UUID": "GPU-node-1-7", "device": "nvidia7", "modelName": PRODUCT,
                           "Hostname": "node-1"}  # fmt: skip


def test_a_gang_is_a_holder_of_every_gpu_of_every_pod(store: Store) -> None:
    add_node(store, "a", 2)
    add_node(store, "b", 2)
    pods = [{"node": "a", "gpu_indices": [0, 1]}, {"node": "b", "gpu_indices": [0, 1], "gpu_fraction": 1.0}]
    gang = run(store, "nlp", "alice", "a", [0, 1], pods=pods)

    info = scrape(PoolCollector(store, TelemetryCache(), None, dict))["gpupool_gpu_allocation_info"]

    assert rows(info, "Hostname", "gpu", "workload") == {
        (node, str(gpu), str(gang), 1.0) for node in ("a", "b") for gpu in (0, 1)
    }
    assert {s.labels["UUID"] for s in info} == {f"GPU-{n}-{g}" for n in ("a", "b") for g in (0, 1)}


def test_a_gpus_own_series_keep_their_labels_when_its_holder_changes(store: Store) -> None:
    """A hot GPU's GpuTooHot timer, and its ECC counter's increase(), span the jobs that come and go on it."""
    add_node(store, "node-1", 1)
    holders: dict[tuple[str, int], list[Holder]] = {}
    telemetry = TelemetryCache()
    telemetry.attribute_with(lambda: holders)  # the samples' own attribution changes too
    collector = PoolCollector(store, telemetry, None, dict)

    def look() -> tuple[dict[str, set[tuple[tuple[str, str], ...]]], set[tuple[str | float, ...]]]:
        telemetry.put("node-1", [sample("node-1", 0)])
        scraped = scrape(collector)
        own = {
            name: {tuple(sorted(s.labels.items())) for s in found}
            for name, found in scraped.items()
            if "Hostname" in found[0].labels and not name.startswith("gpupool_gpu_allocation_")
        }
        held = rows(scraped.get("gpupool_gpu_allocation_info", []), "workload", "queue", "user")
        return own, held

    idle, nobody = look()
    first = run(store, "nlp", "alice", "node-1", [0])
    holders[("node-1", 0)] = [Holder(first, "train", "nlp", "alice")]
    busy, held_first = look()
    finish(store, first)
    second = run(store, "cv", "bob", "node-1", [0])
    holders[("node-1", 0)] = [Holder(second, "eval", "cv", "bob")]
    still, held_second = look()

    assert len(idle) >= 20 and all(len(series) == 1 for series in idle.values())
    assert idle == busy == still
    assert all(dict(labels).keys() == set(GPU_LABELS) for series in idle.values() for labels in series)
    assert nobody == set()
    assert held_first == {(str(first), "nlp", "alice", 1.0)}
    assert held_second == {(str(second), "cv", "bob", 1.0)}


def test_held_back_gpus_name_every_reason_that_holds_work_back(store: Store) -> None:
    (family,) = [f for f in PoolCollector(store, TelemetryCache(), None, dict).collect()
                 if f.name == "gpupool_queue_held_back_gpus"]  # fmt: skip
    missing = [code for code in sorted(queues.HELD_BACK) if code not in family.documentation]
    assert not missing, f"gpupool_queue_held_back_gpus' help does not name {missing}"


def test_an_autoscaled_services_series_carry_its_queue(store: Store) -> None:
    add_node(store, "node-1", 1)
    sid = run(store, "serve", "alice", "node-1", [0], kind="service")
    word = Word(name="llm", metric="rps", load=12.0, window=60.0, target=5.0, wanted=3, replicas=2, min=1,
                max=4, at=0.0)  # fmt: skip
    words: Mapping[int, Word] = {sid: word, sid + 100: word}  # the second deleted since the last look

    scraped = scrape(PoolCollector(store, TelemetryCache(), None, dict, autoscaling=lambda: words))

    assert rows(scraped["gpupool_service_load"], "workload", "name", "queue", "metric") == {
        (str(sid), "llm", "serve", "rps", 12.0)
    }
    assert rows(scraped["gpupool_service_replicas"], "workload", "queue", "kind") == {
        (str(sid), "serve", kind, value)
        for kind, value in (("wanted", 3.0), ("count", 2.0), ("min", 1.0), ("max", 4.0))
    }
