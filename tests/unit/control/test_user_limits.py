"""Per-user limits in a queue (control/user_limits.py): each user's work given to the scheduler oldest
first while it fits under the caps beside what the user runs; the rest held back, with why."""

from __future__ import annotations

from gpupool.control.user_limits import USER_LIMIT, Limits, held_back, limits_of


def test_a_users_work_waits_beyond_the_gpu_cap_and_others_are_untouched() -> None:
    limits = {"nlp": Limits(gpus=8, workloads=None)}
    running = [("nlp", "alice", 6.0), ("nlp", "bob", 8.0), ("cv", "alice", 16.0)]
    pending = [
        (1, "nlp", "alice", 2.0),  # 6 + 2 = 8: given
        (2, "nlp", "alice", 1.0),  # 9: held
        (3, "nlp", "carol", 8.0),  # carol has nothing: given
        (4, "cv", "alice", 8.0),  # cv has no caps
        (5, "nlp", "bob", 0.5),  # bob is at 8
        (6, "nlp", "dave", 16.0),  # more than the cap alone: can never start while it stands
    ]
    held = held_back(pending, running, limits)
    assert sorted(held) == [2, 5, 6]
    assert all(why.code == USER_LIMIT for why in held.values())
    assert held[2].message.startswith(
        "alice holds or is next in line for 8 of the 8 GPUs one user may hold in queue nlp"
    )
    assert "(user_limits.gpus), and this needs 1; it starts as alice's earlier work" in held[2].message
    assert held[6].message == (
        "asks for 16 GPUs, more than the 8 one user may hold in queue nlp (user_limits.gpus): it starts only "
        "once an admin raises the cap (`gpupool queue update nlp --user-gpus 16`) or it asks for less"
    )


def test_the_workload_cap_and_limits_read_from_specs() -> None:
    limits = limits_of([("nlp", {"user_limits": {"workloads": 2}}), ("cv", {}), ("x", {"user_limits": None})])
    assert limits == {"nlp": Limits(gpus=None, workloads=2)}
    held = held_back(
        [(1, "nlp", "a", 1.0), (2, "nlp", "a", 1.0), (3, "nlp", "b", 1.0)], [("nlp", "a", 0.0)], limits
    )
    assert list(held) == [2]
    assert (
        "a runs or is next in line for 2 of the 2 workloads one user may run in queue nlp" in held[2].message
    )


def test_a_parents_limits_hold_for_a_users_work_in_every_queue_below_it() -> None:
    """As Slurm's association limits: a cap on `research` counts alice's work in nlp and vision together
    (it had no effect at all before), beside nlp's own cap."""
    limits = {"research": Limits(gpus=3, workloads=None), "nlp": Limits(gpus=None, workloads=1)}
    parents = {"nlp": "research", "vision": "research", "research": None, "cv": None}
    running = [("nlp", "alice", 2.0)]
    pending = [
        (1, "vision", "alice", 1.0),  # 2 + 1 = 3 under research: given
        (2, "vision", "alice", 1.0),  # 4: held by research's cap
        (3, "nlp", "alice", 0.0),  # nlp's own cap: one workload, alice runs one there
        (4, "cv", "alice", 8.0),  # outside research
        (5, "vision", "bob", 3.0),  # bob's own count
    ]
    held = held_back(pending, running, limits, parents)
    assert sorted(held) == [2, 3]
    assert "3 of the 3 GPUs one user may hold in queue research and the queues below it" in held[2].message
    assert "one user may run in queue nlp" in held[3].message
