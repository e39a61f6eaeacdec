"""Secrets: values a user keeps on the head (an API key, a Hugging Face token) for their work's
environment, so that they are in no spec, no shell history and no listing, as dstack's `dstack secret` and
GitHub Actions' secrets keep them.

Each user's secrets are their own (`owner`, the token's name). A spec names the ones its work needs
(`secrets: [HF_TOKEN]`); they must exist at submit, and each attempt reads their values when it starts
(`resolve`), so a changed secret reaches the next attempt and a deleted one fails it with the reason. The
API lists names and when each was set, never a value; the audit log says who set or deleted which.

The store holds each value encrypted with the head's key, bound to its row (control/secret_keys.py), so a
copy of the database gives no value away. The head's start encrypts what is still plain text and moves
what an older key encrypted to the first (`encrypt_stored`). A value no key opens is kept, never dropped:
the listing marks it, and an attempt that needs it fails naming the key it was encrypted with.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from gpupool.control import audit
from gpupool.control.errors import Invalid, NotFound
from gpupool.control.secret_keys import SecretKeys, Undecryptable, sealed_with
from gpupool.spec import SpecError
from gpupool.spec.workload import check_env_name
from gpupool.store.db import Store
from gpupool.store.models import Secret
from gpupool.timeutil import as_utc, utcnow

log = logging.getLogger("gpupool.secrets")

MAX_VALUE: Final = 65_536  # characters of one secret
MAX_PER_USER: Final = 1000


class SecretUnavailable(Exception):
    """A secret a starting attempt needs cannot be given to it: the message says which and the fix."""


class MissingSecret(SecretUnavailable):
    """A secret a starting attempt needs no longer exists."""


class UnreadableSecret(SecretUnavailable):
    """A secret a starting attempt needs is encrypted with a key the head lacks, or was altered."""


def _name(name: Any) -> str:
    try:
        return check_env_name(name, "name")
    except SpecError as exc:
        raise Invalid(str(exc), field="name", example="HF_TOKEN") from None


def set_secret(store: Store, keys: SecretKeys, owner: str, name: Any, value: Any) -> dict[str, Any]:
    """Create or replace `owner`'s secret `name`; the answer names it, without the value."""
    name = _name(name)
    if not isinstance(value, str) or not value:
        raise Invalid("value: give the secret's value as a non-empty text", field="value", example="hf_...")
    if len(value) > MAX_VALUE or "\x00" in value:
        raise Invalid(
            f"value: at most {MAX_VALUE:,} characters and no NUL (an environment variable's value)",
            field="value",
        )
    stored = keys.encrypt(owner, name, value)
    with store.session() as s:
        row = s.scalar(select(Secret).where(Secret.owner == owner, Secret.name == name))
        if row is None:
            count = s.scalar(select(func.count()).select_from(Secret).where(Secret.owner == owner)) or 0
            if count >= MAX_PER_USER:
                raise Invalid(
                    f"{owner} has {count} secrets, the most one user may keep; delete some first "
                    "(`gpupool secret delete NAME`)",
                    field="name",
                )
            row = Secret(owner=owner, name=name, value=stored, updated_at=utcnow())
            s.add(row)
            said = "set"
        else:
            row.value, row.updated_at = stored, utcnow()
            said = "replaced"
        audit.record(s, audit.SECRET, f"{owner}/{name}", said, owner)
        s.flush()
        return secret_view(row, keys)


def list_secrets(store: Store, keys: SecretKeys, owner: str) -> list[dict[str, Any]]:
    with store.read() as s:
        rows = s.scalars(select(Secret).where(Secret.owner == owner).order_by(Secret.name))
        return [secret_view(row, keys) for row in rows]


def delete_secret(store: Store, keys: SecretKeys, owner: str, name: str) -> dict[str, Any]:
    """Delete `owner`'s secret `name`: work naming it fails when it next starts."""
    with store.session() as s:
        row = s.scalar(select(Secret).where(Secret.owner == owner, Secret.name == name))
        if row is None:
            raise NotFound(f"{owner} has no secret named {name!r}; list them with `gpupool secret list`")
        view = secret_view(row, keys)
        s.delete(row)
        audit.record(s, audit.SECRET, f"{owner}/{name}", "deleted", owner)
        return view


def _stored(s: Session, owner: str, names: Sequence[str]) -> dict[str, str]:
    """`owner`'s secrets among `names`, name -> value as stored; the ones they lack are left out."""
    if not names:
        return {}
    rows = s.execute(select(Secret.name, Secret.value).where(Secret.owner == owner, Secret.name.in_(names)))
    return {name: value for name, value in rows}


def check_at_submit(s: Session, owner: str, names: Sequence[str]) -> None:
    """Refuse (Invalid naming `secrets[i]`) a spec naming a secret its submitter does not have."""
    have = _stored(s, owner, names)
    for index, name in enumerate(names):
        if name not in have:
            owned = list(s.scalars(select(Secret.name).where(Secret.owner == owner)))
            close = difflib.get_close_matches(name, owned, n=1)
            meant = f"did you mean {close[0]!r}? or " if close else ""
            raise Invalid(
                f"secrets[{index}]: {owner} has no secret named {name!r}; {meant}set it first with "
                f"`gpupool secret set {name}` (the value is read from stdin)",
                field=f"secrets[{index}]",
                example=name,
            )


def resolve(s: Session, keys: SecretKeys, owner: str, names: Sequence[str]) -> dict[str, str]:
    """The values of `owner`'s secrets `names`, for an attempt's environment (MissingSecret: one is gone;
    UnreadableSecret: no key of the head opens one)."""
    stored = _stored(s, owner, names)
    values: dict[str, str] = {}
    for name in names:
        if name not in stored:
            raise MissingSecret(
                f"the secret {name} of {owner} no longer exists; set it again (`gpupool secret set {name}`) "
                "and submit the work again"
            )
        try:
            values[name] = keys.decrypt(owner, name, stored[name])
        except Undecryptable as exc:
            raise UnreadableSecret(f"the secret {name} of {owner} cannot be decrypted: {exc}") from None
    return values


def encrypt_stored(store: Store, keys: SecretKeys) -> dict[str, int]:
    """At the head's start, in one transaction: encrypt the values still in plain text (written before
    gpupool encrypted secrets) and encrypt again with the first key those an older key encrypted, so a
    rotated-out key can leave the file. A value no key opens is left as it is and counted (logged with the
    keys it needs); each row is written only if nobody changed it meanwhile (several heads may start at
    once). The times the users set them stay."""
    counts = {"encrypted": 0, "rekeyed": 0, "unreadable": 0}
    lacking: set[str] = set()
    with store.session() as s:
        rows = s.execute(
            select(Secret.id, Secret.owner, Secret.name, Secret.value).where(
                ~Secret.value.startswith(keys.current_prefix, autoescape=True)
            )
        ).all()
        for row_id, owner, name, stored in rows:
            try:
                value = keys.decrypt(owner, name, stored)
            except Undecryptable as exc:
                counts["unreadable"] += 1
                lacking.add(exc.key_id or "damaged")
                continue
            written = s.execute(
                update(Secret)
                .where(Secret.id == row_id, Secret.value == stored)
                .values(value=keys.encrypt(owner, name, value), updated_at=Secret.updated_at)
                .execution_options(synchronize_session=False)
            )
            if written.rowcount:  # type: ignore[attr-defined]  # else changed meanwhile: written encrypted
                counts["rekeyed" if sealed_with(stored) else "encrypted"] += 1
    log.info(
        "event=secrets_encrypted file=%s key=%s keys=%s plain_encrypted=%d rekeyed=%d unreadable=%d",
        keys.path,
        keys.current,
        ",".join(keys.ids),
        counts["encrypted"],
        counts["rekeyed"],
        counts["unreadable"],
    )
    if lacking:
        log.warning(
            "event=secrets_unreadable count=%d need=%s file=%s fix=%r",
            counts["unreadable"],
            ",".join(sorted(lacking)),
            keys.path,
            "put the missing keys back as lines of the key file and restart the head; otherwise their "
            "owners must set them again (`gpupool secret list --owner NAME` marks them)",
        )
    return counts


def secret_view(row: Secret, keys: SecretKeys) -> dict[str, Any]:
    """A secret as the API shows it, never its value: `key`, the id of the key its value is encrypted with
    (null: plain text, until the head's next start); `unreadable`, why no key of the head opens it, or null.
    """
    updated = as_utc(row.updated_at)
    try:
        keys.decrypt(row.owner, row.name, row.value)
        unreadable = None
    except Undecryptable as exc:
        unreadable = str(exc)
    return {
        "name": row.name,
        "owner": row.owner,
        "updated_at": updated.isoformat() if updated else None,
        "key": sealed_with(row.value),
        "unreadable": unreadable,
    }
