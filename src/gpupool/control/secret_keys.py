"""The keys that encrypt users' secrets at rest (control/secrets.py), and the form a value is stored in, so
that a copy of the database (a backup, a dump, a stolen disk) holds no user's API key, as dstack's server
keeps its secrets with `encryption: keys`.

A value is stored as `enc1:<key id>:<base64 of nonce + ciphertext>`: AES-256-GCM with a fresh 12-byte random
nonce, and its row (owner and name) as the associated data, so a value copied into another row (another
user's, another name) fails to decrypt rather than reaching the wrong work. The key id is a short
fingerprint of the key, never the key, so a value names the key that opens it.

The keys live in a file, one per line (32 random bytes in base64): the first encrypts, every one decrypts,
so a key is rotated by adding a new first line (docs/operations.md#secrets). By default the file is
`$GPUPOOL_HOME/secrets.key`, made at the first start; `gpupool server --secrets-key-file` (or
`$GPUPOOL_SECRETS_KEY_FILE`) names another, which must exist. A value written before gpupool encrypted
secrets has no prefix and is read as it is, until the head's start encrypts it (`secrets.encrypt_stored`).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

KEY_FILE: Final = "secrets.key"  # in $GPUPOOL_HOME unless the operator names another
KEY_ENV: Final = "GPUPOOL_SECRETS_KEY_FILE"
KEY_BYTES: Final = 32  # AES-256
NONCE_BYTES: Final = 12  # GCM's standard nonce; random per value (2^32 values per key stay far from a repeat)
PREFIX: Final = "enc1"
# Any `encN:` is gpupool's: one this version cannot read must never be mistaken for a plain text value.
_SEALED = re.compile(r"enc[0-9]+:")
_MAKE_ONE = "head -c 32 /dev/urandom | base64"


class SecretKeyError(ValueError):
    """A key file that cannot be used; the message names the file and the fix."""


class Undecryptable(Exception):
    """A stored value no configured key opens. `key_id`: the key it says it was encrypted with (None: not
    even that can be read from it)."""

    def __init__(self, message: str, key_id: str | None) -> None:
        super().__init__(message)
        self.key_id = key_id


def key_id(key: bytes) -> str:
    """A key's fingerprint: 8 hex digits of a hash of it, enough to tell a handful of keys apart."""
    return hashlib.sha256(b"gpupool secrets key id\x00" + key).hexdigest()[:8]


def sealed_with(stored: str) -> str | None:
    """The id of the key a stored value says it was encrypted with; None for a plain text one."""
    if not _SEALED.match(stored):
        return None
    parts = stored.split(":", 2)
    return parts[1] if len(parts) == 3 else None


def _associated(owner: str, name: str) -> bytes:
    # JSON keeps the two apart whatever they hold: ("a:b", "c") and ("a", "b:c") bind differently.
    return json.dumps([PREFIX, owner, name]).encode()


@dataclass(frozen=True)
class SecretKeys:
    """The keys of one key file: `keys[0]` encrypts, every one decrypts."""

    path: Path  # where they were read, for the messages
    keys: tuple[bytes, ...] = field(repr=False)  # never in a log line or a traceback

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(key_id(key) for key in self.keys)

    @property
    def current(self) -> str:
        """The id of the key new values are encrypted with."""
        return key_id(self.keys[0])

    def encrypt(self, owner: str, name: str, value: str) -> str:
        """`value` as stored in the row of `owner`'s secret `name`."""
        nonce = os.urandom(NONCE_BYTES)
        sealed = AESGCM(self.keys[0]).encrypt(nonce, value.encode(), _associated(owner, name))
        return f"{PREFIX}:{self.current}:{base64.b64encode(nonce + sealed).decode()}"

    def decrypt(self, owner: str, name: str, stored: str) -> str:
        """The value stored in the row of `owner`'s secret `name` (a plain text one as it is); Undecryptable
        when no key here opens it, saying which key it needs and the fix."""
        if not _SEALED.match(stored):
            return stored  # written before secrets were encrypted; the head's start encrypts it
        version, _, rest = stored.partition(":")
        wanted, _, body = rest.partition(":")
        if version != PREFIX:
            raise Undecryptable(
                f"it is stored as {version}, which this gpupool cannot read (a newer head wrote it); "
                "upgrade this head to the gpupool that wrote it, or set the secret again",
                None,
            )
        try:
            blob = base64.b64decode(body, validate=True)
        except (binascii.Error, ValueError):
            blob = b""
        if not wanted or len(blob) < NONCE_BYTES + 16:  # 16: GCM's tag
            raise Undecryptable(
                "its stored text is damaged (not enc1:<key id>:<base64>); set the secret again", None
            )
        matching = [key for key in self.keys if key_id(key) == wanted]
        if not matching:
            raise Undecryptable(
                f"it was encrypted with the key {wanted}, which {self.path} lacks (its keys: "
                f"{', '.join(self.ids)}); put that key back as a line of the file and restart the head, "
                "or set the secret again",
                wanted,
            )
        for key in matching:
            try:
                opened = AESGCM(key).decrypt(blob[:NONCE_BYTES], blob[NONCE_BYTES:], _associated(owner, name))
            except InvalidTag:
                continue
            return opened.decode()
        raise Undecryptable(
            f"the key {wanted} does not open it for {owner}/{name}: the stored text was altered or copied "
            "from another secret's row; set the secret again",
            wanted,
        )

    @property
    def current_prefix(self) -> str:
        """How every value encrypted with the first key begins (what the head's start leaves each in)."""
        return f"{PREFIX}:{self.current}:"

    def is_current(self, stored: str) -> bool:
        return stored.startswith(self.current_prefix)


def key_path(home: Path, named: Path | None) -> Path:
    """The key file: the one the operator named, else `$GPUPOOL_HOME/secrets.key`."""
    return named.expanduser() if named is not None else home / KEY_FILE


def load_keys(path: Path) -> SecretKeys:
    """The keys in `path`; SecretKeyError naming the file, the line and the fix when it cannot be used."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except FileNotFoundError:
        raise SecretKeyError(
            f"{path}: no such key file; make one with `{_MAKE_ONE} > {path} && chmod 600 {path}`, or copy "
            "there the key file of the heads that already share this store"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretKeyError(f"{path}: cannot read the secrets key file ({exc})") from None
    if mode & stat.S_IRWXO:
        raise SecretKeyError(
            f"{path}: the secrets key file is open to every user of this machine (mode "
            f"{stat.S_IMODE(mode):04o}); `chmod 600 {path}`"
        )
    keys: list[bytes] = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            key = base64.b64decode(line, validate=True)
        except (binascii.Error, ValueError):
            raise SecretKeyError(
                f"{path}: line {number} is not base64; each line is one key, 32 random bytes in base64 "
                f"(44 characters), e.g. from `{_MAKE_ONE}`"
            ) from None
        if len(key) != KEY_BYTES:
            raise SecretKeyError(
                f"{path}: line {number} holds {len(key)} bytes; a key is {KEY_BYTES} random bytes in base64 "
                f"(44 characters), e.g. from `{_MAKE_ONE}`"
            )
        if key not in keys:
            keys.append(key)
    if not keys:
        raise SecretKeyError(f"{path}: holds no key; add a line from `{_MAKE_ONE}`")
    return SecretKeys(path=path, keys=tuple(keys))


def open_keys(path: Path, *, create: bool) -> SecretKeys:
    """The keys in `path`; with `create`, a new file with one new key first if there is none."""
    if create and not path.exists():
        make_key_file(path)
    return load_keys(path)


def make_key_file(path: Path) -> None:
    """Write a new key file, mode 0600, atomically: never half a key, and never over a file another head
    made meanwhile (it is linked into place, which fails if the name exists)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = base64.b64encode(os.urandom(KEY_BYTES)).decode() + "\n"
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()  # left by a start of this pid that died
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, text.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(temporary, path)
    except OSError as exc:
        raise SecretKeyError(
            f"{path}: cannot write the secrets key file ({exc}); make it yourself with "
            f"`{_MAKE_ONE} > {path} && chmod 600 {path}`, or name another with --secrets-key-file"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            temporary.unlink()
    with contextlib.suppress(OSError):  # the new name survives a power loss
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
