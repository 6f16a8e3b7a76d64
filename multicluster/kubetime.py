"""Kubernetes times, written and read in one place.

``Time`` is RFC 3339 in UTC to the second (``creationTimestamp``, conditions' transition times,
an Event's timestamps); ``MicroTime`` to the microsecond (a Lease's ``renewTime``, an Event's
``eventTime``). Reading accepts any RFC 3339 time (what another cluster, or a hostile server,
sends may have a fraction or an offset) and says None rather than raise on anything else.
"""

from __future__ import annotations

import datetime as dt

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
MICRO_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _utc(when: dt.datetime | None) -> dt.datetime:
    return (when or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)


def format_time(when: dt.datetime | None = None) -> str:
    """``when`` (default: now) as a Kubernetes ``Time``."""
    return _utc(when).strftime(TIME_FORMAT)


def format_micro_time(when: dt.datetime | None = None) -> str:
    """``when`` (default: now) as a Kubernetes ``MicroTime``."""
    return _utc(when).strftime(MICRO_TIME_FORMAT)


def parse_time(text: object) -> dt.datetime | None:
    """A ``Time`` or ``MicroTime`` (any RFC 3339 time), as an aware datetime; None if ``text``
    is not one."""
    if not isinstance(text, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)
