"""Garbage-collector settings for processes that cache many Kubernetes objects.

Every watch event parses into dozens of new dicts and lists. With CPython's default thresholds
(700, 10, 10), the full collections this triggers traverse every cached object: with 10,000
pods cached, applying an event cost about 120 µs, nine tenths of it in the collector. Cached
objects are plain JSON (no reference cycles), so collections can be far rarer: with the
thresholds below the same event costs about 35 µs. ``gc.freeze()`` after the initial sync
moves what is cached by then out of the collector's sight altogether.
"""

from __future__ import annotations

import gc

THRESHOLDS = (50_000, 50, 1_000)


def tune_for_caches() -> None:
    """Make full collections rare; call once per process (the Manager does)."""
    gc.set_threshold(*THRESHOLDS)


def freeze_cached() -> None:
    """Exclude everything alive now (e.g. just-synced caches) from future collections."""
    gc.collect()
    gc.freeze()
