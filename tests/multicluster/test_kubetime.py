"""Kubernetes times: written as the API server writes them, read whatever a server sends."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from multicluster.kubetime import format_micro_time, format_time, parse_time

WHEN = dt.datetime(2026, 11, 26, 1, 2, 3, 456789, tzinfo=dt.UTC)


def test_times_are_written_as_the_api_server_writes_them():
    assert format_time(WHEN) == "2026-11-26T01:02:03Z"
    assert format_micro_time(WHEN) == "2026-11-26T01:02:03.456789Z"
    paris = WHEN.astimezone(dt.timezone(dt.timedelta(hours=1)))
    assert format_time(paris) == "2026-11-26T01:02:03Z", "always in UTC"


def test_any_rfc3339_time_is_read_and_anything_else_is_none():
    assert parse_time("2026-11-26T01:02:03Z") == WHEN.replace(microsecond=0)
    assert parse_time("2026-11-26T01:02:03.456789Z") == WHEN
    assert parse_time("2026-11-26T02:02:03+01:00") == WHEN.replace(microsecond=0)
    for bad in (None, "", "yesterday", "2026-13-40T00:00:00Z", 12, {"a": 1}):
        assert parse_time(bad) is None


@given(st.datetimes(min_value=dt.datetime(1970, 1, 1), timezones=st.just(dt.UTC)))
def test_what_is_written_reads_back(when):
    assert parse_time(format_micro_time(when)) == when
    assert parse_time(format_time(when)) == when.replace(microsecond=0)


@given(st.text())
def test_reading_never_raises(text):
    parse_time(text)
