"""One JSON error shape for every failure: {"error": {"code", "message", "field"?, "value"?, "example"?}}."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from gpupool.control.errors import ServiceError
from gpupool.spec import SpecError


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def _body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **{k: v for k, v in extra.items() if v is not None}}}


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
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

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "body"
        message = f"{where}: {first.get('msg', 'invalid request')}"
        return JSONResponse(_body("invalid_request", message, field=where), status_code=422)
