"""The crash-loop backoff: how long a service, or a job retried after a failure, that keeps exiting waits."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpupool.control.restarts import RESTART_BACKOFF, Ended, backoff, quick_exits, restart_explanation

T0 = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def ran(start: float, seconds: float, code: int | None = 1, stop_reason: str = "") -> Ended:
    """An attempt that started `start` s after T0 and ended `seconds` later."""
    began = T0 + timedelta(seconds=start)
    return Ended(began, began + timedelta(seconds=seconds), code, stop_reason)


def test_the_first_quick_exit_waits_the_base_delay_from_the_exit() -> None:
    found = backoff([ran(0, 5, code=3)], base=10)
    assert found is not None
    assert (found.delay, found.quick_exits, found.exit_code) == (10, 1, 3)
    assert found.until == (T0 + timedelta(seconds=15)).timestamp()


def test_each_quick_exit_in_a_row_doubles_the_wait_up_to_thirty_times_the_base() -> None:
    attempts = [ran(100 * i, 5) for i in range(8)]
    waits = [backoff(attempts[: n + 1], base=10) for n in range(8)]
    assert [w.delay for w in waits if w is not None] == [10, 20, 40, 80, 160, 300, 300, 300]


def test_an_attempt_that_ran_ten_minutes_ends_the_crash_loop() -> None:
    attempts = [ran(0, 5), ran(100, 5), ran(200, 600), ran(900, 5)]
    assert len(quick_exits(attempts)) == 1
    found = backoff(attempts, base=10)
    assert found is not None and found.delay == 10
    assert backoff([*attempts[:3]], base=10) is None  # the last one ran long: it starts at once


def test_exit_code_zero_counts_as_an_exit_too() -> None:
    found = backoff([ran(0, 1, code=0)], base=10)
    assert found is not None and found.exit_code == 0


def test_stops_it_did_not_choose_start_it_again_at_once() -> None:
    evicted = ran(100, 5, code=143, stop_reason="preempt")
    lost = ran(100, 5, code=None)  # node lost: no exit code
    for last in (evicted, lost):
        assert backoff([ran(0, 5), last], base=10) is None
    # and they end the streak: a quick exit after an eviction is the first of a new loop
    found = backoff([ran(0, 5), ran(50, 5), evicted, ran(200, 5)], base=10)
    assert found is not None and found.quick_exits == 1


def test_no_base_delay_turns_the_backoff_off() -> None:
    assert backoff([ran(0, 5)], base=0) is None


def test_the_explanation_names_the_exits_the_code_and_a_clock_time() -> None:
    found = backoff([ran(0, 5, code=0), ran(20, 5, code=3)], base=10)
    assert found is not None
    why = restart_explanation(found)
    assert why.code == RESTART_BACKOFF
    assert "it exited 2 times in a row within 10 minutes" in why.message
    assert "exit code 3" in why.message
    assert "next attempt starts at 12:00:45 UTC" in why.message  # exit at 12:00:25, then 20 s


def test_an_attempt_its_node_could_not_start_backs_off_as_a_quick_exit() -> None:
    """A launch error (a working directory not there yet, no free port) would otherwise be tried again every
    pass, and a job's node failures spent in seconds; a lost node (no exit code, but started) still not."""
    unstarted = Ended(T0, T0, None, "", unstarted=True, reason="workdir /data/x does not exist on this node")
    found = backoff([ran(-100, 5), unstarted], base=10)
    assert found is not None and (found.quick_exits, found.delay, found.unstarted) == (2, 20, True)
    why = restart_explanation(found).message
    assert why == (
        "it ended 2 times in a row within 10 minutes of starting (the last: its node could not start it: "
        "workdir /data/x does not exist on this node); its next attempt starts at 12:00:20 UTC, after a "
        "crash-loop backoff of 20 s"
    ), why
    assert backoff([unstarted, ran(100, 5, code=None)], base=10) is None
