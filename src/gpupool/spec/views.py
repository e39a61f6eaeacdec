"""From specs to what the scheduler sees: one translation, used by the server and the simulator alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpupool.scheduler import QueueView, Share


def queue_view(spec: Mapping[str, Any]) -> QueueView:
    """The scheduler's view of a queue spec given as a mapping (as queue files and the API show it:
    `name`, `parent`, `priority`, `resources.<gpu|cpu|memory>.{quota, limit, over_quota_weight}`,
    `ordering`, `min_runtime_preempt`, `min_runtime_reclaim`, the durations in seconds)."""
    return QueueView(
        name=str(spec["name"]),
        parent=spec.get("parent"),
        priority=int(spec.get("priority") or 0),
        gpu=_share(spec, "gpu"),
        cpu=_share(spec, "cpu"),
        memory=_share(spec, "memory"),
        ordering=spec.get("ordering"),
        min_runtime_preempt=spec.get("min_runtime_preempt"),
        min_runtime_reclaim=spec.get("min_runtime_reclaim"),
    )


def _share(spec: Mapping[str, Any], resource: str) -> Share:
    row = (spec.get("resources") or {}).get(resource) or {}
    limit = row.get("limit")
    return Share(
        float(row.get("quota") or 0.0),
        None if limit is None else float(limit),
        float(row.get("over_quota_weight", 1.0)),
    )
