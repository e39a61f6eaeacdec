"""One JSON error shape for every failure: {"error": {"code", "message", "field"?, "value"?, "example"?}}."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException

from gpupool.control.errors import ServiceError
from gpupool.spec import SpecError
from gpupool.store.db import driver_error_line, is_disk_full


class ApiError(Exception):
    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None, **extra: Any
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra
        self.headers = headers


def _body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}}


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else exc.headers
        return JSONResponse(
            _body(exc.code, exc.message, **exc.extra), status_code=exc.status, headers=headers
        )

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, exc: SpecError) -> JSONResponse:
        detail = {k: v for k, v in exc.to_dict().items() if k != "message"}
        return JSONResponse(_body("invalid_spec", str(exc), **detail), status_code=422)

    @app.exception_handler(ServiceError)
    async def _service_error(_: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse(
            _body(exc.code, exc.message, field=exc.field, example=exc.example), status_code=exc.status
        )

    @app.exception_handler(OperationalError)
    async def _store_unavailable(request: Request, exc: OperationalError) -> JSONResponse:
        """The store cannot be reached (PostgreSQL stopped, the network cut, SQLite's disk gone): 503 with
        what failed, not a bare 500; nothing was changed, and the head reconnects by itself."""
        where = request.app.state.runtime.store.engine.url.render_as_string(hide_password=True)
        cause = driver_error_line(exc)
        if is_disk_full(exc):
            return JSONResponse(
                _body(
                    "store_full",
                    f"the server's store cannot write: its disk is full ({where}: {cause}); nothing was "
                    "changed; free space on that disk (or grow it), and the server goes on by itself",
                ),
                status_code=503,
                headers={"Retry-After": "30"},
            )
        return JSONResponse(
            _body(
                "store_unavailable",
                f"the server cannot reach its store ({where}: {cause}); nothing was changed; it "
                "reconnects by itself: try again shortly",
            ),
            status_code=503,
            headers={"Retry-After": "5"},
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc is ("body", character offset): no field to name
            where = "body"
            at = first.get("loc", ("body", 0))[-1]
            reason = first.get("ctx", {}).get("error", "JSON decode error")
            message = (
                f"body: not valid JSON ({reason} at character {at}); "
                "send one JSON object, with names and text in double quotes"
            )
        else:
            # a query parameter by its own name ("seconds", not "query.seconds"), and its bound in words
            where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("body", "query")) or "body"
            message = f"{where}: {_bound(first) or first.get('msg', 'invalid request')}"
        return JSONResponse(_body("invalid_request", message, field=where), status_code=422)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        """FastAPI's and Starlette's own refusals (no such path, a method a path does not take, a body that
        cannot be parsed) in the same shape as every other error."""
        where, field = f"{request.method} {request.url.path}", None
        if exc.status_code == 404:
            code, message = "not_found", f"no such path: {where}; the API's paths are listed at /docs"
        elif exc.status_code == 405:
            code = "method_not_allowed"
            message = f"{where}: this path takes other methods; the API's paths are listed at /docs"
        elif exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            code, field = "invalid_request", "body"
            message = "body: could not be parsed (nested too deeply?); send one JSON object"
        else:
            code, message = "http_error", str(exc.detail)
        return JSONResponse(
            _body(code, message, field=field), status_code=exc.status_code, headers=exc.headers
        )


def _bound(error: Mapping[str, Any]) -> str | None:
    """A number past a bound, said as a person would: "172800 is more than 86400, the most it takes"."""
    given, ctx = error.get("input"), error.get("ctx") or {}
    said = {
        "less_than_equal": ("le", "is more than {}, the most it takes"),
        "less_than": ("lt", "must be less than {}"),
        "greater_than_equal": ("ge", "is less than {}, the least it takes"),
        "greater_than": ("gt", "must be more than {}"),
    }.get(str(error.get("type")))
    if said is None or said[0] not in ctx:
        return None
    bound = ctx[said[0]]
    return f"{given} " + said[1].format(f"{bound:g}" if isinstance(bound, float) else bound)
