"""The control loop applies the default policy's bands and young-work weights from attained service, says
what they did in words, and reads the operator's scheduling.yaml (control/policy.py)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpupool.backends.agent import AgentBackend
from gpupool.control import queues, submission
from gpupool.control.loop import ControlSettings, Reconciler
from gpupool.control.policy import (
    CONFIG_ENV,
    BandNotes,
    SchedulingConfigError,
    load_policy,
    preemption_reason,
)
from gpupool.scheduler import Explanation, QueueView, SchedulerConfig, Snapshot, WorkloadView
from gpupool.spec import parse_queue_spec, parse_workload_spec
from gpupool.spec.scheduling import DEFAULT_POLICY, effective_priority, weighted_by_young
from gpupool.store.db import Store
from gpupool.store.models import Attempt
from tests.support.store import run_attempt

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store(f"sqlite:///{tmp_path / 'gpupool.db'}")
    queues.ensure_default_queue(store)
    queues.create_queue(store, parse_queue_spec({"name": "team", "resources": {"gpu": {"quota": 4}}}))
    queues.create_queue(store, parse_queue_spec({"name": "other", "resources": {"gpu": {"quota": 4}}}))
    yield store
    store.close()


def _submit(store: Store, queue: str, gpus: int = 1, priority: str = "train", checkpoint: bool = True) -> int:
    fields = {"commands": ["sleep 60"], "queue": queue, "resources": {"gpu": gpus}, "priority": priority}
    if checkpoint:
        fields["checkpoint"] = "./ckpt"
    return int(submission.submit(store, parse_workload_spec(fields))["id"])


def _reconciler(store: Store, home: Path, policy: SchedulerConfig | None = None) -> Reconciler:
    settings = ControlSettings(home=home, node_name="head", policy=policy)
    return Reconciler(store, AgentBackend(lease=10.0), None, settings)


def _snapshot(reconciler: Reconciler, store: Store, now: datetime) -> Snapshot:
    with store.read() as s:
        return reconciler._snapshot(s, now.timestamp())


def _priorities(snapshot: Snapshot) -> dict[int, int]:
    return {w.id: w.priority for w in (*snapshot.pending, *snapshot.running)}


def _weights(snapshot: Snapshot) -> dict[str, float]:
    return {q.name: q.gpu.weight for q in snapshot.queues}


def test_running_work_leaves_the_top_band_as_its_service_passes_the_first_threshold(
    tmp_path: Path, store: Store
) -> None:
    old, new = _submit(store, "team", gpus=2), _submit(store, "team")
    run_attempt(store, old, "a", [0, 1], T0)
    reconciler = _reconciler(store, tmp_path)
    # 2 GPUs for 59 s: 118 GPU-seconds, still under 2 GPU-minutes: the same band as new work.
    before = _snapshot(reconciler, store, T0 + timedelta(seconds=59))
    assert (
        _priorities(before)[old]
        == _priorities(before)[new]
        == effective_priority(50, 0.0, DEFAULT_POLICY, None)
    )
    assert (
        _snapshot(reconciler, store, T0 + timedelta(seconds=59.5)) == before
    )  # the scheduler answers from memory
    after = _snapshot(reconciler, store, T0 + timedelta(seconds=61))
    assert _priorities(after)[old] < _priorities(after)[new]  # preempt may now take it for the new work


def test_running_work_that_declares_no_checkpoint_keeps_the_top_band(tmp_path: Path, store: Store) -> None:
    old, new = _submit(store, "team", gpus=2, checkpoint=False), _submit(store, "team")
    run_attempt(store, old, "a", [0, 1], T0)
    after = _snapshot(_reconciler(store, tmp_path), store, T0 + timedelta(hours=5))
    assert _priorities(after)[old] == _priorities(after)[new]  # preempt cannot take it for the new work
    assert _weights(after)["team"] == 5.0  # its service still counts: only the new work is young


def test_a_higher_user_priority_keeps_outranking_whatever_its_service(tmp_path: Path, store: Store) -> None:
    important, new = _submit(store, "team", priority="interactive"), _submit(store, "team")
    run_attempt(store, important, "a", [0], T0)
    snapshot = _snapshot(_reconciler(store, tmp_path), store, T0 + timedelta(days=30))
    assert _priorities(snapshot)[important] > _priorities(snapshot)[new]


def test_a_queue_ordered_fifo_keeps_its_work_in_one_band(tmp_path: Path, store: Store) -> None:
    queues.update_queue(store, "team", lambda spec: parse_queue_spec({**spec, "ordering": "fifo"}))
    old, new = _submit(store, "team", gpus=2), _submit(store, "team")
    run_attempt(store, old, "a", [0, 1], T0)
    snapshot = _snapshot(_reconciler(store, tmp_path), store, T0 + timedelta(hours=1))
    assert _priorities(snapshot)[old] == _priorities(snapshot)[new]


def test_a_queues_over_quota_weight_follows_its_young_work(tmp_path: Path, store: Store) -> None:
    old = _submit(store, "other", gpus=4)
    run_attempt(store, old, "a", [0, 1, 2, 3], T0)
    _submit(store, "team")
    _submit(store, "team")
    reconciler = _reconciler(store, tmp_path)
    young = _weights(_snapshot(reconciler, store, T0 + timedelta(seconds=10)))
    assert young["team"] == 10.0 and young["other"] == 5.0  # 40 GPU-seconds: under 2 GPU-minutes
    assert young["default"] == 0.0  # no work: nothing above its quota while others want it
    later = _weights(_snapshot(reconciler, store, T0 + timedelta(minutes=10)))
    assert later["other"] == 1.0  # 2,400 GPU-seconds: under 1 GPU-hour only
    assert _weights(_snapshot(reconciler, store, T0 + timedelta(hours=1)))["other"] == 0.0


def test_the_earlier_attempts_count_toward_a_running_workloads_band(tmp_path: Path, store: Store) -> None:
    resumed, new = _submit(store, "team"), _submit(store, "team")
    with store.session() as s:
        s.add(
            Attempt(
                workload_id=resumed, queue="team", number=0, state="evicted", node_name="a", gpu_indices=[0],
                gpu_fraction=1.0, pods=[{"node": "a", "gpu_indices": [0]}],
                started_at=T0 - timedelta(hours=1), finished_at=T0 - timedelta(minutes=50),
            )
        )  # fmt: skip
    run_attempt(store, resumed, "a", [0], T0)
    snapshot = _snapshot(_reconciler(store, tmp_path), store, T0 + timedelta(seconds=1))
    assert _priorities(snapshot)[resumed] < _priorities(snapshot)[new]  # 601 GPU-seconds in all


def test_with_bands_and_weights_off_the_loop_gives_user_priorities_and_spec_weights(
    tmp_path: Path, store: Store
) -> None:
    old, new = _submit(store, "team", gpus=2), _submit(store, "team")
    run_attempt(store, old, "a", [0, 1], T0)
    off = SchedulerConfig(ordering="las", las_thresholds=(120.0,))  # las order, no las_preempt, no weights
    snapshot = _snapshot(_reconciler(store, tmp_path, off), store, T0 + timedelta(hours=1))
    assert _priorities(snapshot) == {old: 50, new: 50}
    assert set(_weights(snapshot).values()) == {1.0}


def _view(wid: int, priority: int, queue: str = "team") -> WorkloadView:
    return WorkloadView(id=wid, queue=queue, priority=priority, submit_time=0.0)


def test_a_preemption_by_bands_is_explained_in_words() -> None:
    victim = _view(1, effective_priority(50, 600.0, DEFAULT_POLICY, None))
    gainer = _view(2, effective_priority(50, 0.0, DEFAULT_POLICY, None))
    reason = preemption_reason(victim, gainer, DEFAULT_POLICY)
    assert reason.startswith("preempted by newer work of queue team: workload 2 has had less GPU-time")
    assert "under 2 GPU-minutes" in reason and "this one at least 2 GPU-minutes" in reason
    assert "least-attained-service bands" in reason


def test_a_preemption_by_user_priority_names_the_users_priorities() -> None:
    victim = _view(1, effective_priority(50, 0.0, DEFAULT_POLICY, None))
    gainer = _view(2, effective_priority(90, 1e6, DEFAULT_POLICY, None))
    assert (
        preemption_reason(victim, gainer, DEFAULT_POLICY)
        == "preempted by workload 2 (priority 90 > 50), queue team"
    )


def test_pending_work_in_a_lower_band_is_told_why_newer_work_goes_first() -> None:
    notes = BandNotes(DEFAULT_POLICY)
    waiting = _view(1, effective_priority(50, 600.0, DEFAULT_POLICY, None))
    fresh = _view(2, effective_priority(50, 0.0, DEFAULT_POLICY, None))
    given = {
        1: Explanation("no-capacity", "needs 8 GPUs; 1 GPUs free in the pool"),
        2: Explanation("no-capacity", "x"),
    }
    notes.add(given, (waiting, fresh))
    assert given[1].code == "no-capacity"
    assert given[1].message == (
        "needs 8 GPUs; 1 GPUs free in the pool; it has had at least 2 GPU-minutes, so work of "
        "its queue that has had less goes first (least-attained-service bands)"
    )
    assert given[2].message == "x"  # top band: nothing to add
    again = {1: Explanation("no-capacity", "needs 8 GPUs; 1 GPUs free in the pool")}
    notes.add(again, (waiting, fresh))
    assert again[1] is given[1]  # an unchanged pass builds nothing new
    # alone in its queue (or the least served there), no work of its queue goes first: nothing said of it
    alone = {1: Explanation("no-capacity", "needs 8 GPUs; 1 GPUs free in the pool")}
    notes.add(alone, (waiting,))
    assert alone[1].message == "needs 8 GPUs; 1 GPUs free in the pool"
    # newer work of its queue that runs goes first as well
    ahead = {1: Explanation("no-capacity", "needs 8 GPUs; 1 GPUs free in the pool")}
    notes.add(ahead, (waiting,), (), (fresh,))
    assert ahead[1].message.endswith(
        "so work of its queue that has had less goes first (least-attained-service bands)"
    )


def test_the_operators_file_changes_the_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert load_policy(tmp_path) is DEFAULT_POLICY
    (tmp_path / "scheduling.yaml").write_text("las_preempt: false\nyoung_weights: []\n")
    policy = load_policy(tmp_path)
    assert not policy.las_preempt and policy.young_weights == () and policy.ordering == "las"


def test_a_bad_file_stops_the_server_with_the_file_field_and_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    (tmp_path / "scheduling.yaml").write_text("las_thresholds: [16h, 2m]\n")
    with pytest.raises(SchedulingConfigError) as caught:
        _reconciler_home(tmp_path)
    assert str(caught.value).startswith(
        f"{tmp_path / 'scheduling.yaml'}: las_thresholds[1]: '2m' is not above"
    )
    monkeypatch.setenv(CONFIG_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(SchedulingConfigError, match="no such file; create it or unset the variable"):
        load_policy(tmp_path)


def _reconciler_home(home: Path) -> Reconciler:
    store = Store(f"sqlite:///{home / 'bad.db'}")
    try:
        return _reconciler(store, home)
    finally:
        store.close()


def test_pending_work_of_a_queue_without_new_work_is_told_why_its_fair_share_is_its_quota() -> None:
    notes = BandNotes(DEFAULT_POLICY)
    waiting = _view(1, effective_priority(50, 2 * 3600.0, DEFAULT_POLICY, None))
    queues = weighted_by_young((QueueView("team"),), {})
    given = {1: Explanation("over-fair-share", "queue team is at or over its fair share (8 >= 0 GPUs)")}
    notes.add(given, (waiting,), queues)
    assert given[1].message.endswith(
        "; its fair share is its quota: queue team has no work under 1 GPU-hour, and GPUs above the quotas "
        "go to queues with new work"
    )
