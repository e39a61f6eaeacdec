"""`sim run --report DIR`: report.md with the figures, and PNG plots drawn with matplotlib."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.sim.errors import SimError
from gpupool.sim.experiment import Experiment, as_json, counted, dropped, left_out, summary_rows
from gpupool.sim.results import SimResult
from gpupool.sim.trace import adjusted_note
from gpupool.sim.whatif import in_queues

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from gpupool.scheduler import QueueView

HOUR = 3600.0


def check_plotting() -> None:
    try:
        import matplotlib  # noqa: F401
    except ModuleNotFoundError:
        raise SimError(
            "--report", "plots need matplotlib; install it with `pip install matplotlib`"
        ) from None


def _figure(width: float = 7.0, height: float = 4.0) -> Figure:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


ABOVE_FAIR_SHARE = (
    "Shaded: GPUs a queue holds above its fair share. Fair shares divide what the queues ask for, so "
    "while one queue is above its share another is below it and would take those GPUs: it has not, "
    "because reclaim starts only work that fits within its queue's fair share once started and takes only "
    "preemptible work (single-pod jobs first, one whole gang when they cannot make room), by two rules "
    "(docs/scheduler.md): by fair share it leaves every victim queue at or above its own share; by quota, "
    "for work that keeps its queue within its quota, it takes from queues above their quota, a job that "
    "borrows going whole, even where that takes the lender below its fair share. Long shaded stretches "
    "mean the waiting queues' jobs are larger than the gap to their fair share, or larger than what the "
    "other queues may give by either rule; the per-queue quota violation below counts what it cost."
)


def write_report(experiment: Experiment, folder: Path) -> Path:
    """Write report.md and the plots into `folder`; returns report.md's path."""
    check_plotting()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimError("--report", f"cannot create {folder}: {exc.strerror}") from None
    plots = [
        ("JCT distribution", _jct_cdf(experiment, folder / "jct_cdf.png")),
        (
            "Pending jobs over time",
            _save(over_time_figure(experiment, "pending"), folder / "queue_length.png"),
        ),
        ("GPU utilization over time", _save(over_time_figure(experiment, "util"), folder / "gpu_util.png")),
    ]
    used: set[str] = set()
    for result in experiment.results:
        if any(s.fair_share for s in result.timeline):
            path = folder / _file_name(f"fair_share_{result.policy}", used)
            plots.append(
                (
                    f"Allocation against fair share: {result.policy}",
                    _save(fair_share_figure(experiment, result), path),
                )
            )
    path = folder / "report.md"
    path.write_text(_markdown(experiment, plots))
    return path


def _file_name(stem: str, used: set[str]) -> str:
    """`stem`.png as a file name of its own folder: a policy named by its file ("../tuned.yaml") has its
    path's separators and other odd characters made "_", and a name taken already gets a number."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)
    name, n = f"{safe}.png", 1
    while name in used:
        n += 1
        name = f"{safe}_{n}.png"
    used.add(name)
    return name


def _markdown(experiment: Experiment, plots: list[tuple[str, Path]]) -> str:
    data = as_json(experiment)
    trace = data["trace"]
    lines = [
        "# gpupool simulation report",
        "",
        f"- trace: `{trace['format']}:{trace['path']}`, window {trace['window'] or 'whole trace'}, "
        f"{counted(trace['jobs'], 'job')}",
        *(
            f"- {note}"
            for note in (left_out(experiment), adjusted_note(experiment.trace), dropped(experiment))
            if note is not None
        ),
        *(f"- {note}" for note in unfinished(experiment)),
        f"- cluster: `{experiment.cluster.spec}` ({counted(len(experiment.cluster.nodes), 'node')}, "
        f"{counted(experiment.cluster.gpus, 'GPU')}); {counted(len(experiment.queues), 'queue')}",
        f"- options: cycle {experiment.options.cycle:g} s, restart overhead "
        f"{experiment.options.restart_overhead:g} s, checkpoint interval "
        f"{experiment.options.checkpoint_interval:g} s, seed {experiment.options.seed}",
        f"- written {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; metric definitions in "
        "docs/simulator.md",
        "",
    ]
    against = "fifo" in experiment.metrics  # `vs fifo` only where fifo ran: a column of blanks says nothing
    headers = ["policy", "avg JCT (h)", *(["vs fifo"] if against else []), "p50 (h)", "p99 (h)",
               "mean slowdown", "avg queued (h)", "GPU util", "Jain", "quota violation", "preemptions",
               "GPU-h lost", "dropped", "wall (s)"]  # fmt: skip
    lines += ["| " + " | ".join(headers) + " |", "|---|" + "---:|" * (len(headers) - 1)]
    for row in summary_rows(experiment):
        ratio = "-" if row["vs_fifo"] is None else f"{row['vs_fifo']:.2f}"
        cells = [
            row["policy"], _hours(row["avg_jct_s"]), *([ratio] if against else []), _hours(row["p50_jct_s"]),
            _hours(row["p99_jct_s"]), _ratio(row["mean_slowdown"]), _hours(row["avg_queue_s"]),
            f"{row['gpu_util']:.1%}", f"{row['jain']:.3f}", f"{row['quota_violation']:.2%}",
            str(row["preemptions"]), f"{row['lost_gpu_h']:.1f}", str(row["dropped"]), f"{row['wall_s']:.1f}",
        ]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Policies:", ""]
    for p in experiment.policies:
        lines.append(f"- **{p.name}**: {p.description}")
    for title, path in plots:
        lines += ["", f"## {title}", "", f"![{title}]({path.name})"]
        if path.name.startswith("fair_share_"):
            lines += ["", ABOVE_FAIR_SHARE]
    lines += ["", "## Per queue", ""]
    lines.append("| policy | queue | quota (GPUs) | jobs | avg JCT (h) | mean slowdown | quota violation |")
    lines.append("|---|---|---:|---:|---:|---:|---:|")
    for name, metrics in data["policies"].items():
        for queue, q in metrics["queues"].items():
            lines.append(
                f"| {name} | {queue} | {q['quota_gpus']:g} | {q['jobs']} | {_hours(q['avg_jct_s'])} | "
                f"{_ratio(q['mean_slowdown'])} | {q['quota_violation']:.2%} |"
            )
    return "\n".join(lines) + "\n"


def unfinished(experiment: Experiment) -> list[str]:
    """One line per policy that left jobs unfinished: how many, of which queues, what is known to hold them
    (a job larger than a GPU limit on its queue's line never starts), and that the policy's figures cover
    the finished jobs only."""
    queues = {q.name: q for q in experiment.queues}
    notes = []
    for policy, result in zip(experiment.policies, experiment.results, strict=True):
        figures = experiment.metrics[policy.name]
        if not figures["unfinished"]:
            continue
        left = [j for j in result.jobs if j.finish is None]
        why = "still pending or running when the replay ended"
        if policy.queues == "quotas":  # the only presentation that keeps the given queues' limits
            over = sum(1 for j in left if j.gpus > _gpu_limit(j.queue, queues) + 1e-9)
            if over == len(left):
                why = "asking for more GPUs than a limit of the queue (--queues), so never started"
            elif over:
                why += f"; {over:,} of them ask for more GPUs than a limit of their queue (--queues)"
        notes.append(
            f"{policy.name}: {counted(figures['unfinished'], 'job')} of {figures['jobs']:,} never finished "
            f"({in_queues(Counter(j.queue for j in left))}), {why}; its averages, percentiles and slowdowns "
            f"cover the {figures['finished']:,} that finished (policies.{policy.name}.unfinished in --json)"
        )
    return notes


def _gpu_limit(queue: str, queues: dict[str, QueueView]) -> float:
    """The lowest GPU limit on `queue`'s line (its own, its parents'); inf where none is set."""
    lowest, seen = math.inf, set()
    view = queues.get(queue)
    while view is not None and view.name not in seen:
        seen.add(view.name)
        if view.gpu.limit is not None:
            lowest = min(lowest, view.gpu.limit)
        view = queues.get(view.parent) if view.parent is not None else None
    return lowest


def _hours(seconds: float | None) -> str:
    """Seconds as hours in a table; "-" for a figure of no jobs."""
    return "-" if seconds is None else f"{seconds / HOUR:.2f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _save(fig: Figure, path: Path) -> Path:
    try:
        fig.savefig(path)
    except OSError as exc:
        raise SimError("--report", f"cannot write {path}: {exc.strerror}") from None
    return path


def _jct_cdf(experiment: Experiment, path: Path) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    for result in experiment.results:
        jcts = sorted((j.finish - j.submit) / HOUR for j in result.jobs if j.finish is not None)
        if not jcts:
            continue
        ys = [(i + 1) / len(jcts) for i in range(len(jcts))]
        ax.step([max(x, 1e-3) for x in jcts], ys, where="post", label=result.policy)
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours, log scale)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title("JCT CDF per policy")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


@dataclass(frozen=True, slots=True)
class _TimeSpan:
    """What the plots over time show, in hours since the window start: up to `shown`, where the window's
    last arrival (`window`) is marked; `end` is the replays' last sample."""

    window: float
    shown: float
    end: float

    @property
    def cut(self) -> bool:
        return self.shown < self.end

    def label(self) -> str:
        said = "virtual time (hours since the window start)"
        if self.cut:
            said += (
                f"\ncut at {self.shown:.0f} h: nothing is pending after it; the last jobs run on to "
                f"{self.end:.0f} h"
            )
        return said

    def draw(self, ax: Axes, legend: bool = True) -> None:
        """Limit `ax` to the span and mark the last arrival."""
        if self.cut:
            ax.set_xlim(-0.02 * self.shown, self.shown)
        if 0 < self.window < self.end:
            label = f"last arrival ({self.window:.0f} h)" if legend else None
            ax.axvline(self.window, color="black", linestyle=":", linewidth=0.8, label=label)


def _time_span(experiment: Experiment) -> _TimeSpan:
    """The arrival window, then the backlog it left (until no policy has work pending), plus a margin; a
    drain much longer than that (the last long jobs running on alone, 700 h after a week's window) is cut,
    as it would squeeze the window into a corner of each plot."""
    window = max((r.arrival_window for r in experiment.results if math.isfinite(r.arrival_window)), default=0)
    end = backlog = 0.0
    for result in experiment.results:
        timeline = result.timeline
        if not timeline:
            continue
        end = max(end, timeline[-1].t)
        for i in range(len(timeline) - 1, -1, -1):
            if timeline[i].pending:  # pending until the next sample
                backlog = max(backlog, timeline[min(i + 1, len(timeline) - 1)].t)
                break
    shown = 1.05 * max(window, backlog)
    if shown <= 0 or end <= 1.5 * shown:  # a short drain: show it all
        shown = end
    return _TimeSpan(window / HOUR, shown / HOUR, end / HOUR)


def over_time_figure(experiment: Experiment, what: str) -> Figure:
    """Pending jobs (`what` "pending") or GPU utilization ("util") over time, a line per policy."""
    fig = _figure()
    ax = fig.add_subplot()
    gpus = experiment.cluster.gpus
    span = _time_span(experiment)
    for result in experiment.results:
        xs = [s.t / HOUR for s in result.timeline]
        ys: list[float] = [s.pending if what == "pending" else s.used_gpus / gpus for s in result.timeline]
        ax.step(xs, ys, where="post", label=result.policy, linewidth=1)  # each sample holds until the next
    span.draw(ax)
    ax.set_xlabel(span.label())
    ax.set_ylabel("pending jobs" if what == "pending" else "GPUs in use (fraction)")
    ax.set_title("Queue length over time" if what == "pending" else "GPU utilization over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig


def fair_share_figure(experiment: Experiment, result: SimResult) -> Figure:
    """Each queue's GPUs allocated against its fair share and quota under one policy, a panel a queue."""
    queues = sorted({q for s in result.timeline for q in s.fair_share} & set(result.quotas) or result.quotas)
    cols = min(4, max(1, len(queues)))
    rows = max(1, math.ceil(len(queues) / cols))
    fig = _figure(3.2 * cols, 2.4 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    xs = [s.t / HOUR for s in result.timeline]
    span = _time_span(experiment)
    for i, queue in enumerate(queues):
        ax = axes[i // cols][i % cols]
        allocated = [s.allocated.get(queue, 0.0) for s in result.timeline]
        fair = [s.fair_share.get(queue, 0.0) for s in result.timeline]
        ax.step(xs, allocated, where="post", label="allocated", linewidth=1)
        ax.step(xs, fair, where="post", label="fair share", linewidth=1)
        above = [a > f for a, f in zip(allocated, fair, strict=True)]
        ax.fill_between(xs, fair, allocated, where=above, step="post", color="tab:red", alpha=0.25,
                        linewidth=0, label="above fair share")  # fmt: skip
        ax.axhline(result.quotas.get(queue, 0.0), color="grey", linestyle="--", linewidth=0.8, label="quota")
        span.draw(ax, legend=i == 0)
        ax.set_title(queue, fontsize=9)
        ax.tick_params(labelsize=7)
        if i == 0:
            ax.legend(fontsize=7)
    for j in range(len(queues), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(f"{result.policy}: GPUs allocated vs fair share per queue")
    fig.supxlabel(span.label(), fontsize=9)
    fig.supylabel("GPUs")
    return fig


def write_place_plot(results: dict[str, Any], folder: Path, stop: float = 1.3) -> Path:
    """`sim place --report DIR`: allocated against arrived GPU demand per placement (FGD's figure), up to
    the run's `--stop` (arrived demand, x capacity)."""
    check_plotting()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimError("--report", f"cannot create {folder}: {exc.strerror}") from None
    return _save(place_figure(results, stop), folder / "place.png")


def place_figure(results: dict[str, Any], stop: float) -> Figure:
    """The figure of `write_place_plot`."""
    fig = _figure()
    ax = fig.add_subplot()
    for name, r in results.items():
        # at the demand each point was read at (a large pod takes it past the 5% mark it crossed)
        xs = [r.get("curve_arrived", {}).get(k, float(k)) for k in r["curve"]]
        ax.plot(
            xs, list(r["curve"].values()), marker=".", label=f"{name} ({r['alloc_ratio_at_100']:.1%} at 100%)"
        )
    ax.plot([0, stop], [0, stop], color="grey", linestyle=":", linewidth=0.8, label="everything placed")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("arrived GPU demand (fraction of capacity)")
    ax.set_ylabel("allocated GPUs (fraction of capacity)")
    ax.set_title("Fragmentation: allocation against arrived demand")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return fig
