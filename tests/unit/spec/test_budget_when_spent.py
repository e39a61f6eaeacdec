"""The queue spec's `budget.when_spent`: what a used budget does to its tree's running work."""

from __future__ import annotations

import pytest

from gpupool.spec import SpecError, parse_queue_spec
from gpupool.spec.queue import QUEUE_FIELD_EXAMPLES


def test_a_budget_lets_running_work_go_on_unless_it_says_stop() -> None:
    budget = parse_queue_spec({"name": "nlp", "budget": {"gpu_hours": 200, "period": "week"}}).budget
    assert budget is not None and budget.when_spent == "wait"
    stops = parse_queue_spec("name: nlp\nbudget: {gpu_hours: 200, period: week, when_spent: stop}\n").budget
    assert stops is not None and (stops.gpu_hours, stops.period, stops.when_spent) == (200, "week", "stop")
    assert stops.model_dump(mode="json") == {"gpu_hours": 200, "period": "week", "when_spent": "stop"}


def test_a_budget_stored_before_when_spent_existed_reads_as_wait() -> None:
    """Queues saved without the field (their spec as the store keeps it) keep today's behaviour."""
    stored = {"name": "nlp", "budget": {"gpu_hours": 5000.0, "period": "month"}}
    budget = parse_queue_spec(stored).budget
    assert budget is not None and budget.when_spent == "wait"


@pytest.mark.parametrize(
    ("when_spent", "said"),
    [
        ("kill", "budget.when_spent: 'kill' is not one of 'wait', 'stop'"),
        ("STOP", "budget.when_spent: 'STOP' is not one of 'wait', 'stop'"),
        (True, "budget.when_spent"),
        (None, "budget.when_spent"),
    ],
)
def test_a_bad_when_spent_names_the_field_and_the_choices(when_spent: object, said: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_queue_spec({"name": "nlp", "budget": {"gpu_hours": 1, "when_spent": when_spent}})
    assert str(caught.value).startswith(said), str(caught.value)
    assert caught.value.field == "budget.when_spent"
    assert QUEUE_FIELD_EXAMPLES["budget.when_spent"] in str(caught.value)


def test_when_spent_alone_is_no_budget() -> None:
    # `queue update default --budget-when-spent stop` on a queue with no budget said only
    # "budget.gpu_hours: is required": it says what is missing, and how to give it
    with pytest.raises(SpecError) as caught:
        parse_queue_spec({"name": "nlp", "budget": {"when_spent": "stop"}})
    assert caught.value.field == "budget"
    said = str(caught.value)
    assert said.startswith("budget: {'when_spent': 'stop'} has no gpu_hours"), said
    assert "`--budget 5000`" in said
