"""`gpupool queue create|update`'s --budget and --budget-when-spent as the spec's `budget`."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.cli.errors import CliError
from gpupool.cli.queues import _queue_body


def test_when_spent_joins_the_budget_flag_or_the_files_budget(tmp_path: Path) -> None:
    assert _queue_body(None, {"budget": "200/week", "budget_when_spent": "Stop"}) == {
        "budget": {"gpu_hours": 200, "period": "week", "when_spent": "stop"}
    }
    # alone: merged into the queue's budget by the server (PATCH), as --budget alone keeps its period
    assert _queue_body(None, {"budget_when_spent": "wait"}) == {"budget": {"when_spent": "wait"}}
    spec = tmp_path / "nlp.yaml"
    spec.write_text("name: nlp\nbudget: {gpu_hours: 5000, period: month}\n")
    assert _queue_body(spec, {"budget_when_spent": "stop"})["budget"] == {
        "gpu_hours": 5000, "period": "month", "when_spent": "stop"
    }  # fmt: skip
    assert _queue_body(spec, {"budget": "none"})["budget"] is None


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"budget_when_spent": "kill"}, "--budget-when-spent kill: wait (running work goes on"),
        ({"budget": "none", "budget_when_spent": "stop"}, "give --budget-when-spent only with a budget"),
    ],
)
def test_a_bad_when_spent_flag_names_the_flag_and_the_choices(fields: dict[str, str], said: str) -> None:
    with pytest.raises(CliError) as caught:
        _queue_body(None, dict(fields))
    assert said in str(caught.value)
