"""`gpupool ps`'s table: a job array's pending tasks that wait for the same reason fold into one line;
`gpupool queues`' table wraps between words in a terminal too narrow for it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from gpupool.cli.render import efficiency_line, ps_table
from gpupool.cli.render_queues import QUEUE_COLUMNS, _budget_cell, queue_lines, queues_table
from gpupool.cli.render_usage import usage_table


def _task(wid: int, index: int, state: str, reason: str = "") -> dict[str, Any]:
    return {
        "id": wid, "name": "sweep", "queue": "default", "state": state, "gpus": "1", "age_seconds": 5.0,
        "reason": reason, "array_id": 10, "array_index": index, "exit_code": None,
    }  # fmt: skip


def _shown(workloads: list[dict[str, Any]]) -> list[str]:
    console = Console(width=200, record=True)
    console.print(ps_table(workloads))
    # each row's first line (a long reason folds onto lines of its own, with no id)
    return [line.strip() for line in console.export_text().splitlines()[1:] if line[:8].strip()]


def test_a_run_of_waiting_tasks_is_one_line_and_the_rest_stay_row_by_row() -> None:
    held = "array 10 runs at most 2 of its tasks at once (its %2); 2 are running or next in line"
    workloads = [
        _task(10, 0, "running"),
        _task(11, 1, "running"),
        *(_task(12 + i, 2 + i, "pending", held) for i in range(5)),
        {**_task(17, 0, "pending", "no capacity"), "array_id": None, "array_index": None, "name": "solo"},
    ]
    lines = _shown(workloads)
    assert len(lines) == 4, lines
    assert lines[0].split()[:2] == ["10", "sweep[0]"] and lines[1].split()[:2] == ["11", "sweep[1]"]
    assert lines[2].split()[:3] == ["12..16", "sweep[2..6]", "default"]
    assert lines[2].endswith("5 tasks: array 10 runs at most 2 of its tasks at once (its %2); 2 are")
    assert lines[3].split()[:2] == ["17", "solo"]


def test_waiting_tasks_whose_reasons_differ_only_in_the_work_ahead_of_each_are_one_line() -> None:
    """A full pool: each task's reason ends with how many wait ahead of it, one more for each task."""
    said = "waiting for GPUs to come free: queue nlp holds 8 GPUs, at or over its fair share of 8"
    tasks = [
        _task(12 + i, 2 + i, "pending", f"{said}; {i + 1} workload{'s' if i else ''} ahead") for i in range(4)
    ]
    lines = _shown(tasks)
    assert len(lines) == 1 and lines[0].split()[:2] == ["12..15", "sweep[2..5]"], lines
    assert "4 tasks: waiting for GPUs to come free" in lines[0], lines


def test_two_waiting_tasks_or_different_reasons_are_not_folded() -> None:
    lines = _shown([_task(12, 2, "pending", "a"), _task(13, 3, "pending", "a"), _task(14, 4, "pending", "b")])
    assert [line.split()[0] for line in lines] == ["12", "13", "14"]


def test_a_gang_shows_its_nodes_times_the_gpus_of_each() -> None:
    """`-N 2 --gpus 8` asks for 16 GPUs: GPUS says 2x8, not 8 (the API's gpus is per node)."""
    gang = {**_task(3, 0, "pending", "needs 2 nodes"), "array_id": None, "nodes": 2, "gpus": "8"}
    single = {**_task(4, 0, "pending"), "array_id": None, "nodes": 1, "gpus": "H100:8"}
    lines = _shown([gang, single])
    assert lines[0].split()[4] == "2x8" and lines[1].split()[4] == "H100:8", lines


def test_finished_work_shows_its_exit_code_or_why_it_ended() -> None:
    """Succeeded work its exit code; cancelled work who cancelled it (and the exit code it stopped with)."""
    never = {**_task(5, 0, "cancelled", "cancelled by alice before it started"), "array_id": None}
    ran = {**_task(6, 0, "cancelled", "cancelled by alice; exit code 143"), "array_id": None}
    ran["exit_code"] = 143
    done = {**_task(7, 0, "succeeded", "exit code 0"), "array_id": None, "exit_code": 0}
    lines = _shown([never, ran, done])
    assert lines[0].endswith("cancelled by alice before it started"), lines
    assert lines[1].endswith("cancelled by alice; exit code 143") and lines[2].endswith("exit 0"), lines


def test_a_running_service_not_ready_says_what_its_probe_saw() -> None:
    base = {**_task(8, 0, "running"), "array_id": None}
    waiting = {**base, "ready": False, "readiness": "GET /health answered 404"}
    ready = {**base, "id": 9, "ready": True, "readiness": "GET /health answered 200"}
    lines = _shown([waiting, ready, {**base, "id": 10}])
    assert lines[0].endswith("not ready: GET /health answered 404"), lines
    assert lines[1].endswith("5s") and lines[2].endswith("5s"), lines  # ready, or no probe: no reason


def test_the_efficiency_line_says_no_telemetry_rather_than_zero() -> None:
    now = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
    ran = {"gpu_indices": [0, 1], "gpu_fraction": 1.0, "pods": [], "started_at": "2026-12-03T10:30:00+00:00",
           "finished_at": "2026-12-03T11:48:00+00:00", "gpu_utilization_pct": 37.4,
           "gpu_memory_peak_bytes": 13 * 2**30, "gpu_memory_total_bytes": 80 * 2**30}  # fmt: skip
    assert efficiency_line(ran, now) == "2 GPUs x 1h18m, mean utilization 37%, peak memory 13.0GiB of 80.0GiB"
    unseen = {**ran, "gpu_utilization_pct": None, "gpu_memory_peak_bytes": None}
    assert efficiency_line(unseen, now) == "2 GPUs x 1h18m, no GPU telemetry"
    running = {**ran, "finished_at": None}
    assert str(efficiency_line(running, now)).endswith("so far") and "1h30m" in str(
        efficiency_line(running, now)
    )
    assert efficiency_line({**ran, "gpu_indices": []}, now) is None  # no GPUs: no line


def _queue(name: str, parent: str | None = None, budget: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name, "parent": parent, "priority": 0, "resources": {"gpu": {"quota": 4, "limit": 8}},
        "gpu_weight_now": 1.0, "fair_share": {"gpu": 2.67}, "gpus_allocated": 4, "gpus_pending": 2,
        "running": 3, "pending": 12, "budget": budget,
    }  # fmt: skip


@pytest.mark.parametrize("width", [100, 110, 120])
def test_the_queues_table_wraps_headers_between_words_and_keeps_a_line_per_queue(width: int) -> None:
    """With the budget column, from 100 columns: no header word split ("ALLOCAT / ED"), a line per queue
    but the one whose budget wraps, and that between words."""
    spent = {"gpu_hours": 0.001, "period": "day", "used_gpu_hours": 0.0013, "spent": True}
    queues = [
        _queue("default"),
        _queue("research", budget={"gpu_hours": 5000, "period": "month", "used_gpu_hours": 1234.0}),
        _queue("nlp-long-name", parent="research", budget=spent),
    ]
    console = Console(width=width, record=True)
    console.print(queues_table(queues))
    lines = console.export_text().splitlines()
    assert all(len(line) <= width for line in lines)
    header = lines[: next(i for i, line in enumerate(lines) if line.split()[:1] == ["default"])]
    words = {word for column in (*QUEUE_COLUMNS, "GPU-H BUDGET") for word in column.split()}
    assert {word for line in header for word in line.split()} == words, header
    starts = [line.split()[0] for line in lines[len(header) :] if line[:16].strip()]
    assert starts == ["default", "research", "nlp-long-name"]
    budget = next(line.index("GPU-H") for line in header if "GPU-H" in line)  # the last column
    wrapped = " ".join(line[budget:] for line in lines[len(header) :]).split()
    assert wrapped == [
        "-",
        "1,234",
        "of",
        "5000",
        "a",
        "month",
        "0.0013",
        "of",
        "0.001",
        "a",
        "day,",
        "spent",
    ]


def test_in_an_80_column_terminal_the_queues_table_keeps_every_header_word_whole() -> None:
    """Two spaces between columns leave an 80-column terminal too little room for the longest header words
    ("PARE / NT", "WEIGH / T"): one space is used instead, before any word is split."""
    console = Console(width=80, record=True)
    console.print(queues_table([_queue("default"), _queue("research"), _queue("nlp", parent="research")]))
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    header = lines[: next(i for i, line in enumerate(lines) if line.split()[:1] == ["default"])]
    words = {word for column in QUEUE_COLUMNS for word in column.split()}
    assert {word for line in header for word in line.split()} == words, header
    assert [line.split()[:2] for line in lines[len(header) :]] == [
        ["default", "-"], ["research", "-"], ["nlp", "research"],
    ]  # fmt: skip
    wide = Console(width=200, record=True)
    wide.print(queues_table([_queue("default")]))
    assert "NAME     PARENT  PRIO" in wide.export_text()  # with room, two spaces as before


def _usage_row(key: str, gpu_hours: float, pct: float | None) -> dict[str, Any]:
    return {
        "key": key, "gpu_hours": gpu_hours, "share": 0.5, "workloads": 1 if gpu_hours else 0,
        "used_gpu_hours": None if pct is None else gpu_hours * pct / 100, "gpu_utilization_pct": pct,
        "measured_gpu_hours": gpu_hours if pct is not None else 0.0, "by_outcome": {},
        "quota_gpu_hours": 96.0, "quota_used": 0.0,
    }  # fmt: skip


def test_usage_says_no_telemetry_only_for_gpu_hours_without_it() -> None:
    rows = [_usage_row("nlp", 4.0, 50.0), _usage_row("cv", 2.0, None), _usage_row("default", 0.0, None)]
    report = {
        "by": "queue", "currency": None, "rows": rows, "total": {**_usage_row("TOTAL", 6.0, 50.0)},
        "capacity_gpu_hours": 192.0, "capacity_gpus": 8, "since": "2026-12-03T20:00:00",
        "until": "2026-12-04T20:00:00", "hours": 24.0,
    }  # fmt: skip
    console = Console(width=200, record=True)
    console.print(usage_table(report))
    lines = [line.split() for line in console.export_text().splitlines() if line.strip()]
    cells = {words[0]: words[1:4] for words in lines}
    assert cells["nlp"] == ["4.00", "2.00", "50%"]
    assert cells["cv"] == ["2.00", "-", "no"]  # "no telemetry": its GPU-hours were not measured
    assert cells["default"] == ["0.00", "-", "-"]  # it held no GPUs: nothing to measure


def test_queue_show_says_what_of_the_pending_demand_is_held_back_before_the_scheduler() -> None:
    """Held, dependency-waiting or backing-off work counts in "pending" but not in the fair share: said so,
    and nothing said when none is held back."""
    shown = {**_queue("nlp"), "created_at": "2026-12-01T00:00:00+00:00", "updated_at": None}
    plain = " ".join(queue_lines(shown))
    assert "12 pending asking for 2 GPUs" in plain and "held back" not in plain
    some = " ".join(queue_lines({**shown, "gpus_held_back": 1}))
    said = "asking for 2 GPUs (1 of them held back or never fitting, which fair share does not count)"
    assert said in some
    every = " ".join(queue_lines({**shown, "gpus_held_back": 2}))
    assert "asking for 2 GPUs (all of them held back or never fitting" in every


def test_names_and_slurm_words_print_as_written_with_no_emoji(capsys: pytest.CaptureFixture[str]) -> None:
    """A job named ':fire:' showed a flame, and Slurm's reason 'NtasksPerN:B:S:C' a letter in a box."""
    from gpupool.cli.render import console, print_error

    console.print(":fire: job NtasksPerN:B:S:C", highlight=False)
    print_error("--name ':b:' is taken")
    out, err = capsys.readouterr()
    assert out == ":fire: job NtasksPerN:B:S:C\n"
    assert err == "error: --name ':b:' is taken\n"


def test_the_rank_that_ended_a_gang_is_pointed_to_when_another_is_shown() -> None:
    from gpupool.cli.render import rank_hint

    reason = "exit code 2 (rank 1 on node-b exited with code 2)"
    assert rank_hint(68, reason) == "rank 1 ended the attempt: its output is `gpupool logs 68 --rank 1`"
    assert rank_hint(68, reason, shown=1) is None
    assert rank_hint(68, "exit code 2 (rank 0 on node-a exited with code 2)") is None
    assert rank_hint(68, "exit code 3") is None


def test_why_says_when_reclaim_gives_a_queue_no_more_for_a_job_larger_than_its_quota_and_share() -> None:
    from gpupool.cli.workloads import _beyond_reclaim

    queue = {"name": "nlp", "gpus_allocated": 0.0, "resources": {"gpu": {"quota": 4}}}
    six = {"state": "pending", "reason_code": "no-capacity", "gpus": "6", "nodes": 1}
    assert _beyond_reclaim(six, queue, 5.14) == (
        "reclaim takes no GPUs from other queues for it: with its 6 GPUs queue nlp would hold 6, above both "
        "its quota (4) and its fair share (5.14), the most reclaim gives a queue; it starts when 6 GPUs come "
        "free"
    )
    assert _beyond_reclaim({**six, "gpus": "H100:2", "nodes": 2}, queue, 5.14) == ""  # 4: within its quota
    assert _beyond_reclaim(six, queue, 6.0) == ""  # within its fair share: reclaim may act
    assert _beyond_reclaim({**six, "reason_code": "queue-limit"}, queue, 1.0) == ""
    # within its quota, above its fair share: the quotas promise more than there is (a node out)
    nlp = {"name": "nlp", "gpus_allocated": 12.0, "resources": {"gpu": {"quota": 20}}}
    four = {**six, "gpus": "4"}
    assert _beyond_reclaim(four, nlp, 15.0) == (
        "reclaim takes no GPUs from other queues for it: with its 4 GPUs queue nlp would hold 16, above its "
        "fair share (15), the most reclaim gives a queue, although within its quota (20): the quotas it "
        "shares GPUs under promise more than there are (nodes out of service, or a parent queue's smaller "
        "share), so each queue's guarantee shrinks in proportion (`gpupool queues`: FAIR SHARE); it starts "
        "when 4 GPUs come free"
    )
    assert _beyond_reclaim(four, nlp, 16.0) == ""
    # a gang waits for nodes, not for a count of GPUs anywhere (a cordoned node kept one from starting)
    gang = _beyond_reclaim({**six, "gpus": "2", "nodes": 3}, queue, 5.14)
    assert gang.endswith("it starts when 3 schedulable nodes have 2 GPUs free each"), gang


def test_a_budget_that_stops_running_work_says_so_in_queue_show_and_the_table() -> None:
    budget = {
        "gpu_hours": 200,
        "period": "week",
        "used_gpu_hours": 201.0,
        "spent": True,
        "when_spent": "stop",
    }
    shown = " ".join(queue_lines({**_queue("nlp", budget=budget), "created_at": "x", "updated_at": "y"}))
    assert (
        "when spent, running work stops too (when_spent: stop); spent: its running work is stopped" in shown
    )
    assert _budget_cell(budget) == "201 of 200 a week, spent (running work stopped)"
    waits = {**budget, "when_spent": "wait"}
    told = " ".join(queue_lines({**_queue("nlp", budget=waits), "created_at": "x", "updated_at": "y"}))
    assert "; spent: new work waits" in told
    assert _budget_cell(waits) == "201 of 200 a week, spent"


def test_node_lists_read_as_slurms_nodelist_and_stay_narrow() -> None:
    from gpupool.cli.render import node_list

    assert node_list([]) == "-"
    assert node_list(["node-1"]) == "node-1"
    assert node_list(["node-2", "node-1"]) == "node-[1-2]"
    assert node_list(["gpu-04", "gpu-01", "gpu-03"]) == "gpu-[01,03-04]"
    assert node_list(["n9", "n10", "n11"]) == "n[9-11]"
    assert node_list(["alpha", "beta", "gamma"]) == "alpha+2"  # no numbered stem: rank 0's and how many more
    assert node_list(["a-1", "b-2"]) == "a-1+1"
    spread = [f"rack-a-node-{i}" for i in range(1, 40, 2)]
    assert node_list(spread) == "rack-a-node-1+19"  # wider than the column: shortened


def test_ps_names_every_node_of_a_gang_and_where_finished_work_ran() -> None:
    """NODE showed rank 0's node alone for a gang, and "-" for every finished workload."""
    base = {**_task(3, 0, "running"), "array_id": None, "array_index": None}
    gang = {**base, "nodes": 2, "gpus": "4", "node": "node-1", "node_list": ["node-1", "node-2"]}
    done = {**base, "id": 4, "state": "succeeded", "exit_code": 0, "node": None, "node_list": ["node-2"]}
    older_head = {**base, "id": 5, "node": "node-3"}  # a head whose views have no node_list
    waiting = {**base, "id": 6, "state": "pending", "node": None, "node_list": []}
    lines = _shown([gang, done, older_head, waiting])
    assert [line.split()[5] for line in lines] == ["node-[1-2]", "node-2", "node-3", "-"], lines


def test_show_gives_each_rank_of_a_gang_its_node_and_gpus() -> None:
    """`evicted on node-1 GPUs 0,1,2,3 ranks on node-1,node-2` named rank 0's GPUs alone, though node-2
    was the one lost."""
    from gpupool.cli.workloads import _attempt_line

    pods = [{"node": "node-1", "gpu_indices": [0, 1, 2, 3], "gpu_fraction": 1.0},
            {"node": "node-2", "gpu_indices": [4, 5, 6, 7], "gpu_fraction": 1.0}]  # fmt: skip
    gang = {"state": "evicted", "node": "node-1", "gpu_indices": [0, 1, 2, 3], "gpu_fraction": 1.0,
            "backend": "agent", "pods": pods, "queue": "default", "exit_code": None,
            "reason": "gang lost part of its placement (node-2); restarting it whole"}  # fmt: skip
    line = Console(width=300).render_str(_attempt_line(gang, "default")).plain
    assert line == (
        "evicted on 2 nodes (rank 0: node-1 GPUs 0,1,2,3; rank 1: node-2 GPUs 4,5,6,7) gang lost part of its "
        "placement (node-2); restarting it whole"
    )
    one = {
        **gang,
        "state": "running",
        "pods": pods[:1],
        "gpu_indices": [0],
        "gpu_fraction": 0.5,
        "reason": "",
    }
    assert Console().render_str(_attempt_line(one, "default")).plain == "running on node-1 0.5 of GPU 0"


def test_counts_of_one_are_said_in_the_singular() -> None:
    from gpupool.cli.render import counted, gpus

    shown = {**_queue("nlp"), "gpus_allocated": 1, "gpus_pending": 1, "created_at": "x", "updated_at": "y"}
    shown["user_limits"] = {"gpus": 1, "workloads": 1}
    lines = " ".join(queue_lines(shown))
    assert "now: 1 GPU allocated" in lines and "asking for 1 GPU" in lines and "1 GPUs" not in lines
    assert "each user at most: 1 GPU, 1 workload" in lines
    assert [gpus(1), gpus(0.5), counted(2, "node"), counted(1, "node")] == [
        "1 GPU",
        "0.5 GPUs",
        "2 nodes",
        "1 node",
    ]


def test_ps_with_nothing_to_list_says_what_it_looked_for() -> None:
    from gpupool.cli.workloads import _none_listed

    assert _none_listed(None, None, None, None, False) == "no pending or running workloads (see --all)"
    assert _none_listed(None, None, None, None, True) == "no workloads"
    assert _none_listed("pending,running", "research", None, None, False) == (
        "no pending or running workloads in queue research"
    )
    said = _none_listed("failed", None, "alice", "train", True)
    assert said == "no failed workloads named train of user alice"
