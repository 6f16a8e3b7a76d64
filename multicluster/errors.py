"""Typed API errors, so callers branch on meaning (``except NotFound``) instead of status codes.

An error's text ends up where other people read it (a Target's status, events, logs), and the
server that answered may be anyone's: a kubeconfig in a Secret can point the agent at any
address. So an error quotes the server only through the ``message`` of a well-formed Kubernetes
``Status``, cut to :data:`MESSAGE_LIMIT` characters; any other answer is named by its status
code, never quoted.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

MESSAGE_LIMIT = 1024
"""Characters of a Status message kept (an Event's message is about as long at most)."""
# No forged log lines, nothing a terminal obeys: C0, DEL, and C1 (U+009B is a CSI).
_CONTROLS = {c: " " for c in (*range(32), *range(127, 160))}


_BY_STATUS: dict[int, type[ApiError]] = {}
"""The error :func:`error_for` raises for each status code, filled as the classes are made."""


class ApiError(Exception):
    """An error answered by an API server (``status`` is the HTTP status code).

    A subclass names the code it stands for once, as a class keyword (``status=404``): that
    sets its ``status`` and makes it the error raised for that code."""

    status: int = 0

    def __init_subclass__(cls, *, status: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
            _BY_STATUS[status] = cls

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


class BadRequest(ApiError, status=400): ...


class Unauthorized(ApiError, status=401): ...


class Forbidden(ApiError, status=403): ...


class NamespaceTerminating(Forbidden):
    """403 for a create in a namespace being deleted: no permission is missing, the namespace
    is going (the API server's NamespaceLifecycle admission names the cause
    ``NamespaceTerminating``)."""


class NotFound(ApiError, status=404): ...


class Conflict(ApiError, status=409):
    """409: the object changed since it was read (or, as AlreadyExists, exists already)."""


class AlreadyExists(Conflict): ...


class Gone(ApiError, status=410):
    """410: the requested resource version is too old (watch or list must start over)."""


class Invalid(ApiError, status=422): ...


class TooManyRequests(ApiError, status=429): ...


class ServerError(ApiError, status=500):
    """5xx: the server failed (any code from 500 up that has no class of its own)."""


class Unreachable(ApiError):
    """No answer: connection refused, reset, TLS failure or timeout."""


class BadResponse(ApiError):
    """An answer no API server gives: not JSON, not a list, a malformed watch event."""


class ResponseTooLarge(BadResponse):
    """An answer, or one watch event, over the client's size limit (not read further)."""


def status_of(body: Any) -> dict | None:
    """``body`` as a Kubernetes ``Status`` (message cut to :data:`MESSAGE_LIMIT`), or None when
    it is not one."""
    if not isinstance(body, dict) or body.get("kind") != "Status":
        return None
    message = body.get("message", "")
    reason = body.get("reason", "")
    if not isinstance(message, str) or not isinstance(reason, str):
        return None
    kept = message[:MESSAGE_LIMIT].translate(_CONTROLS)
    if kept != message:
        body = {**body, "message": kept + ("…" if len(message) > MESSAGE_LIMIT else "")}
    return body


def phrase(status: int) -> str:
    """``404 Not Found``: a status code in words (ours, not the server's reason phrase)."""
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


def _has_cause(status: dict, reason: str) -> bool:
    """Whether a Status's ``details.causes`` has one of ``reason`` (a StatusCause's type is
    serialized as ``reason``)."""
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return isinstance(causes, list) and any(
        isinstance(cause, dict) and cause.get("reason") == reason for cause in causes
    )


def error_for(status: int, body: Any, context: str) -> ApiError:
    """The typed error for an HTTP status and the API server's Status body. Only a Status's
    message is quoted; any other body is not."""
    details = status_of(body) or {}
    cls = _BY_STATUS.get(status, ServerError if status >= 500 else ApiError)
    if cls is Conflict and details.get("reason") == "AlreadyExists":
        cls = AlreadyExists
    elif cls is Forbidden and _has_cause(details, "NamespaceTerminating"):
        cls = NamespaceTerminating
    if details:
        message = f"{status} {details.get('message') or 'no message'}"
    else:
        message = f"{phrase(status)} (the answer is not a Kubernetes Status: not quoted)"
    return cls(f"{context}: {message}", status=status, body=details)
