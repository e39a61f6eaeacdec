"""Small helpers about the store that several tests share."""

from __future__ import annotations

from datetime import datetime

from gpupool.store.db import Store
from gpupool.store.models import Attempt, Workload


def run_attempt(
    store: Store, workload_id: int, node: str, gpus: list[int], since: datetime | None = None
) -> None:
    """The workload as running on `node` (whole GPUs; no process: the control loop only reads the store)."""
    with store.session() as s:
        workload = s.get(Workload, workload_id)
        assert workload is not None
        workload.state = "running"
        s.add(
            Attempt(
                workload_id=workload_id, queue=workload.queue,
                number=len(workload.attempts), state="running", node_name=node,
                gpu_indices=gpus, gpu_fraction=1.0, pods=[{"node": node, "gpu_indices": gpus}],
                **({"started_at": since} if since is not None else {}),
            )
        )  # fmt: skip
