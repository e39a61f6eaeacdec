"""Secrets: values a user keeps on the head (an API key, a Hugging Face token) for their work's
environment, so that they are in no spec, no shell history and no listing, as dstack's `dstack secret` and
GitHub Actions' secrets keep them.

Each user's secrets are their own (`owner`, the token's name). A spec names the ones its work needs
(`secrets: [HF_TOKEN]`); they must exist at submit, and each attempt reads their values when it starts
(`resolve`), so a changed secret reaches the next attempt and a deleted one fails it with the reason. The
API lists names and when each was set, never a value; the audit log says who set or deleted which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.control import audit
from gpupool.control.errors import Invalid, NotFound
from gpupool.spec import SpecError
from gpupool.spec.workload import check_env_name
from gpupool.store.db import Store
from gpupool.store.models import Secret
from gpupool.timeutil import as_utc, utcnow

MAX_VALUE: Final = 65_536  # characters of one secret
MAX_PER_USER: Final = 1000


class MissingSecret(Exception):
    """A secret a starting attempt needs no longer exists."""


def _name(name: Any) -> str:
    try:
        return check_env_name(name, "name")
    except SpecError as exc:
        raise Invalid(str(exc), field="name", example="HF_TOKEN") from None


def set_secret(store: Store, owner: str, name: Any, value: Any) -> dict[str, Any]:
    """Create or replace `owner`'s secret `name`; the answer names it, without the value."""
    name = _name(name)
    if not isinstance(value, str) or not value:
        raise Invalid("value: give the secret's value as a non-empty text", field="value", example="hf_...")
    if len(value) > MAX_VALUE or "\x00" in value:
        raise Invalid(
            f"value: at most {MAX_VALUE:,} characters and no NUL (an environment variable's value)",
            field="value",
        )
    with store.session() as s:
        row = s.scalar(select(Secret).where(Secret.owner == owner, Secret.name == name))
        if row is None:
            count = len(s.scalars(select(Secret.id).where(Secret.owner == owner)).all())
            if count >= MAX_PER_USER:
                raise Invalid(
                    f"{owner} has {count} secrets, the most one user may keep; delete some first "
                    "(`gpupool secret delete NAME`)",
                    field="name",
                )
            row = Secret(owner=owner, name=name, value=value, updated_at=utcnow())
            s.add(row)
            said = "set"
        else:
            row.value, row.updated_at = value, utcnow()
            said = "replaced"
        audit.record(s, audit.SECRET, f"{owner}/{name}", said, owner)
        s.flush()
        return secret_view(row)


def list_secrets(store: Store, owner: str) -> list[dict[str, Any]]:
    with store.read() as s:
        rows = s.scalars(select(Secret).where(Secret.owner == owner).order_by(Secret.name))
        return [secret_view(row) for row in rows]


def delete_secret(store: Store, owner: str, name: str) -> dict[str, Any]:
    """Delete `owner`'s secret `name`: work naming it fails when it next starts."""
    with store.session() as s:
        row = s.scalar(select(Secret).where(Secret.owner == owner, Secret.name == name))
        if row is None:
            raise NotFound(f"{owner} has no secret named {name!r}; list them with `gpupool secret list`")
        view = secret_view(row)
        s.delete(row)
        audit.record(s, audit.SECRET, f"{owner}/{name}", "deleted", owner)
        return view


def check_at_submit(s: Session, owner: str, names: Sequence[str]) -> None:
    """Refuse (Invalid naming `secrets[i]`) a spec naming a secret its submitter does not have."""
    if not names:
        return
    have = set(s.scalars(select(Secret.name).where(Secret.owner == owner, Secret.name.in_(names))))
    for index, name in enumerate(names):
        if name not in have:
            raise Invalid(
                f"secrets[{index}]: {owner} has no secret named {name!r}; set it first with "
                f"`gpupool secret set {name}` (the value is read from stdin)",
                field=f"secrets[{index}]",
                example=name,
            )


def resolve(s: Session, owner: str, names: Sequence[str]) -> dict[str, str]:
    """The values of `owner`'s secrets `names`, for an attempt's environment (MissingSecret: one is gone)."""
    if not names:
        return {}
    rows = s.execute(select(Secret.name, Secret.value).where(Secret.owner == owner, Secret.name.in_(names)))
    values = {name: value for name, value in rows}
    for name in names:
        if name not in values:
            raise MissingSecret(
                f"the secret {name} of {owner} no longer exists; set it again (`gpupool secret set {name}`) "
                "and submit the work again"
            )
    return {name: values[name] for name in names}


def secret_view(row: Secret) -> dict[str, Any]:
    updated = as_utc(row.updated_at)
    return {"name": row.name, "owner": row.owner, "updated_at": updated.isoformat() if updated else None}
