"""`--jobs`: replays in processes of their own give what one after another in this process gives."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpupool.cli.app import app
from gpupool.scheduler import ConfigError, QueueView, Share
from gpupool.sim import experiment as ex
from gpupool.sim.cluster import Cluster, parse_groups
from gpupool.sim.errors import SimError
from gpupool.sim.metrics import summarize
from gpupool.sim.parallel import Replay, processes, replay_all
from gpupool.sim.policies import BY_NAME
from gpupool.sim.results import SimOptions, SimResult
from gpupool.sim.trace import TraceJob
from gpupool.sim.whatif import changed, compare

POLICIES = "fifo,las,gpupool"
TIMED = ("wall_s", "decide_s")  # real time, measured in whichever process ran the replay


def synthetic_jobs(count: int = 90) -> list[TraceJob]:
    """Jobs of 1 to 16 GPUs in three queues, arriving faster than 2x8 GPUs serve them: LAS preempts."""
    jobs = []
    for i in range(count):
        gpus = (1, 2, 4, 8, 16)[(i * 7) % 5]
        duration = 300.0 + (i * 733) % 9_000
        jobs.append(TraceJob(i, 120.0 * i, duration, gpus, ("nlp", "cv", "rl")[i % 3]))
    return jobs


@pytest.fixture
def trace(tmp_path: Path) -> str:
    path = tmp_path / "jobs.csv"
    rows = [f"{j.submit:g},{j.duration:g},{j.gpus:g},{j.queue}" for j in synthetic_jobs()]
    path.write_text("submit_time,duration,num_gpus,queue\n" + "\n".join(rows) + "\n")
    return f"csv:{path}"


def replayed(trace: str, jobs: int | str, progress: ex.Progress | None = None) -> ex.Experiment:
    return ex.run(ex.prepare(trace, "2x8", policies=POLICIES, workers=jobs), progress)


def untimed(figures: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in figures.items() if k not in TIMED}


def test_two_processes_give_every_job_the_outcome_one_process_gives_in_policy_order(trace: str) -> None:
    serial, parallel = replayed(trace, 1), replayed(trace, 2)
    assert parallel.workers == 2
    assert [r.policy for r in parallel.results] == ["fifo", "las", "gpupool"]
    assert list(parallel.metrics) == ["fifo", "las", "gpupool"]
    for one, two in zip(serial.results, parallel.results, strict=True):
        assert two.jobs == one.jobs  # start, finish, queueing, preemptions, lost work of every job
        assert two.timeline == one.timeline and two.cycles == one.cycles
        assert untimed(summarize(two)) == untimed(summarize(one))
    assert serial.metrics["las"]["preemptions"] > 0  # the trace exercises more than FIFO


def test_progress_reaches_every_policys_total_from_the_worker_processes(trace: str) -> None:
    seen: dict[str, list[tuple[int, int]]] = {}
    replayed(trace, 2, lambda name, done, total: seen.setdefault(name, []).append((done, total)))
    assert list(seen) and set(seen) == {"fifo", "las", "gpupool"}
    for reports in seen.values():
        assert reports[-1] == (90, 90)
        assert [done for done, _ in reports] == sorted(done for done, _ in reports)  # never backwards


@pytest.mark.parametrize(("value", "message"), [
    ("0", "--jobs: 0 runs nothing; give at least 1"),
    (-2, "--jobs: -2 runs nothing"),
    ("many", "--jobs: 'many' is not a whole number"),
])  # fmt: skip
def test_a_bad_jobs_value_names_the_flag_before_anything_is_read(value: str | int, message: str) -> None:
    with pytest.raises(SimError, match=message) as raised:
        ex.prepare("csv:/nowhere.csv", "2x8", policies=POLICIES, workers=value)  # the trace is never read
    assert raised.value.flag == "--jobs"
    with pytest.raises(SimError, match="--jobs"):
        compare([], ([], []), ([], []), BY_NAME["fifo"], workers=value)


def test_auto_runs_one_process_per_replay_at_most_one_per_cpu() -> None:
    assert 1 <= processes("auto", 3) <= 3
    assert processes("auto", 1) == 1
    assert processes(8, 3) == 3  # never more processes than replays
    assert processes("1", 3) == 1


def test_sim_run_with_two_jobs_writes_the_figures_of_one(trace: str, tmp_path: Path) -> None:
    figures = []
    for jobs in ("1", "2"):
        out = tmp_path / f"jobs{jobs}.json"
        args = ["sim", "run", "--trace", trace, "--cluster", "2x8", "--policy", POLICIES, "--jobs", jobs,
                "--json", str(out), "--quiet"]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        data = json.loads(out.read_text())
        data["policies"] = {name: untimed(f) for name, f in data["policies"].items()}
        figures.append(data)
    assert list(figures[1]["policies"]) == ["fifo", "las", "gpupool"]
    assert figures[1] == figures[0]


def test_sim_run_refuses_a_bad_jobs_value_in_one_line(trace: str) -> None:
    result = CliRunner().invoke(app, ["sim", "run", "--trace", trace, "--cluster", "2x8", "--jobs", "0"])
    assert result.exit_code == 1
    assert "--jobs: 0 runs nothing" in result.output and "jobs from" not in result.output


def test_whatif_compares_both_clusters_in_two_processes_as_in_one() -> None:
    nodes = parse_groups("1x8", "--cluster")
    queues = [QueueView("nlp", gpu=Share(quota=4.0)), QueueView("cv", gpu=Share(quota=4.0))]
    jobs = [replace(j, queue=("nlp", "cv")[j.id % 2]) for j in synthetic_jobs(40)]
    after = changed(nodes, queues, add=["1x8:H100"], quotas=["nlp=6"])
    serial = compare(jobs, (nodes, queues), after, BY_NAME["gpupool"], workers=1)
    assert compare(jobs, (nodes, queues), after, BY_NAME["gpupool"], workers=2) == serial
    assert (serial["before"]["gpus"], serial["after"]["gpus"]) == (8, 16)


def test_a_replays_inputs_travel_to_a_worker_even_compiled() -> None:
    # Compiled with mypyc, the scheduler's frozen dataclasses do not unpickle as they are (see parallel.py).
    nodes = tuple(parse_groups("2x8:H100", "--cluster"))
    queues = (QueueView("nlp", gpu=Share(quota=8.0, limit=12.0)),)
    cluster = Cluster(nodes, "2x8:H100")
    replay = Replay("gpupool", synthetic_jobs(3), 0.0, cluster, queues, BY_NAME["gpupool"], SimOptions())
    assert pickle.loads(ForkingPickler.dumps(replay)) == replay
    error = pickle.loads(pickle.dumps(SimError("--trace", "no such file")))
    assert (error.flag, error.message, str(error)) == ("--trace", "no such file", "--trace: no such file")


def test_an_error_in_a_worker_reaches_the_caller_as_itself_and_no_worker_is_left() -> None:
    nodes = tuple(parse_groups("1x8", "--cluster"))
    broken = replace(BY_NAME["fifo"], config=replace(BY_NAME["fifo"].config, actions=("allocate", "bogus")))
    cluster = Cluster(nodes, "1x8")
    replays = [Replay(p.name, synthetic_jobs(10), 0.0, cluster, (), p) for p in (BY_NAME["las"], broken)]
    with pytest.raises(ConfigError, match="unknown scheduler action 'bogus'"):
        replay_all(replays, 2)
    assert multiprocessing.active_children() == []


@dataclass(frozen=True, slots=True)
class RefusedReplay(Replay):
    """A replay that fails in its worker as a bad input would."""

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        raise SimError("--queues", "queue 'nlp' asks for more GPUs than the cluster has")


@dataclass(frozen=True, slots=True)
class DyingReplay(Replay):
    """A replay whose process ends abruptly, as one killed for its memory would."""

    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        os._exit(1)


@pytest.mark.parametrize(("kind", "message"), [
    (RefusedReplay, "--queues: queue 'nlp' asks for more GPUs than the cluster has"),
    (DyingReplay, "--jobs: a replay's process ended abruptly"),
])  # fmt: skip
def test_a_failing_worker_is_one_clear_error_and_ends_the_others(kind: type[Replay], message: str) -> None:
    cluster = Cluster(tuple(parse_groups("1x8", "--cluster")), "1x8")
    replays = [Replay("las", synthetic_jobs(), 0.0, cluster, (), BY_NAME["las"]),
               kind("fifo", synthetic_jobs(), 0.0, cluster, (), BY_NAME["fifo"])]  # fmt: skip
    with pytest.raises(SimError, match=message):
        replay_all(replays, 2)
    assert multiprocessing.active_children() == []


def test_an_interrupt_while_waiting_stops_every_worker(trace: str) -> None:
    def interrupt(name: str, done: int, total: int) -> None:
        raise KeyboardInterrupt  # what Ctrl-C raises in the parent while it waits

    with pytest.raises(KeyboardInterrupt):
        replayed(trace, 2, interrupt)
    assert multiprocessing.active_children() == []


def _pause(seconds: float) -> float:
    import time

    time.sleep(seconds)
    return seconds


def test_stopping_the_workers_ends_while_the_executor_waits_for_the_rest_of_a_result() -> None:
    """A worker ended while it wrote its result left half a message in the result pipe, and the executor's
    thread waited for the rest for ever (a clean-clone CI run hung on it): here a message's header alone is
    written to that pipe, as such a worker leaves it, and stopping must still end, with no worker left."""
    import struct
    import threading
    from concurrent.futures import ProcessPoolExecutor

    from gpupool.sim.parallel import _stop, _workers

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    pool.submit(_pause, 30.0)
    workers = _workers(pool)
    os.write(pool._result_queue._writer.fileno(), struct.pack("!i", 1000))  # type: ignore[attr-defined]
    stopper = threading.Thread(target=_stop, args=(pool, workers), daemon=True)
    stopper.start()
    stopper.join(timeout=20)
    assert not stopper.is_alive(), "stopping hung on the half-written result"
    assert not any(p.is_alive() for p in workers)
