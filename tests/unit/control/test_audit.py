"""What the audit log writes for a configuration change: the fields that changed, dotted, before and
after; a new object's fields away from the defaults; long values cut."""

from __future__ import annotations

from gpupool.control.audit import MAX_SHOWN, changes, settings


def test_changes_name_each_changed_field_with_before_and_after() -> None:
    before = {"resources": {"gpu": {"quota": 8, "limit": None}}, "budget": None, "priority": 0}
    after = {"resources": {"gpu": {"quota": 16, "limit": 32}}, "budget": {"gpu_hours": 100}, "priority": 0}
    assert changes(before, after) == (
        "budget.gpu_hours none -> 100; resources.gpu.limit none -> 32; resources.gpu.quota 8 -> 16"
    )
    assert changes(before, before) == "nothing"
    # a section set whole, field by field; values as a person writes them (2, not 2.0; no dict reprs)
    assert changes({"user_limits": None}, {"user_limits": {"gpus": 2.0, "workloads": 1}}) == (
        "user_limits.gpus none -> 2; user_limits.workloads none -> 1"
    )
    assert changes({"nodes": ["a"]}, {"nodes": ["a", "b"]}) == "nodes [a] -> [a, b]"
    assert changes({"description": "x" * 500}, {}) == f"description {'x' * (MAX_SHOWN - 3)}... -> none"


def test_settings_are_the_fields_away_from_the_defaults() -> None:
    defaults = {"name": "q", "priority": 0, "resources": {"gpu": {"quota": 0.0, "over_quota_weight": 1.0}}}
    spec = {
        "name": "q",
        "priority": 0,
        "description": "",
        "resources": {"gpu": {"quota": 4.0, "over_quota_weight": 1.0}},
    }
    assert settings(spec, defaults) == "resources.gpu.quota 4"  # as a person writes it
    assert settings(defaults, defaults) == "defaults"
