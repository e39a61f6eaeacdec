"""Replays side by side (`--jobs`): each in a process of its own, with the results of one after another.

A replay is deterministic and shares nothing with the others, so the policies of a `sim run` (or whatif's
two clusters) can run at once. Workers are started with `spawn` (never `fork`: the parent may hold threads,
such as rich's progress bar), import gpupool as any process does (compiled or source alike, see
`gpupool.native`), and report progress through a queue that the parent reads while it waits. With one
process (`--jobs 1`), or one replay, everything runs in this process as it always did.
"""

from __future__ import annotations

import multiprocessing
import os
import queue as stdlib_queue
import signal
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, fields
from multiprocessing.reduction import ForkingPickler
from typing import Any

from gpupool.scheduler import GpuView, NodeView, QueueView, SchedulerConfig, Share
from gpupool.sim.cluster import Cluster
from gpupool.sim.engine import Simulation
from gpupool.sim.errors import SimError
from gpupool.sim.policies import Policy
from gpupool.sim.results import SimOptions, SimResult
from gpupool.sim.trace import TraceJob

AUTO = "auto"
POLL_S = 0.1  # how often the parent looks for finished replays between progress reports
Progress = Callable[[str, int, int], None]  # (replay's name, jobs settled, jobs in all)

# The scheduler's types that a replay's inputs hold. Compiled with mypyc, a frozen dataclass cannot be
# unpickled (its state is set attribute by attribute, which frozen forbids); every field of these is a
# constructor argument, so they travel as their fields and are built again in the worker.
BY_CONSTRUCTOR: tuple[type, ...] = (GpuView, NodeView, Share, QueueView, SchedulerConfig)


def _by_constructor(obj: Any) -> tuple[type, tuple[Any, ...]]:
    return type(obj), tuple(getattr(obj, f.name) for f in fields(obj))


for _cls in BY_CONSTRUCTOR:
    ForkingPickler.register(_cls, _by_constructor)


@dataclass(frozen=True, slots=True)
class Replay:
    """One replay's inputs: what `Simulation` is given, and the name progress reports call it by."""

    name: str  # the policy's, or whatif's "before" / "after"
    jobs: Sequence[TraceJob]
    origin: float
    cluster: Cluster
    queues: tuple[QueueView, ...]
    policy: Policy
    options: SimOptions | None = None

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        sim = Simulation(self.jobs, self.origin, self.cluster, self.queues, self.policy, self.options)
        return sim.run(progress)


def processes(jobs: int | str, replays: int) -> int:
    """How many replays `--jobs` runs at once: `auto` is one per replay, at most one per CPU this process
    may use; never more than there are replays."""
    text = str(jobs).strip().lower()
    if text == AUTO:
        return max(1, min(replays, _cpus()))
    try:
        count = int(text)
    except ValueError:
        raise SimError(
            "--jobs", f"{jobs!r} is not a whole number; give how many replays run at once, e.g. 2, or auto"
        ) from None
    if count < 1:
        raise SimError(
            "--jobs", f"{count} runs nothing; give at least 1 (1: one replay after another) or auto"
        )
    return max(1, min(count, replays))


def _cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def replay_all(replays: Sequence[Replay], workers: int, progress: Progress | None = None) -> list[SimResult]:
    """Every replay's result, in the order of `replays`, whatever order they finish in."""
    if workers <= 1 or len(replays) <= 1:
        return [r.run(None if progress is None else _bind(progress, r.name)) for r in replays]
    return _in_processes(replays, workers, progress)


def _bind(progress: Progress, name: str) -> Callable[[int, int], None]:
    return lambda done, total: progress(name, done, total)


# In a worker: where its replays report (index, settled, total). Set by `_start_worker`.
_reports: Any = None


def _start_worker(reports: Any) -> None:
    # Ctrl-C reaches the whole process group; the parent alone handles it, by stopping the workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    global _reports
    _reports = reports


def _replay_in_worker(
    index: int, replay: Replay, reporting: bool
) -> tuple[SimResult, tuple[int, int] | None]:
    """The result and the last progress reported (the queue may deliver it after the result)."""
    last: tuple[int, int] | None = None

    def report(done: int, total: int) -> None:
        nonlocal last
        last = (done, total)
        _reports.put((index, done, total))

    return replay.run(report if reporting else None), last


def _in_processes(replays: Sequence[Replay], workers: int, progress: Progress | None) -> list[SimResult]:
    context = multiprocessing.get_context("spawn")
    reports = context.Queue()
    shown = [-1] * len(replays)  # the most jobs settled shown per replay: reports may arrive out of order

    def show(index: int, done: int, total: int) -> None:
        if progress is not None and done > shown[index]:
            shown[index] = done
            progress(replays[index].name, done, total)

    pool = ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker, initargs=(reports,))
    started: list[multiprocessing.process.BaseProcess] = []
    try:
        reporting = progress is not None
        futures = [pool.submit(_replay_in_worker, i, r, reporting) for i, r in enumerate(replays)]
        # The workers, held here: once a worker dies, the executor forgets them while it ends the others.
        started = _workers(pool)
        index = {f: i for i, f in enumerate(futures)}
        waiting: set[Future[tuple[SimResult, tuple[int, int] | None]]] = set(futures)
        while waiting:
            finished, waiting = wait(waiting, timeout=POLL_S, return_when=FIRST_COMPLETED)
            _drain(reports, show)
            for future in finished:
                _, last = future.result()  # a worker's exception is raised here, as it was raised there
                if last is not None:
                    show(index[future], *last)
        results = [f.result()[0] for f in futures]
    except BrokenProcessPool:
        _stop(pool, started)
        raise SimError(
            "--jobs", "a replay's process ended abruptly (out of memory?); --jobs 1 replays in this process"
        ) from None
    except BaseException:
        _stop(pool, started)
        raise
    else:
        pool.shutdown(wait=True)
    finally:
        reports.close()
        reports.join_thread()
    return results


def _drain(reports: Any, show: Callable[[int, int, int], None]) -> None:
    while True:
        try:
            index, done, total = reports.get_nowait()
        except stdlib_queue.Empty:
            return
        show(index, done, total)


def _workers(pool: ProcessPoolExecutor) -> list[multiprocessing.process.BaseProcess]:
    # The executor offers no public way to reach its workers before Python 3.14 (`terminate_workers`).
    return list((getattr(pool, "_processes", None) or {}).values())


def _stop(pool: ProcessPoolExecutor, workers: list[multiprocessing.process.BaseProcess]) -> None:
    """Cancel what has not started and end the workers now (an error elsewhere, or Ctrl-C): none is left
    running a replay nobody will read, and each is waited for."""
    workers = workers + [p for p in _workers(pool) if p not in workers]
    for process in workers:
        if process.is_alive():
            process.terminate()
    for process in workers:
        process.join(timeout=5)
    # A worker ended while it wrote its result leaves part of a message in the executor's result pipe, and
    # the executor's thread waits for the rest for ever: this process holds the pipe's write end too, so no
    # end of file comes (a clean-clone CI run hung on it, 2026-12-08). Closing that end, with every
    # worker gone, ends the wait; the thread then ends as it does for a broken pool.
    writer = getattr(getattr(pool, "_result_queue", None), "_writer", None)
    if writer is not None:
        writer.close()
    # The executor's own thread reaps the workers it watches (a join of ours can return while it does):
    # waiting for it, with nothing left to start, is waiting for every worker to be gone.
    pool.shutdown(wait=True, cancel_futures=True)
    for process in workers:
        process.join(timeout=5)
