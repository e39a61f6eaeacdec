"""What every request may carry, checked before a route acts on it: no NUL characters anywhere, and small
bodies (a reason, a description) whose fields are named and typed, so a typo is refused, not ignored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import Request

from gpupool.api.errors import ApiError

MAX_TEXT = 1000  # characters in a free-text field of a small body (a reason, a description)


async def refuse_nul(request: Request) -> None:
    """Refuse a NUL character in a path, query or JSON body: no name, command, path or environment value
    can hold one (a process cannot be started with it; PostgreSQL cannot store it)."""
    for where, params in (("path", request.path_params), ("query", request.query_params)):
        for key, value in params.items():
            if "\x00" in str(value):
                raise _nul(key if where == "query" else f"{where}.{key}")  # a query parameter by its name
    raw = await request.body()
    if b"\\u0000" not in raw:  # the only way JSON spells a NUL character inside text
        return
    try:
        body = await request.json()
    except (ValueError, RecursionError):
        return  # not JSON (or nested past what Python parses): the route's own parsing answers
    field = _nul_at(body)
    if field is not None:
        raise _nul(field)


def refuse_unknown_query(request: Request) -> None:
    """Refuse a query parameter the route does not take: a misspelled filter (`stat=running`,
    `qeue=nlp`) was dropped without a word, and a script got every workload for it."""
    if not request.query_params:
        return
    known = _query_names(request.scope.get("route"))
    if known is None:
        return
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        taken = ", ".join(sorted(known)) or "none"
        raise ApiError(
            422, "invalid", f"{unknown[0]}: unknown query parameter; parameters: {taken}", field=unknown[0]
        )


_QUERY_NAMES: dict[int, frozenset[str]] = {}


def _query_names(route: Any) -> frozenset[str] | None:
    """The query parameters `route` takes, its dependencies' included (read once a route); None for what
    is not an API route."""
    from fastapi.routing import APIRoute

    if not isinstance(route, APIRoute):
        return None
    found = _QUERY_NAMES.get(id(route))
    if found is None:
        names: set[str] = set()
        walk = [route.dependant]
        while walk:
            dependant = walk.pop()
            names.update(param.alias for param in dependant.query_params)
            walk.extend(dependant.dependencies)
        found = _QUERY_NAMES[id(route)] = frozenset(names)
    return found


def _nul(field: str) -> ApiError:
    message = f"{field}: contains a NUL character (\\u0000), which no text here may hold; remove it"
    return ApiError(422, "invalid_request", message, field=field)


def _nul_at(body: Any) -> str | None:
    """Where in `body` a text (or a key) holds a NUL character, as spec errors name fields: `env.A`,
    `commands[0]`; "body" for the body itself. Walked without recursion: JSON may nest deeply."""
    pending: list[tuple[str, Any]] = [("", body)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, str):
            if "\x00" in value:
                return where or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                inner = f"{where}.{key}" if where else str(key)
                if "\x00" in str(key):
                    return inner
                pending.append((inner, item))
        elif isinstance(value, list):
            pending.extend((f"{where or 'body'}[{i}]", item) for i, item in enumerate(value))
    return None


def fields(body: dict[str, Any] | None, allowed: Sequence[str]) -> dict[str, Any]:
    """`body` (none: empty), refused if it has a field not in `allowed`."""
    body = body or {}
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        message = f"{unknown[0]}: unknown field; fields: {', '.join(allowed)}"
        raise ApiError(422, "invalid", message, field=unknown[0])
    return body


def text(body: dict[str, Any], name: str, *, example: str, max_chars: int = MAX_TEXT) -> str | None:
    """The text field `name` of `body`; None when it is absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        message = f"{name}: {value!r} is not text; e.g. {example!r}"
        raise ApiError(422, "invalid", message, field=name, example=example)
    if len(value) > max_chars:
        message = f"{name}: {len(value):,} characters is over the limit of {max_chars:,}; shorten it"
        raise ApiError(422, "invalid", message, field=name)
    return value
