"""Typed API errors, so callers branch on meaning (``except NotFound``) instead of status codes."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An error answered by an API server (``status`` is the HTTP status code)."""

    status: int = 0

    def __init__(self, message: str, *, status: int | None = None, body: Any = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status
        self.body = body if isinstance(body, dict) else {}

    @property
    def reason(self) -> str:
        return self.body.get("reason", "")

    @property
    def message(self) -> str:
        return self.body.get("message") or str(self)


class BadRequest(ApiError):
    status = 400


class Unauthorized(ApiError):
    status = 401


class Forbidden(ApiError):
    status = 403


class NotFound(ApiError):
    status = 404


class Conflict(ApiError):
    """409: the object changed since it was read (or, as AlreadyExists, exists already)."""

    status = 409


class AlreadyExists(Conflict):
    pass


class Gone(ApiError):
    """410: the requested resource version is too old (watch or list must start over)."""

    status = 410


class Invalid(ApiError):
    status = 422


class TooManyRequests(ApiError):
    status = 429


class ServerError(ApiError):
    status = 500


class Unreachable(ApiError):
    """No answer: connection refused, reset, TLS failure or timeout."""


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Gone,
    422: Invalid,
    429: TooManyRequests,
}


def error_for(status: int, body: Any, context: str) -> ApiError:
    """The typed error for an HTTP status and the API server's Status body."""
    details = body if isinstance(body, dict) else {}
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    if cls is Conflict and details.get("reason") == "AlreadyExists":
        cls = AlreadyExists
    message = details.get("message") or (body if isinstance(body, str) else "") or "no message"
    return cls(f"{context}: {status} {message}", status=status, body=details)
