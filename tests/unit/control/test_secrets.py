"""Users' secrets (control/secrets.py) on a real SQLite store: bad names and values are refused naming the
field and change nothing, a user's count is capped, a submit is checked against its submitter's own
secrets, and an attempt gets the values in the spec's order or a MissingSecret naming the one gone."""

from __future__ import annotations

import pytest

from gpupool.control import secrets
from gpupool.control.errors import Invalid, NotFound
from gpupool.store.db import Store


def test_bad_names_and_values_are_refused_naming_the_field(store: Store) -> None:
    for name, value, field in (
        ("HF-TOKEN", "x", "name"),
        ("GPUPOOL_TOKEN", "x", "name"),
        ("OK", "", "value"),
        ("OK", 3, "value"),
        ("OK", "a\x00b", "value"),
        ("OK", "x" * (secrets.MAX_VALUE + 1), "value"),
    ):
        with pytest.raises(Invalid) as refused:
            secrets.set_secret(store, "alice", name, value)
        assert refused.value.field == field, (name, refused.value)
    assert secrets.list_secrets(store, "alice") == []
    with pytest.raises(NotFound, match="alice has no secret named 'OK'"):
        secrets.delete_secret(store, "alice", "OK")


def test_a_user_may_keep_at_most_max_per_user(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "MAX_PER_USER", 2)
    secrets.set_secret(store, "alice", "A", "1")
    secrets.set_secret(store, "alice", "B", "2")
    secrets.set_secret(store, "alice", "B", "3")  # replacing one is not one more
    with pytest.raises(Invalid, match="alice has 2 secrets, the most one user may keep"):
        secrets.set_secret(store, "alice", "C", "4")
    secrets.set_secret(store, "bob", "C", "5")  # the cap is each user's
    assert [r["name"] for r in secrets.list_secrets(store, "alice")] == ["A", "B"]


def test_submit_and_start_read_the_submitters_own(store: Store) -> None:
    secrets.set_secret(store, "alice", "A", "1")
    secrets.set_secret(store, "alice", "B", "2")
    secrets.set_secret(store, "bob", "C", "3")
    with store.read() as s:
        secrets.check_at_submit(s, "alice", ["B", "A"])
        with pytest.raises(Invalid) as refused:
            secrets.check_at_submit(s, "alice", ["A", "C"])
        assert refused.value.field == "secrets[1]" and "alice has no secret named 'C'" in str(refused.value)
        assert list(secrets.resolve(s, "alice", ["B", "A"]).items()) == [("B", "2"), ("A", "1")]
        assert secrets.resolve(s, "alice", []) == {}
        with pytest.raises(secrets.MissingSecret, match="the secret C of alice no longer exists"):
            secrets.resolve(s, "alice", ["A", "C"])
