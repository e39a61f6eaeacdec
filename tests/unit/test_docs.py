"""The docs keep up with the code: every spec field is documented."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from gpupool.spec import (
    CheckpointSpec,
    PlacementSpec,
    QueueResources,
    QueueSpec,
    Resources,
    ResourceShare,
    RetrySpec,
    ScalingSpec,
    WorkloadSpec,
)
from gpupool.spec.queue import BudgetSpec, UserLimits
from gpupool.spec.sections import IdleSpec, NotifySpec

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.mark.parametrize(
    "model,prefix",
    [
        (WorkloadSpec, ""),
        (Resources, "resources."),
        (CheckpointSpec, "checkpoint."),
        (PlacementSpec, "placement."),
        (RetrySpec, "retry."),
        (ScalingSpec, "scaling."),
        (IdleSpec, "idle."),
        (NotifySpec, "notify."),
        (QueueSpec, ""),
        (QueueResources, "resources."),
        (ResourceShare, "resources.<gpu|cpu|memory>."),
        (BudgetSpec, "budget."),
        (UserLimits, "user_limits."),
    ],
)
def test_every_spec_field_is_in_docs_specs_md(model: type[BaseModel], prefix: str) -> None:
    text = (DOCS / "specs.md").read_text()
    for name in model.model_fields:
        assert f"`{prefix}{name}`" in text, f"docs/specs.md lacks {prefix}{name}"
