"""How the bench processes start (pure): under torchrun, or spawned here by launch_torch."""

from __future__ import annotations

import os

# Set by torchrun (torch.distributed.run) for every rank it starts, e.g. in a multi-node gpupool job.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def under_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARS)


def torchrun_world_size() -> int | None:
    """WORLD_SIZE when torchrun started this process, else None."""
    return int(os.environ["WORLD_SIZE"]) if under_torchrun() else None
