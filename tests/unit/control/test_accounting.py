"""GPU-hours and cost reports (control/accounting.py) on a real SQLite store: what a window counts, how
pods, fractions, models, prices, days and outcomes add up, and the errors of a bad window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from gpupool.control import accounting, queues, tokens
from gpupool.control.errors import Invalid
from gpupool.spec import parse_queue_spec
from gpupool.spec.prices import parse_prices_spec
from gpupool.store.db import Store
from gpupool.store.models import Attempt, Gpu, Node, Workload

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)


def _node(store: Store, name: str, model: str, gpus: int = 8, state: str = "ready") -> None:
    with store.session() as s:
        node = Node(name=name, state=state)
        node.gpus = [Gpu(index=i, uuid=f"GPU-{name}-{i}", model=model) for i in range(gpus)]
        s.add(node)


def _attempt(
    store: Store,
    start: datetime,
    end: datetime | None,
    *,
    gpus: int = 1,
    node: str = "a",
    queue: str = "default",
    name: str = "train",
    user: str = "admin",
    state: str = "succeeded",
    pods: list[dict[str, Any]] | None = None,
    fraction: float = 1.0,
) -> int:
    with store.session() as s:
        workload = Workload(name=name, queue=queue, user=user, spec={}, state="succeeded", version=1)
        s.add(workload)
        s.flush()
        s.add(
            Attempt(
                workload_id=workload.id, queue=queue, number=0, state=state, node_name=node,
                gpu_indices=list(range(gpus)), gpu_fraction=fraction, pods=pods or [],
                started_at=start, finished_at=end,
            )
        )  # fmt: skip
        return workload.id


def _report(store: Store, since: datetime, until: datetime = NOW, **options: Any) -> dict[str, Any]:
    return accounting.usage(store, since, until, now=NOW, **options)


def _rows(report: dict[str, Any]) -> dict[str, float]:
    return {row["key"]: row["gpu_hours"] for row in report["rows"]}


def test_only_the_part_of_an_attempt_inside_the_window_counts_and_running_work_counts_until_now(
    store: Store,
) -> None:
    _node(store, "a", "H100")
    _attempt(store, NOW - 3 * H, NOW - H, gpus=2)  # 2 GPUs for 2 h, 1 h of it in the window
    _attempt(store, NOW - H / 2, None, gpus=4, state="running")  # 4 GPUs for the last half hour
    _attempt(store, NOW - 10 * H, NOW - 5 * H, gpus=8)  # before the window
    report = _report(store, NOW - 2 * H)
    assert report["total"]["gpu_hours"] == pytest.approx(2.0 + 2.0)
    assert report["total"]["by_outcome"] == {"succeeded": pytest.approx(2.0), "running": pytest.approx(2.0)}
    assert report["total"]["workloads"] == 2
    assert report["hours"] == pytest.approx(2.0)
    assert report["capacity_gpus"] == 8 and report["capacity_gpu_hours"] == pytest.approx(16.0)
    assert report["currency"] is None and report["total"]["cost"] is None


def test_windows_side_by_side_count_every_hour_once(store: Store) -> None:
    _node(store, "a", "H100")
    for hours_ago, length in ((30, 5), (20, 9), (13, 2), (6, 3)):
        _attempt(store, NOW - hours_ago * H, NOW - (hours_ago - length) * H, gpus=3)
    whole = _report(store, NOW - 30 * H)["total"]["gpu_hours"]
    parts = [
        _report(store, NOW - a * H, NOW - b * H)["total"]["gpu_hours"] for a, b in ((30, 16), (16, 7), (7, 0))
    ]
    assert sum(parts) == pytest.approx(whole) == pytest.approx(3 * (5 + 9 + 2 + 3))


def test_gang_pods_fractions_and_models_with_prices_and_an_unpriced_model(store: Store) -> None:
    _node(store, "a", "H100")
    _node(store, "b", "A100")
    pods = [
        {"node": "a", "gpu_indices": [0, 1], "gpu_fraction": 1.0, "model": "H100"},
        {"node": "b", "gpu_indices": [0], "gpu_fraction": 0.5, "model": "A100"},
    ]
    _attempt(store, NOW - 2 * H, NOW, pods=pods)
    prices = parse_prices_spec({"currency": "EUR", "gpu_hour": {"h100": 2.0}})
    report = _report(store, NOW - 2 * H, by="model", prices=prices)
    rows = {row["key"]: row for row in report["rows"]}
    assert rows["H100"]["gpu_hours"] == pytest.approx(4.0) and rows["H100"]["cost"] == pytest.approx(8.0)
    assert rows["A100"]["gpu_hours"] == pytest.approx(1.0)
    assert rows["A100"]["cost"] is None and rows["A100"]["unpriced_gpu_hours"] == pytest.approx(1.0)
    assert report["currency"] == "EUR" and report["total"]["cost"] == pytest.approx(8.0)
    by_node = _rows(_report(store, NOW - 2 * H, by="node"))
    assert by_node == {"a": pytest.approx(4.0), "b": pytest.approx(1.0)}
    priced = parse_prices_spec({"gpu_hour": {"H100": 2.0, "default": 1.5}})
    total = _report(store, NOW - 2 * H, prices=priced)["total"]
    assert total["cost"] == pytest.approx(8.0 + 1.5) and total["unpriced_gpu_hours"] == 0.0


def test_a_pod_without_a_recorded_model_takes_its_nodes_and_a_vanished_node_is_unknown(store: Store) -> None:
    _node(store, "a", "L40S")
    _attempt(store, NOW - H, NOW, node="a", gpus=1)  # recorded before attempts kept their model
    _attempt(store, NOW - H, NOW, node="gone", gpus=2)
    assert _rows(_report(store, NOW - H, by="model")) == {
        "unknown": pytest.approx(2.0),
        "L40S": pytest.approx(1.0),
    }


def test_days_split_at_utc_midnight(store: Store) -> None:
    _node(store, "a", "H100")
    midnight = datetime(2026, 12, 3, tzinfo=UTC)
    _attempt(store, midnight - 2 * H, midnight + 3 * H, gpus=2)
    report = _report(store, midnight - 24 * H, by="day")
    assert [row["key"] for row in report["rows"]] == ["2026-12-02", "2026-12-03"]
    assert _rows(report) == {"2026-12-02": pytest.approx(4.0), "2026-12-03": pytest.approx(6.0)}


def test_queues_with_their_quota_including_one_that_used_nothing(store: Store) -> None:
    _node(store, "a", "H100")
    queues.create_queue(store, parse_queue_spec({"name": "nlp", "resources": {"gpu": {"quota": 4}}}))
    queues.create_queue(store, parse_queue_spec({"name": "vision", "resources": {"gpu": {"quota": 2}}}))
    _attempt(store, NOW - 10 * H, NOW, gpus=2, queue="nlp")
    report = _report(store, NOW - 10 * H)
    rows = {row["key"]: row for row in report["rows"]}
    assert [row["key"] for row in report["rows"]] == ["nlp", "default", "vision"]  # most used first
    assert rows["nlp"]["quota_gpu_hours"] == pytest.approx(40.0) and rows["nlp"][
        "quota_used"
    ] == pytest.approx(0.5)
    assert rows["vision"]["gpu_hours"] == 0.0 and rows["vision"]["quota_gpu_hours"] == pytest.approx(20.0)
    assert rows["default"]["quota_used"] is None  # no quota: nothing to use of it
    only = _report(store, NOW - 10 * H, queue="vision")
    assert [row["key"] for row in only["rows"]] == ["vision"] and only["total"]["gpu_hours"] == 0.0
    assert only["rows"][0]["quota_gpu_hours"] == pytest.approx(20.0)  # its quota, unused: its line says so


def test_a_parent_queues_row_says_what_its_queues_used_and_its_quota_counts_them(store: Store) -> None:
    """A department's own row stays its own (the total counts nothing twice); beside it, what the queues
    under it used, at any depth, and its quota (which covers them) is read against both."""
    _node(store, "a", "H100")
    for name, parent, quota in (("research", None, 6), ("nlp", "research", 4), ("bert", "nlp", 0)):
        spec = {"name": name, "parent": parent, "resources": {"gpu": {"quota": quota}}}
        queues.create_queue(store, parse_queue_spec(spec))
    _attempt(store, NOW - 10 * H, NOW, gpus=2, queue="nlp")
    _attempt(store, NOW - 10 * H, NOW, gpus=1, queue="bert")
    report = _report(store, NOW - 10 * H)
    rows = {row["key"]: row for row in report["rows"]}
    assert rows["research"]["gpu_hours"] == 0.0 and rows["research"]["gpu_hours_below"] == pytest.approx(30.0)
    assert rows["research"]["quota_used"] == pytest.approx(30.0 / 60.0)
    assert rows["nlp"]["gpu_hours_below"] == pytest.approx(10.0)
    assert rows["nlp"]["quota_used"] == pytest.approx(30.0 / 40.0)
    assert "gpu_hours_below" not in rows["bert"] and report["total"]["gpu_hours"] == pytest.approx(30.0)
    # the department's own report (`usage --queue research`): its own row and every queue under it, one
    # that used nothing too (its row was left out: the report read as if research held nothing of its own)
    queues.create_queue(store, parse_queue_spec({"name": "idle", "parent": "research"}))
    tree = {row["key"]: row for row in _report(store, NOW - 10 * H, queue="research")["rows"]}
    assert set(tree) == {"research", "nlp", "bert", "idle"}, tree
    assert tree["research"]["gpu_hours_below"] == pytest.approx(30.0) and tree["idle"]["gpu_hours"] == 0.0


def test_outcomes_users_and_workloads(store: Store) -> None:
    _node(store, "a", "H100")
    first = _attempt(store, NOW - 4 * H, NOW - 3 * H, state="evicted", user="alice", name="big")
    _attempt(store, NOW - 2 * H, NOW - H, state="failed", user="bob", gpus=2)
    assert _rows(_report(store, NOW - 4 * H, by="outcome")) == {
        "failed": pytest.approx(2.0), "evicted": pytest.approx(1.0)
    }  # fmt: skip
    assert [r["key"] for r in _report(store, NOW - 4 * H, by="outcome")["rows"]] == ["failed", "evicted"]
    assert _rows(_report(store, NOW - 4 * H, by="user")) == {
        "bob": pytest.approx(2.0),
        "alice": pytest.approx(1.0),
    }
    rows = _report(store, NOW - 4 * H, by="workload")["rows"]
    assert (
        rows[1]["key"] == str(first) and rows[1]["name"] == "big" and rows[1]["share"] == pytest.approx(1 / 3)
    )


def test_a_report_of_some_users_counts_only_their_attempts_in_every_grouping(store: Store) -> None:
    _node(store, "a", "H100")
    _attempt(store, NOW - 4 * H, NOW - 3 * H, state="failed", user="alice", name="big")
    _attempt(store, NOW - 3 * H, NOW - H, user="alice", name="big", gpus=2)
    bob = _attempt(store, NOW - 2 * H, NOW - H, user="bob", gpus=6)
    _attempt(store, NOW - 2 * H, NOW - H, user="carol", queue="nlp")
    for by in accounting.GROUPS:
        report = _report(store, NOW - 4 * H, by=by, users=["alice"])
        assert report["total"]["gpu_hours"] == pytest.approx(5.0), by  # bob's and carol's left out
        assert sum(_rows(report).values()) == pytest.approx(5.0), by
        assert report["users"] == ["alice"]
    assert list(_rows(_report(store, NOW - 4 * H, by="queue", users=["alice"]))) == ["default"]
    both = _report(store, NOW - 4 * H, by="workload", users=["bob", "alice", "bob"])
    assert both["rows"][0]["key"] == str(bob) and both["users"] == ["alice", "bob"]
    assert _report(store, NOW - 4 * H)["users"] is None
    assert _report(store, NOW - 4 * H)["total"]["gpu_hours"] == pytest.approx(12.0)


def test_a_user_who_never_submitted_and_holds_no_token_is_refused_not_reported_as_idle(store: Store) -> None:
    _node(store, "a", "H100")
    _attempt(store, NOW - 30 * 24 * H, NOW - 29 * 24 * H, user="alice")  # long before the window
    assert _report(store, NOW - H, users=["alice"])["total"]["gpu_hours"] == 0.0
    with pytest.raises(Invalid) as caught:
        _report(store, NOW - H, users=["alcie"])
    assert caught.value.field == "user" and "'alcie'" in caught.value.message
    with pytest.raises(Invalid) as caught:
        _report(store, NOW - H, users=[])
    assert caught.value.field == "user"
    tokens.create_token(store, "dana", "user")  # a token, no work yet: a report of nothing
    assert _report(store, NOW - H, by="user", users=["dana"])["rows"] == []


def test_used_gpu_hours_weigh_the_attempts_with_telemetry_and_none_is_not_zero(store: Store) -> None:
    _node(store, "a", "H100")
    _attempt(store, NOW - 4 * H, NOW - 2 * H, gpus=2, user="alice")  # 4 GPU-h at 25%
    _attempt(store, NOW - 2 * H, NOW, gpus=1, user="alice")  # 2 GPU-h at 100%
    _attempt(store, NOW - 2 * H, NOW, gpus=1, user="bob")  # 2 GPU-h, no GPU telemetry (e.g. Slurm)
    with store.session() as s:
        for attempt, pct in zip(s.scalars(select(Attempt).order_by(Attempt.id)), (25.0, 100.0), strict=False):
            attempt.gpu_utilization_pct, attempt.gpu_seconds_sampled = pct, 3600.0
    rows = {r["key"]: r for r in _report(store, NOW - 4 * H, by="user")["rows"]}
    alice, bob = rows["alice"], rows["bob"]
    assert alice["gpu_hours"] == pytest.approx(6.0) and alice["measured_gpu_hours"] == pytest.approx(6.0)
    assert alice["used_gpu_hours"] == pytest.approx(4 * 0.25 + 2 * 1.0)
    assert alice["gpu_utilization_pct"] == pytest.approx(100 * 3 / 6)
    assert bob["used_gpu_hours"] is None and bob["gpu_utilization_pct"] is None  # never a made-up 0%
    assert bob["measured_gpu_hours"] == 0.0
    total = _report(store, NOW - 4 * H)["total"]
    assert total["measured_gpu_hours"] == pytest.approx(6.0) and total["gpu_hours"] == pytest.approx(8.0)
    cut = _report(store, NOW - 3 * H, by="user")["rows"][0]  # half of the 25% attempt inside the window
    assert cut["key"] == "alice" and cut["used_gpu_hours"] == pytest.approx(2 * 0.25 + 2 * 1.0)


def test_bad_groupings_queues_and_windows_are_refused_naming_the_field(store: Store) -> None:
    with pytest.raises(Invalid) as caught:
        _report(store, NOW - H, by="team")
    assert caught.value.field == "by" and "queue, user, workload" in caught.value.message
    with pytest.raises(Invalid) as caught:
        _report(store, NOW - H, queue="nope")
    assert caught.value.field == "queue"
    refused = [
        ("x", None, "since"),
        ("2026-13-01", None, "since"),
        (None, "soon", "until"),
        ("2026-12-04", None, "since"),  # after now
        ("2026-12-02", "2026-12-01", "since"),  # after until
    ]
    for since, until, field in refused:
        with pytest.raises(Invalid) as caught:
            accounting.window(since, until, NOW)
        assert caught.value.field == field, (since, until)
    # a duration of since counts back from until, one of until from now
    assert accounting.window("1d", "3d", NOW) == (NOW - 4 * 24 * H, NOW - 3 * 24 * H)
    assert accounting.window("3h", "2026-12-03T08:00", NOW) == (NOW - 7 * H, NOW - 4 * H)
    assert accounting.window(None, None, NOW) == (NOW - 7 * 24 * H, NOW)
    assert accounting.window("2026-12-01", "2026-12-31", NOW) == (datetime(2026, 12, 1, tzinfo=UTC), NOW)


def test_a_price_for_a_model_no_one_knows_is_taken_with_a_warning_that_names_the_likely_one(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo (H1OO, letter O) would leave the H100s unpriced in every report: said once, at the start."""
    (tmp_path / "prices.yaml").write_text("gpu_hour:\n  H1OO: 2\n  A100: 1.29\n  default: 1\n")
    with caplog.at_level("WARNING", logger="gpupool.control.accounting"):
        prices = accounting.load_prices(tmp_path)
    assert prices is not None and prices.of("H1OO") == 2.0  # taken: a node may report such a name
    (warning,) = [r.getMessage() for r in caplog.records]
    assert "model='H1OO': no GPU model of that name is known (did you mean H100?)" in warning
    assert accounting.unknown_models(parse_prices_spec({"gpu_hour": {"h100": 2, "DEFAULT": 1}})) == []
