"""A 2-node x 1-GPU PyTorch job on two agents, launched with torchrun from the job contract (CPU, gloo)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.support.agent import start_pool

ALLREDUCE = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print(f"rank {rank}/{world} node_rank {os.environ['NODE_RANK']} all_reduce {value.item():g}", flush=True)
dist.destroy_process_group()
"""


def test_torchrun_all_reduce_across_two_agents(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    script = tmp_path / "allreduce.py"
    script.write_text(ALLREDUCE)
    pool = start_pool(tmp_path, 2)
    server = pool.server
    try:
        job = server.submit(
            {
                "nodes": 2,
                "resources": {"gpu": 1},
                "env": {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
                "commands": [
                    f"{sys.executable} -m torch.distributed.run --nnodes=$NNODES --node-rank=$NODE_RANK "
                    "--nproc-per-node=1 --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT "
                    f"{script}"
                ],
            }
        )
        done = server.wait_for(job["id"], timeout=120)
        logs = [server.cli("logs", str(job["id"]), "--rank", str(r), check=True).stdout for r in (0, 1)]
        assert done["state"] == "succeeded", f"{done}\n{logs[0]}\n{logs[1]}"
        # ranks 1 and 2 summed over both nodes: 3
        assert "rank 0/2 node_rank 0 all_reduce 3" in logs[0], logs[0]
        assert "rank 1/2 node_rank 1 all_reduce 3" in logs[1], logs[1]
        nodes = {p["node"] for p in done["attempt_list"][0]["pods"]}
        assert nodes == {"agent-0", "agent-1"}
    finally:
        pool.stop()
