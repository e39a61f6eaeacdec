"""The keys of users' secrets and the stored form of a value (control/secret_keys.py): a value round-trips
and its stored text shows nothing of it; it opens only in its own row (owner and name) and only with its
key; altered text is refused, never returned; plain text from before encryption reads as it is; the first
key of several encrypts and all decrypt; a key file is made once, mode 0600, and a bad one is refused naming
the file and the fix."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import pytest

from gpupool.control.secret_keys import (
    KEY_BYTES,
    SecretKeyError,
    SecretKeys,
    Undecryptable,
    key_id,
    load_keys,
    open_keys,
    sealed_with,
)


def _keys(tmp_path: Path, *keys: bytes) -> SecretKeys:
    return SecretKeys(path=tmp_path / "secrets.key", keys=keys or (os.urandom(KEY_BYTES),))


def _write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_value_round_trips_and_its_stored_text_shows_nothing_of_it(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    stored = keys.encrypt("alice", "HF_TOKEN", "hf_abc123")
    assert stored.startswith(f"enc1:{keys.current}:") and "hf_abc123" not in stored
    assert sealed_with(stored) == keys.current and keys.is_current(stored)
    assert keys.decrypt("alice", "HF_TOKEN", stored) == "hf_abc123"
    again = keys.encrypt("alice", "HF_TOKEN", "hf_abc123")
    assert again != stored  # a fresh nonce each time: equal values do not show as equal
    unicode = "pässwörd 🔑 " + "x" * 60_000
    assert keys.decrypt("alice", "K", keys.encrypt("alice", "K", unicode)) == unicode


def test_the_key_id_is_a_fingerprint_not_the_key(tmp_path: Path) -> None:
    key = os.urandom(KEY_BYTES)
    assert len(key_id(key)) == 8 and key_id(key) == key_id(key) and key_id(key) != key_id(os.urandom(32))
    stored = _keys(tmp_path, key).encrypt("alice", "A", "v")
    assert base64.b64encode(key).decode() not in stored and key.hex() not in stored
    assert repr(key) not in repr(_keys(tmp_path, key))  # nor in a log line or a traceback


def test_another_key_cannot_open_it_and_says_which_key_it_needs(tmp_path: Path) -> None:
    mine, other = _keys(tmp_path), _keys(tmp_path)
    stored = mine.encrypt("alice", "HF_TOKEN", "hf_abc123")
    with pytest.raises(Undecryptable) as refused:
        other.decrypt("alice", "HF_TOKEN", stored)
    assert refused.value.key_id == mine.current
    message = str(refused.value)
    assert f"encrypted with the key {mine.current}" in message and str(mine.path) in message
    assert other.current in message and "put that key back" in message


def test_a_value_opens_only_in_its_own_row(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    stored = keys.encrypt("alice", "HF_TOKEN", "hf_abc123")
    for owner, name in (("bob", "HF_TOKEN"), ("alice", "WANDB_API_KEY"), ('alice", "HF', "TOKEN")):
        with pytest.raises(Undecryptable, match="altered or copied from another secret's row"):
            keys.decrypt(owner, name, stored)


def test_altered_text_is_refused_never_returned(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    stored = keys.encrypt("alice", "A", "secret value")
    head, body = stored.rsplit(":", 1)
    raw = bytearray(base64.b64decode(body))
    for index in (0, 12, len(raw) - 1):  # the nonce, the ciphertext, the tag
        flipped = bytearray(raw)
        flipped[index] ^= 1
        with pytest.raises(Undecryptable, match="altered"):
            keys.decrypt("alice", "A", f"{head}:{base64.b64encode(bytes(flipped)).decode()}")
    for damaged in (f"{head}:", f"{head}:not*base64", f"{head}:{body[:20]}", "enc1:", f"enc1::{body}"):
        with pytest.raises(Undecryptable, match="damaged"):
            keys.decrypt("alice", "A", damaged)
    with pytest.raises(Undecryptable, match="stored as enc2, which this gpupool cannot read"):
        keys.decrypt("alice", "A", "enc2:" + stored.removeprefix("enc1:"))


def test_plain_text_from_before_encryption_reads_as_it_is(tmp_path: Path) -> None:
    keys = _keys(tmp_path)
    for value in ("hf_abc123", "enc:not ours", "x:y:z", "ENC1:upper"):
        assert sealed_with(value) is None and not keys.is_current(value)
        assert keys.decrypt("alice", "A", value) == value


def test_the_first_of_several_keys_encrypts_and_every_one_decrypts(tmp_path: Path) -> None:
    old, new = os.urandom(KEY_BYTES), os.urandom(KEY_BYTES)
    before = _keys(tmp_path, old)
    written_before = before.encrypt("alice", "A", "one")
    rotated = _keys(tmp_path, new, old)
    assert rotated.current == key_id(new) and rotated.ids == (key_id(new), key_id(old))
    assert rotated.decrypt("alice", "A", written_before) == "one" and not rotated.is_current(written_before)
    written_after = rotated.encrypt("alice", "A", "two")
    assert sealed_with(written_after) == key_id(new) and rotated.is_current(written_after)
    with pytest.raises(Undecryptable):
        before.decrypt("alice", "A", written_after)  # a head not given the new key yet cannot read it


def test_the_key_file_is_made_once_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "home" / "secrets.key"
    made = open_keys(path, create=True)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(made.keys) == 1 and len(base64.b64decode(path.read_text().strip())) == KEY_BYTES
    assert [p.name for p in path.parent.iterdir()] == ["secrets.key"]  # no temporary file left
    assert open_keys(path, create=True) == made  # an existing file is read, never replaced


def test_a_key_file_holds_keys_one_a_line_with_comments(tmp_path: Path) -> None:
    first, second = os.urandom(KEY_BYTES), os.urandom(KEY_BYTES)
    text = f"# new, 2026-12\n{base64.b64encode(first).decode()}\n\n  {base64.b64encode(second).decode()}  \n"
    keys = load_keys(_write(tmp_path / "keys", text))
    assert keys.keys == (first, second) and keys.path == tmp_path / "keys"


def test_a_bad_key_file_is_refused_naming_the_file_and_the_fix(tmp_path: Path) -> None:
    good = base64.b64encode(os.urandom(KEY_BYTES)).decode()
    for text, mode, said in (
        (base64.b64encode(os.urandom(16)).decode(), 0o600, "line 1 holds 16 bytes; a key is 32 random bytes"),
        (f"{good}\nnot base64!\n", 0o600, "line 2 is not base64"),
        ("# nothing\n\n", 0o600, "holds no key; add a line from `head -c 32 /dev/urandom | base64`"),
        (good, 0o644, "open to every user of this machine (mode 0644); `chmod 600"),
        (good, 0o602, "open to every user of this machine"),
    ):
        path = _write(tmp_path / "keys", text, mode)
        with pytest.raises(SecretKeyError) as refused:
            load_keys(path)
        assert str(refused.value).startswith(f"{path}: ") and said in str(refused.value), refused.value
    missing = tmp_path / "absent.key"
    with pytest.raises(SecretKeyError, match="no such key file; make one with `head -c 32"):
        open_keys(missing, create=False)  # a file the operator names is never made up
    assert not missing.exists()
    assert load_keys(_write(tmp_path / "keys", good, 0o640)).keys  # group access is the operator's choice
