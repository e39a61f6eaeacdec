"""The workload lifecycle rules: every refusal has a reason."""

from __future__ import annotations

import pytest

from gpupool.control.lifecycle import ALLOWED, STATES, TERMINAL, Transition, check


def t(
    src: str, dst: str, *, cancel: bool = False, restarts: int = 0, max_restarts: int = 0, retry: bool = False
) -> Transition:
    return Transition(7, src, dst, cancel, restarts, max_restarts, retry)


@pytest.mark.parametrize("src", sorted(TERMINAL))
@pytest.mark.parametrize("dst", STATES)
def test_terminal_states_are_final(src: str, dst: str) -> None:
    verdict = check(t(src, dst))
    assert not verdict.accepted and f"already {src}" in verdict.reason


@pytest.mark.parametrize(
    "src,dst", [("pending", "succeeded"), ("pending", "pending"), ("running", "running")]
)
def test_unknown_transitions_are_refused(src: str, dst: str) -> None:
    verdict = check(t(src, dst))
    assert not verdict.accepted and "cannot go from" in verdict.reason


@pytest.mark.parametrize("src", ["pending", "running"])
def test_the_happy_path_is_accepted(src: str) -> None:
    for dst in ALLOWED[src]:
        if dst == "pending":
            continue
        assert check(t(src, dst)).accepted


def test_cancelled_work_never_starts_or_requeues() -> None:
    assert not check(t("pending", "running", cancel=True)).accepted
    assert not check(t("running", "pending", cancel=True, max_restarts=3, retry=True)).accepted
    assert check(t("running", "cancelled", cancel=True)).accepted


def test_retries_stay_within_the_budget() -> None:
    assert check(t("running", "pending", restarts=1, max_restarts=2, retry=True)).accepted
    refused = check(t("running", "pending", restarts=2, max_restarts=2, retry=True))
    assert not refused.accepted and "used all 2 restarts" in refused.reason


def test_a_service_restarts_beyond_any_retry_budget_but_never_once_cancelled() -> None:
    service = Transition(7, "running", "pending", False, 40, 0, True, "service")
    assert check(service).accepted
    cancelled = Transition(7, "running", "pending", True, 40, 0, True, "service")
    assert "pending cancel request" in check(cancelled).reason
    assert "used all 0 restarts" in check(t("running", "pending", restarts=40, retry=True)).reason
