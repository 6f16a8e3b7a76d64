"""The event loop's lag: a callback that blocks the loop shows as lag, and a long one is logged."""

from __future__ import annotations

import asyncio
import logging
import re
import time

from multicluster import metrics


def lag_count() -> float:
    return metrics.REGISTRY.get_sample_value("event_loop_lag_seconds_count") or 0.0


def lag_over(bound: str) -> float:
    """Observations above ``bound`` seconds."""
    count = lag_count()
    below = metrics.REGISTRY.get_sample_value("event_loop_lag_seconds_bucket", {"le": bound})
    return count - (below or 0.0)


async def test_a_blocked_loop_is_measured_and_logged(caplog):
    caplog.set_level(logging.WARNING, logger="multicluster.metrics")
    before_count = lag_count()
    watching = asyncio.create_task(metrics.watch_loop_lag(period=0.01, warn_after=0.4))
    await asyncio.sleep(0.05)
    assert lag_count() > before_count, "measured while idle"
    # (an idle loop may still be late now and then on a busy machine: a timer's lateness is
    # the process waiting for a CPU too, so only the blocked callback's is counted on)
    before_late = lag_over("0.25")
    time.sleep(0.5)  # noqa: ASYNC251 (a callback that blocks the loop: what is measured)
    await asyncio.sleep(0.05)
    watching.cancel()
    assert lag_over("0.25") >= before_late + 1
    late = [r.getMessage() for r in caplog.records if "event loop late by" in r.getMessage()]
    assert late, "a loop blocked for 0.5 s was not logged"
    assert re.fullmatch(r"event loop late by \d+\.\ds: CPU starved or blocked", late[0])
    assert float(late[0].split()[4].rstrip("s:")) >= 0.5
