"""What `sim run --report` and `sim place --report` say and draw: report.md's notes and columns, and the
plots' axes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.sim import experiment as ex
from gpupool.sim.report import (
    ABOVE_FAIR_SHARE,
    fair_share_figure,
    over_time_figure,
    place_figure,
    unfinished,
    write_report,
)

HOUR = 3600


def replayed(tmp_path: Path, rows: list[str], policies: str, queues: str = "auto") -> ex.Experiment:
    """`rows` of a csv trace (`submit_time,duration,num_gpus,queue`) replayed on one 8-GPU node."""
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_time,duration,num_gpus,queue\n" + "".join(f"{row}\n" for row in rows))
    return ex.run(ex.prepare(f"csv:{trace}", "1x8", queues=queues, policies=policies))


def test_a_policy_that_leaves_jobs_unfinished_is_said_with_the_cause_where_known(tmp_path: Path) -> None:
    """A job larger than its queue's GPU limit never starts under a policy that keeps the queues; its
    figures then cover fewer jobs than its neighbours', which report.md (and `sim run`) says."""
    queues = tmp_path / "queues.yaml"
    queues.write_text("- {name: a, resources: {gpu: {quota: 1, limit: 1}}}\n- {name: b}\n")
    experiment = replayed(tmp_path, ["0,600,1,a", "10,600,2,a", "20,600,1,b"], "fifo,gpupool", str(queues))
    assert experiment.metrics["fifo"]["unfinished"] == 0 and experiment.metrics["gpupool"]["unfinished"] == 1
    assert unfinished(experiment) == [
        "gpupool: 1 job of 3 never finished (in queue a), asking for more GPUs than a limit of the queue "
        "(--queues), so never started; its averages, percentiles and slowdowns cover the 2 that finished "
        "(policies.gpupool.unfinished in --json)"
    ]
    report = write_report(experiment, tmp_path / "report").read_text()
    assert "\n- gpupool: 1 job of 3 never finished (in queue a)" in report


def test_report_compares_with_fifo_only_when_fifo_ran(tmp_path: Path) -> None:
    rows = [f"{i * 60},600,4,a" for i in range(4)]
    without = write_report(replayed(tmp_path, rows, "las,gpupool"), tmp_path / "without").read_text()
    assert "vs fifo" not in without
    table = [line for line in without.splitlines() if line.startswith("| las |")]
    header = next(line for line in without.splitlines() if line.startswith("| policy | avg JCT"))
    assert table and table[0].count("|") == header.count("|")
    with_fifo = write_report(replayed(tmp_path, rows, "fifo,las"), tmp_path / "with").read_text()
    assert "| policy | avg JCT (h) | vs fifo |" in with_fifo
    fifo = next(line for line in with_fifo.splitlines() if line.startswith("| fifo |"))
    assert fifo.split(" | ")[2] == "1.00"


def test_the_fair_share_explanation_says_what_reclaim_by_quota_may_take() -> None:
    """Reclaim by quota takes a job that borrows whole, a gang too, even below the lender's fair share
    (docs/scheduler.md); the report said it took single-pod work only and kept every victim at its share."""
    assert "one whole gang" in ABOVE_FAIR_SHARE
    assert "even where that takes the lender below its fair share" in ABOVE_FAIR_SHARE
    assert "takes only preemptible single-pod work" not in ABOVE_FAIR_SHARE


def test_plots_over_time_show_the_arrival_window_and_cut_a_long_drain(tmp_path: Path) -> None:
    """Ten hourly arrivals beside one 200-hour job: the window (9 h) would be a twentieth of the width."""
    rows = ["0,720000,1,a", *(f"{i * HOUR},{HOUR},1,a" for i in range(10))]
    experiment = replayed(tmp_path, rows, "fifo,gpupool")
    for figure in (over_time_figure(experiment, "pending"), over_time_figure(experiment, "util")):
        (ax,) = figure.axes
        assert ax.get_xlim()[1] == pytest.approx(9 * 1.05)
        marks = [line for line in ax.get_lines() if str(line.get_label()).startswith("last arrival")]
        assert [line.get_xdata()[0] for line in marks] == [9.0]
        assert ax.get_xlabel().endswith(
            "cut at 9 h: nothing is pending after it; the last jobs run on to 200 h"
        )
    shares = fair_share_figure(experiment, experiment.results[1])
    assert shares.get_supylabel() == "GPUs" and "cut at 9 h" in shares.get_supxlabel()
    assert shares.axes[0].get_xlim()[1] == pytest.approx(9 * 1.05)


def test_a_short_drain_is_shown_whole(tmp_path: Path) -> None:
    experiment = replayed(tmp_path, [f"{i * HOUR},{HOUR},1,a" for i in range(10)], "fifo")
    (ax,) = over_time_figure(experiment, "pending").axes
    assert "cut" not in ax.get_xlabel() and ax.get_xlim()[1] >= 10.0


def test_the_place_plot_draws_everything_placed_up_to_the_runs_stop() -> None:
    curve = {"0.50": 0.5, "1.00": 0.9, "1.50": 0.95, "2.00": 0.97}
    results = {
        "binpack": {"curve": curve, "curve_arrived": {k: float(k) for k in curve}, "alloc_ratio_at_100": 0.9}
    }
    (ax,) = place_figure(results, 2.0).axes
    (diagonal,) = [line for line in ax.get_lines() if line.get_label() == "everything placed"]
    assert list(diagonal.get_xdata()) == [0, 2.0]
