"""`sim run --report DIR`: report.md with the figures, and PNG plots drawn with matplotlib."""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpupool.sim.errors import SimError
from gpupool.sim.experiment import Experiment, as_json, counted, dropped, left_out, summary_rows
from gpupool.sim.trace import adjusted_note

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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
    "because reclaim starts only work that fits within its queue's fair share once started, takes only "
    "preemptible single-pod work, and leaves every victim queue at or above its own share "
    "(docs/simulator.md). Long shaded stretches mean the waiting queues' jobs are larger than the gap to "
    "their fair share, or larger than what the queues above theirs may give; the per-queue quota "
    "violation below counts what it cost."
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
        ("Pending jobs over time", _over_time(experiment, folder / "queue_length.png", "pending")),
        ("GPU utilization over time", _over_time(experiment, folder / "gpu_util.png", "util")),
    ]
    used: set[str] = set()
    for result in experiment.results:
        if any(s.fair_share for s in result.timeline):
            path = folder / _file_name(f"fair_share_{result.policy}", used)
            plots.append(
                (f"Allocation against fair share: {result.policy}", _fair_share(experiment, result, path))
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
        f"- cluster: `{experiment.cluster.spec}` ({counted(len(experiment.cluster.nodes), 'node')}, "
        f"{counted(experiment.cluster.gpus, 'GPU')}); {counted(len(experiment.queues), 'queue')}",
        f"- options: cycle {experiment.options.cycle:g} s, restart overhead "
        f"{experiment.options.restart_overhead:g} s, checkpoint interval "
        f"{experiment.options.checkpoint_interval:g} s, seed {experiment.options.seed}",
        f"- written {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}; metric definitions in "
        "docs/simulator.md",
        "",
        "| policy | avg JCT (h) | vs fifo | p50 (h) | p99 (h) | mean slowdown | avg queued (h) | GPU util | "
        "Jain | quota violation | preemptions | GPU-h lost | dropped | wall (s) |",
        "|---|" + "---:|" * 13,
    ]
    for row in summary_rows(experiment):
        ratio = "" if row["vs_fifo"] is None else f"{row['vs_fifo']:.2f}"
        lines.append(
            f"| {row['policy']} | {_hours(row['avg_jct_s'])} | {ratio} | {_hours(row['p50_jct_s'])} | "
            f"{_hours(row['p99_jct_s'])} | {_ratio(row['mean_slowdown'])} | {_hours(row['avg_queue_s'])} | "
            f"{row['gpu_util']:.1%} | {row['jain']:.3f} | {row['quota_violation']:.2%} | "
            f"{row['preemptions']} | {row['lost_gpu_h']:.1f} | {row['dropped']} | {row['wall_s']:.1f} |"
        )
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


def _over_time(experiment: Experiment, path: Path, what: str) -> Path:
    fig = _figure()
    ax = fig.add_subplot()
    gpus = experiment.cluster.gpus
    for result in experiment.results:
        xs = [s.t / HOUR for s in result.timeline]
        ys: list[float] = [s.pending if what == "pending" else s.used_gpus / gpus for s in result.timeline]
        ax.step(xs, ys, where="post", label=result.policy, linewidth=1)  # each sample holds until the next
    ax.set_xlabel("virtual time (hours since the window start)")
    ax.set_ylabel("pending jobs" if what == "pending" else "GPUs in use (fraction)")
    ax.set_title("Queue length over time" if what == "pending" else "GPU utilization over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, path)


def _fair_share(experiment: Experiment, result: Any, path: Path) -> Path:
    queues = sorted({q for s in result.timeline for q in s.fair_share} & set(result.quotas) or result.quotas)
    cols = min(4, max(1, len(queues)))
    rows = max(1, math.ceil(len(queues) / cols))
    fig = _figure(3.2 * cols, 2.4 * rows)
    axes = fig.subplots(rows, cols, squeeze=False)
    xs = [s.t / HOUR for s in result.timeline]
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
        ax.set_title(queue, fontsize=9)
        ax.tick_params(labelsize=7)
        if i == 0:
            ax.legend(fontsize=7)
    for j in range(len(queues), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(f"{result.policy}: GPUs allocated vs fair share per queue (x: hours)")
    return _save(fig, path)


def write_place_plot(results: dict[str, Any], folder: Path) -> Path:
    """`sim place --report DIR`: allocated against arrived GPU demand per placement (FGD's figure)."""
    check_plotting()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SimError("--report", f"cannot create {folder}: {exc.strerror}") from None
    fig = _figure()
    ax = fig.add_subplot()
    for name, r in results.items():
        # at the demand each point was read at (a large pod takes it past the 5% mark it crossed)
        xs = [r.get("curve_arrived", {}).get(k, float(k)) for k in r["curve"]]
        ax.plot(
            xs, list(r["curve"].values()), marker=".", label=f"{name} ({r['alloc_ratio_at_100']:.1%} at 100%)"
        )
    ax.plot([0, 1.3], [0, 1.3], color="grey", linestyle=":", linewidth=0.8, label="everything placed")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("arrived GPU demand (fraction of capacity)")
    ax.set_ylabel("allocated GPUs (fraction of capacity)")
    ax.set_title("Fragmentation: allocation against arrived demand")
    ax.grid(True, alpha=0.3)
    ax.legend()
    return _save(fig, folder / "place.png")
