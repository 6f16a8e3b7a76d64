"""The event loop's lag: a callback that blocks the loop shows as lag, and a long one is logged."""

from __future__ import annotations

import asyncio
import logging
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
    before_count, before_late = lag_count(), lag_over("0.25")
    watching = asyncio.create_task(metrics.watch_loop_lag(period=0.01, warn_after=0.4))
    await asyncio.sleep(0.05)
    assert lag_count() > before_count, "measured while idle"
    assert lag_over("0.25") == before_late, "an idle loop is not late"
    time.sleep(0.5)  # noqa: ASYNC251 (a callback that blocks the loop: what is measured)
    await asyncio.sleep(0.05)
    watching.cancel()
    assert lag_over("0.25") == before_late + 1
    assert any("event loop late by 0.5s" in r.getMessage() for r in caplog.records)
