"""Call `decide` N times on the seeded 1,000-node synthetic snapshot: for instruction counts that do not
depend on the machine's load. Run it under valgrind with N = 0 and N = 1; the difference is one decide:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        .venv/bin/python benchmarks/decide_instructions.py 0    # then 1
"""

from __future__ import annotations

import sys

from synthetic_cluster import NOW, ClusterSpec, build_snapshot

from gpupool.scheduler import decide


def main() -> None:
    times = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    nodes = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    spec = ClusterSpec(
        nodes=nodes,
        gpus_per_node=8,
        pending=5 * nodes,
        running=4 * nodes,
        queues=50 if nodes <= 1000 else 200,
    )
    snapshot, _ = build_snapshot(spec)
    for _ in range(times):
        decide(snapshot, NOW)


if __name__ == "__main__":
    main()
