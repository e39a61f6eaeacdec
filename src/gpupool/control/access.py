"""Who owns a workload, and who may reach a service through the head's proxy (its spec's `access`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gpupool.control.lifecycle import SERVICE
from gpupool.control.workloads import load_workload
from gpupool.store.db import Store
from gpupool.store.models import MAX_ID, Workload


def owner_of(store: Store, workload_id: int) -> str:
    """Who submitted the workload (its `user`: the name of the token that submitted it)."""
    with store.read() as s:
        return load_workload(s, workload_id).user


PRIVATE: Final = "private"
PUBLIC: Final = "public"


@dataclass(frozen=True, slots=True)
class Access:
    """Who may reach a workload through the head's proxy (spec `access`): its owner and admins (private),
    any token of the head (pool), or anyone (public). A job is private: the proxy refuses it anyway."""

    owner: str
    access: str


def access_of(store: Store, workload_id: int) -> Access | None:
    """Who may reach the workload `workload_id` through the proxy; None when there is no such workload."""
    if not 0 < workload_id <= MAX_ID:
        return None
    with store.read() as s:
        workload = s.get(Workload, workload_id)
        if workload is None:
            return None
        access = (workload.spec or {}).get("access") if workload.kind == SERVICE else None
        return Access(workload.user, access or PRIVATE)
