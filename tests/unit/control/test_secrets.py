"""Users' secrets (control/secrets.py) on a real SQLite store: bad names and values are refused naming the
field and change nothing, a user's count is capped, a submit is checked against its submitter's own
secrets, and an attempt gets the values in the spec's order or a MissingSecret naming the one gone. Values
are stored encrypted; the head's start encrypts plain text rows in place and moves rows of an older key to
the first; a row no key opens is kept, marked in the listing, and fails the attempt naming its key."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from sqlalchemy import select, update

from gpupool.control import secrets
from gpupool.control.errors import Invalid, NotFound
from gpupool.control.secret_keys import KEY_BYTES, SecretKeys, sealed_with
from gpupool.store.db import Store
from gpupool.store.models import Secret


@pytest.fixture
def keys(tmp_path: Path) -> SecretKeys:
    return SecretKeys(path=tmp_path / "secrets.key", keys=(os.urandom(KEY_BYTES),))


def _stored(store: Store) -> dict[tuple[str, str], str]:
    with store.read() as s:
        return {(r.owner, r.name): r.value for r in s.scalars(select(Secret))}


def _write_raw(store: Store, owner: str, name: str, value: str) -> None:
    """A row as a head before encryption (or another head) left it."""
    with store.session() as s:
        s.add(Secret(owner=owner, name=name, value=value))


def test_bad_names_and_values_are_refused_naming_the_field(store: Store, keys: SecretKeys) -> None:
    for name, value, field in (
        ("HF-TOKEN", "x", "name"),
        ("GPUPOOL_TOKEN", "x", "name"),
        ("OK", "", "value"),
        ("OK", 3, "value"),
        ("OK", "a\x00b", "value"),
        ("OK", "x" * (secrets.MAX_VALUE + 1), "value"),
    ):
        with pytest.raises(Invalid) as refused:
            secrets.set_secret(store, keys, "alice", name, value)
        assert refused.value.field == field, (name, refused.value)
    assert secrets.list_secrets(store, keys, "alice") == []
    with pytest.raises(NotFound, match="alice has no secret named 'OK'"):
        secrets.delete_secret(store, keys, "alice", "OK")


def test_a_user_may_keep_at_most_max_per_user(
    store: Store, keys: SecretKeys, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(secrets, "MAX_PER_USER", 2)
    secrets.set_secret(store, keys, "alice", "A", "1")
    secrets.set_secret(store, keys, "alice", "B", "2")
    secrets.set_secret(store, keys, "alice", "B", "3")  # replacing one is not one more
    with pytest.raises(Invalid, match="alice has 2 secrets, the most one user may keep"):
        secrets.set_secret(store, keys, "alice", "C", "4")
    secrets.set_secret(store, keys, "bob", "C", "5")  # the cap is each user's
    assert [r["name"] for r in secrets.list_secrets(store, keys, "alice")] == ["A", "B"]


def test_submit_and_start_read_the_submitters_own(store: Store, keys: SecretKeys) -> None:
    secrets.set_secret(store, keys, "alice", "A", "1")
    secrets.set_secret(store, keys, "alice", "B", "2")
    secrets.set_secret(store, keys, "bob", "C", "3")
    with store.read() as s:
        secrets.check_at_submit(s, "alice", ["B", "A"])
        secrets.check_at_submit(s, "alice", [])
        with pytest.raises(Invalid) as refused:
            secrets.check_at_submit(s, "alice", ["A", "C"])
        assert refused.value.field == "secrets[1]" and "alice has no secret named 'C'" in str(refused.value)
        with pytest.raises(Invalid, match=r"alice has no secret named 'AA'; did you mean 'A'\? or set it"):
            secrets.check_at_submit(s, "alice", ["AA"])  # a misspelling of one of hers
        assert list(secrets.resolve(s, keys, "alice", ["B", "A"]).items()) == [("B", "2"), ("A", "1")]
        assert secrets.resolve(s, keys, "alice", []) == {}
        with pytest.raises(secrets.MissingSecret, match="the secret C of alice no longer exists"):
            secrets.resolve(s, keys, "alice", ["A", "C"])


def test_the_store_holds_values_encrypted_and_bound_to_their_row(store: Store, keys: SecretKeys) -> None:
    view = secrets.set_secret(store, keys, "alice", "HF_TOKEN", "hf_abc123")
    assert view["key"] == keys.current and view["unreadable"] is None and "value" not in view
    stored = _stored(store)[("alice", "HF_TOKEN")]
    assert "hf_abc123" not in stored and sealed_with(stored) == keys.current
    secrets.set_secret(store, keys, "bob", "HF_TOKEN", "bobs")
    with store.session() as s:  # someone with the database copies alice's value into bob's row
        s.execute(update(Secret).where(Secret.owner == "bob").values(value=stored))
    with store.read() as s:
        assert secrets.resolve(s, keys, "alice", ["HF_TOKEN"]) == {"HF_TOKEN": "hf_abc123"}
        with pytest.raises(secrets.UnreadableSecret, match="the secret HF_TOKEN of bob cannot be decrypted"):
            secrets.resolve(s, keys, "bob", ["HF_TOKEN"])


def test_the_start_encrypts_plain_rows_in_place_and_keeps_when_each_was_set(
    store: Store, keys: SecretKeys, caplog: pytest.LogCaptureFixture
) -> None:
    _write_raw(store, "alice", "HF_TOKEN", "hf_plain")
    _write_raw(store, "bob", "WANDB_API_KEY", "wandb_plain")
    set_at = {(r["owner"], r["name"]): r["updated_at"] for r in secrets.list_secrets(store, keys, "alice")}
    with store.read() as s:  # read as they are before the start encrypts them
        assert secrets.resolve(s, keys, "alice", ["HF_TOKEN"]) == {"HF_TOKEN": "hf_plain"}
    assert secrets.list_secrets(store, keys, "alice")[0]["key"] is None
    with caplog.at_level(logging.INFO, logger="gpupool.secrets"):
        counts = secrets.encrypt_stored(store, keys)
    assert counts == {"encrypted": 2, "rekeyed": 0, "unreadable": 0}
    assert "event=secrets_encrypted" in caplog.text and "plain_encrypted=2" in caplog.text
    stored = _stored(store)
    assert all(keys.is_current(v) and "plain" not in v for v in stored.values()), stored
    with store.read() as s:
        assert secrets.resolve(s, keys, "bob", ["WANDB_API_KEY"]) == {"WANDB_API_KEY": "wandb_plain"}
    assert {
        (r["owner"], r["name"]): r["updated_at"] for r in secrets.list_secrets(store, keys, "alice")
    } == set_at
    assert secrets.encrypt_stored(store, keys) == {"encrypted": 0, "rekeyed": 0, "unreadable": 0}
    assert _stored(store) == stored  # a second start rewrites nothing


def test_after_a_rotation_the_start_moves_every_row_to_the_first_key(store: Store, tmp_path: Path) -> None:
    old = SecretKeys(path=tmp_path / "secrets.key", keys=(os.urandom(KEY_BYTES),))
    secrets.set_secret(store, old, "alice", "A", "one")
    rotated = SecretKeys(path=old.path, keys=(os.urandom(KEY_BYTES), *old.keys))
    assert secrets.encrypt_stored(store, rotated) == {"encrypted": 0, "rekeyed": 1, "unreadable": 0}
    assert sealed_with(_stored(store)[("alice", "A")]) == rotated.current
    without_old = SecretKeys(path=old.path, keys=rotated.keys[:1])  # the old line may now leave the file
    with store.read() as s:
        assert secrets.resolve(s, without_old, "alice", ["A"]) == {"A": "one"}


def test_a_row_no_key_opens_is_kept_marked_and_fails_the_attempt_naming_its_key(
    store: Store, keys: SecretKeys, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    lost = SecretKeys(path=tmp_path / "lost.key", keys=(os.urandom(KEY_BYTES),))
    secrets.set_secret(store, lost, "alice", "HF_TOKEN", "hf_abc123")
    secrets.set_secret(store, keys, "alice", "OTHER", "fine")
    before = _stored(store)
    with caplog.at_level(logging.INFO, logger="gpupool.secrets"):
        assert secrets.encrypt_stored(store, keys) == {"encrypted": 0, "rekeyed": 0, "unreadable": 1}
    assert f"event=secrets_unreadable count=1 need={lost.current}" in caplog.text
    assert _stored(store) == before  # kept as it was, for the day its key comes back
    listed = {r["name"]: r for r in secrets.list_secrets(store, keys, "alice")}
    assert listed["OTHER"]["unreadable"] is None
    assert listed["HF_TOKEN"]["key"] == lost.current
    assert f"encrypted with the key {lost.current}" in listed["HF_TOKEN"]["unreadable"]
    with store.read() as s, pytest.raises(secrets.UnreadableSecret) as failed:
        secrets.resolve(s, keys, "alice", ["OTHER", "HF_TOKEN"])
    assert (
        f"the secret HF_TOKEN of alice cannot be decrypted: it was encrypted with the key {lost.current}"
        in (str(failed.value))
    )
    assert str(keys.path) in str(failed.value)
    secrets.set_secret(store, keys, "alice", "HF_TOKEN", "hf_new")  # the owner's fix: set it again
    with store.read() as s:
        assert secrets.resolve(s, keys, "alice", ["HF_TOKEN"]) == {"HF_TOKEN": "hf_new"}
