"""Regular expressions that users write, as Admiralty evaluates them: Go's syntax and semantics
(RE2, ``MatchString``: unanchored unless the pattern anchors itself), matched against
``key=value`` strings of labels. RE2 runs in time linear in the input whatever the pattern:
these are written by tenants, and Python's backtracking ``re`` can be made to run for hours by a
pattern such as ``(a+)+$``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import re2

MAX_PATTERN = 1024
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # an invalid pattern is reported to its author, not on stderr


def compile_regexp(pattern: str) -> Any:
    """The compiled pattern; ValueError with RE2's reason if it is not one."""
    if not isinstance(pattern, str):
        raise ValueError("not a string")
    if len(pattern) > MAX_PATTERN:
        raise ValueError(f"longer than {MAX_PATTERN} characters")
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as e:
        reason = e.args[0] if e.args else e
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise ValueError(str(reason)) from None


def label_matches(regexp: Any, key: str, value: str) -> bool:
    return regexp.search(f"{key}={value}") is not None


def without_matching(labels: Mapping[str, str], regexp: Any | None) -> dict[str, str]:
    """``labels`` minus those whose ``key=value`` the pattern matches (all when it is None)."""
    if regexp is None:
        return dict(labels)
    return {k: v for k, v in labels.items() if not label_matches(regexp, k, v)}
