"""/api/v1/queues: create, list, get, update, delete."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Body, Depends, Request

from gpupool.api.auth import admin_only
from gpupool.control import budgets, queues
from gpupool.control.budgets import BudgetState
from gpupool.control.tokens import Caller
from gpupool.scheduler import QueueView
from gpupool.spec import parse_queue_spec

router = APIRouter(prefix="/queues", tags=["queues"])


@router.post(
    "",
    status_code=201,
    summary="Create a queue (team or project) (admin)",
)
def create(
    request: Request,
    body: Any = Body(..., description="A queue spec: see docs/specs.md"),
    caller: Caller = Depends(admin_only),
) -> dict[str, Any]:
    return queues.create_queue(request.app.state.runtime.store, parse_queue_spec(body), actor=caller.name)


@router.get("", summary="Queues with quotas, limits and what they use now")
def list_queues(request: Request) -> list[dict[str, Any]]:
    runtime = request.app.state.runtime
    reconciler = runtime.reconciler
    weights = _weights_now(reconciler.pass_queues)
    rows = queues.list_queues(runtime.store, reconciler.fair_shares, reconciler.explanations)
    parents = {row["name"]: row["parent"] for row in rows}
    return [_with_pass(row, weights, reconciler.budgets.state, parents) for row in rows]


@router.get("/{name}", summary="One queue")
def get_queue(request: Request, name: str) -> dict[str, Any]:
    runtime = request.app.state.runtime
    reconciler = runtime.reconciler
    weights = _weights_now(reconciler.pass_queues)
    row = queues.get_queue(runtime.store, name, reconciler.fair_shares, reconciler.explanations)
    state = reconciler.budgets.state
    parents = budgets.queue_parents(runtime.store) if any(b.spent for b in state.values()) else {}
    return _with_pass(row, weights, state, parents)


def _weights_now(queues: Sequence[QueueView]) -> dict[str, float]:
    """Each queue's GPU over-quota weight as the last scheduling pass used it: the spec's weight x its
    young-work count under the default policy (control/policy.py); none when no pass had work to weigh."""
    return {q.name: q.gpu.weight for q in queues}


def _with_pass(
    row: dict[str, Any],
    weights: dict[str, float],
    state: Mapping[str, BudgetState],
    parents: Mapping[str, str | None],
) -> dict[str, Any]:
    """The queue with what the last pass knew: its weight then, its budget's GPU-hours used so far in the
    current period (control/budgets.py; counted again every few seconds), and an ancestor's used budget
    that holds back its new work (`budget_spent_above`; null when none)."""
    weight = weights.get(row["name"])
    row["gpu_weight_now"] = None if weight is None else round(weight, 6)
    budget = state.get(row["name"])
    if row.get("budget") and budget is not None:
        row["budget"] = {**row["budget"], **budget.view()}
    row["budget_spent_above"] = budgets.spent_above(state, parents, row["name"]) if parents else None
    return row


@router.patch(
    "/{name}",
    summary="Change some fields of a queue (merged into its spec) (admin)",
)
def update(
    request: Request, name: str, body: Any = Body(...), caller: Caller = Depends(admin_only)
) -> dict[str, Any]:
    def build(current: dict[str, Any]) -> Any:
        # A body that is not an object is refused as parse_queue_spec refuses any such spec.
        return parse_queue_spec(merge(current, body) if isinstance(body, dict) else body)

    runtime = request.app.state.runtime
    result = queues.update_queue(runtime.store, name, build, actor=caller.name)
    runtime.wake()
    return result


@router.delete(
    "/{name}",
    summary="Delete a queue with no pending or running work and no child queues (admin)",
)
def delete(request: Request, name: str, caller: Caller = Depends(admin_only)) -> dict[str, Any]:
    runtime = request.app.state.runtime
    deleted = queues.delete_queue(runtime.store, name, actor=caller.name)
    runtime.wake()
    return deleted


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `patch` into `base` (a JSON merge patch without deletes)."""
    out = dict(base)
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out
