"""Small helpers about the store that several tests share."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select

from gpupool.control import agents, submission
from gpupool.control.lifecycle import RUNNING, transition
from gpupool.spec import parse_workload_spec
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


def submit_running(store: Store, spec: dict[str, Any], node: str = "node-1", **attempt: Any) -> int:
    """A workload submitted with `spec` and started through the lifecycle (its history says so), with
    attempt 0 running on `node` (`attempt`: more of the attempt's columns; no process). Its id."""
    wid = int(submission.submit(store, parse_workload_spec(spec))["id"])
    with store.session() as s:
        workload = s.get(Workload, wid)
        assert workload is not None and transition(s, workload, RUNNING, "started").accepted
        s.add(
            Attempt(workload_id=wid, queue=workload.queue, number=0, state=RUNNING, node_name=node, **attempt)
        )
    return wid


def join_token(store: Store) -> str:
    """A join token for agents, valid an hour."""
    return str(agents.create_join_token(store, 3600)["token"])


def submit(store: Store, **spec: object) -> int:
    """A `sleep 60` job with `spec`'s fields, submitted; its id."""
    created = submission.submit(store, parse_workload_spec({"commands": ["sleep 60"], **spec}))
    return int(created["id"])


def node_of(store: Store, workload_id: int) -> str | None:
    """The node the workload's first attempt ran on, if it has one."""
    with store.read() as s:
        attempt = s.scalar(select(Attempt).where(Attempt.workload_id == workload_id))
        return attempt.node_name if attempt is not None else None
