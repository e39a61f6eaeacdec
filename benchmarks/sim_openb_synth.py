"""A seeded synthetic cluster and pod list in the alibaba-openb format, for `gpupool sim place`.

The real openb trace (alibaba/clusterdata, cluster-trace-gpu-v2023) is not on this machine. This writes
a stand-in with its published shape: 1,213 GPU nodes with 6,212 GPUs (8-, 4-, 2- and 1-GPU nodes of a few
models) plus CPU-only nodes, and pods that are CPU-only, a fraction of one GPU (gpu_milli < 1000), one
whole GPU, or 2/4/8 GPUs, some pinned to GPU models. Same seed, same files.

    python benchmarks/sim_openb_synth.py --seed 42 --out /tmp/openb-synth
    gpupool sim place --trace alibaba-openb:/tmp/openb-synth/pods.csv \
        --nodes alibaba-openb:/tmp/openb-synth/nodes.csv --policy binpack,spread --seed 42 --json out.json
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

# (GPUs per node, count, models to draw from, CPU cores, memory GiB): 1,213 GPU nodes, 6,212 GPUs.
NODE_KINDS = (
    (8, 560, ("V100M32", "G2", "G3"), 96, 512),
    (4, 258, ("V100M16", "P100", "A10"), 64, 384),
    (2, 305, ("T4", "G3"), 64, 256),
    (1, 90, ("T4", "A10"), 32, 128),
)
CPU_NODES = 310
# Pod mix: (weight, kind). Fractions of a GPU are common in openb (inference), multi-GPU pods are rare.
POD_KINDS = ((13, "cpu"), (37, "fraction"), (45, "one"), (2, "two"), (2, "four"), (1, "eight"))
FRACTIONS = (100, 150, 200, 250, 300, 400, 500, 600, 700, 800, 900)
ALL_MODELS = sorted({m for _, _, models, _, _ in NODE_KINDS for m in models})


def nodes(rng: random.Random) -> list[str]:
    rows = ["sn,cpu_milli,memory_mib,gpu,model"]
    index = 0
    for gpus, count, models, cpus, memory in NODE_KINDS:
        for _ in range(count):
            rows.append(f"openb-node-{index:04d},{cpus * 1000},{memory * 1024},{gpus},{rng.choice(models)}")
            index += 1
    for _ in range(CPU_NODES):
        rows.append(f"openb-node-{index:04d},96000,393216,0,")
        index += 1
    return rows


def pods(rng: random.Random, count: int) -> list[str]:
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
            "scheduled_time"]  # fmt: skip
    weights = [w for w, _ in POD_KINDS]
    kinds = [k for _, k in POD_KINDS]
    for i in range(count):
        kind = rng.choices(kinds, weights)[0]
        num_gpu, milli = {"cpu": (0, 0), "fraction": (1, rng.choice(FRACTIONS)), "one": (1, 1000),
                          "two": (2, 1000), "four": (4, 1000), "eight": (8, 1000)}[kind]  # fmt: skip
        spec = ""
        if num_gpu and rng.random() < 0.2:
            spec = "|".join(sorted(rng.sample(ALL_MODELS, rng.choice((1, 2)))))
        cpu = rng.choice((1000, 2000, 4000, 6000, 8000, 12000, 16000)) * max(1, num_gpu // 2)
        memory = rng.choice((2048, 4096, 8192, 16384, 32768, 65536))
        created = i * 10
        qos = rng.choice(("LS", "BE", "Burstable"))
        times = f"{created},{created + 3600},{created + 5}"
        rows.append(f"openb-pod-{i:05d},{cpu},{memory},{num_gpu},{milli},{spec},{qos},Running,{times}")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--pods", type=int, default=8152, help="pods in the list (openb has 8,152)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/openb-synth"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "nodes.csv").write_text("\n".join(nodes(rng)) + "\n")
    (args.out / "pods.csv").write_text("\n".join(pods(rng, args.pods)) + "\n")
    print(f"wrote {args.out / 'nodes.csv'} and {args.out / 'pods.csv'}")


if __name__ == "__main__":
    main()
