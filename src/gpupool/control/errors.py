"""Errors the service layer raises; the API maps each to an HTTP status with a JSON body."""

from __future__ import annotations


class ServiceError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, field: str | None = None, example: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.example = example


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Forbidden(ServiceError):
    """The caller may not do this (an admin may): the message says who may, and what the caller can do."""

    status = 403
    code = "forbidden"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class Invalid(ServiceError):
    status = 422
    code = "invalid"


class Unavailable(ServiceError):
    """The thing asked for exists but cannot serve now (a service with no running attempt): try again."""

    status = 503
    code = "unavailable"
