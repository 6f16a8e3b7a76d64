"""Equal parts of cached objects made one object: what 10,000s of similar pods have in common
is kept once.

Decoded JSON gives every object its own copy of everything. Pods of one workload carry equal
labels, owner references, finalizers and container statuses; pods that started in the same
second carry equal conditions; a proxy pod's status is a copy of its delegate's. Kept as they
come, these copies are most of a pod cache's memory: plain dicts cost hundreds of bytes each,
whatever they hold. :class:`SharedValues` hands back, for a decoded value, an equal value it
has already handed out (hash-consing, bottom-up, so parts of unequal values are shared too).

Shared values are read-only, as cached objects already are: a change to one would show in
every object that holds it. Values nobody holds any more are dropped from the table as it
grows (a pass over it each time it doubles), so memory follows what the caches hold.
"""

from __future__ import annotations

import sys
from typing import Any

import orjson

# Nesting shared, at most: a pod's fields are a few levels deep; a target's answer nested 200
# levels would otherwise cost 200 encodings of itself on every event.
MAX_DEPTH = 8


class SharedValues:
    """A table of shared JSON values (dicts, lists, and strings up to ``longest`` characters)."""

    def __init__(self, longest: int = 64, first_sweep: int = 4096) -> None:
        self.longest = longest
        self._table: dict[int, Any] = {}
        self._sweep_at = first_sweep
        self._first_sweep = first_sweep

    def __len__(self) -> int:
        return len(self._table)

    def share(self, value: Any) -> Any:
        """A value equal to ``value``, made of shared parts (``value`` itself is not changed).
        Strings are interned; numbers, booleans and None are kept as they are."""
        shared = self._share(value)
        if len(self._table) >= self._sweep_at:
            self.sweep()
        return shared

    def sweep(self) -> None:
        """Drop the values only the table still holds. Latest first: a value is entered after
        its parts, so a dropped value lets go of its parts before they are looked at."""
        table = self._table
        getrefcount = sys.getrefcount
        for key in reversed(list(table)):
            # Held by the table and by getrefcount's argument only.
            if getrefcount(table[key]) <= 2:
                del table[key]
        self._sweep_at = max(self._first_sweep, 2 * len(table))

    def _share(self, value: Any, depth: int = 0) -> Any:
        kind = type(value)
        if kind is str:
            return sys.intern(value) if len(value) <= self.longest else value
        if kind is not dict and kind is not list:
            return value
        if depth > MAX_DEPTH:
            return value  # each level encodes what it holds again: deeper is left as it is
        # Looked up whole first (its JSON's hash; a hit is checked by its encoding, which tells
        # true from 1 where == does not): a value seen before, as most are, costs two
        # encodings, both in C.
        try:
            encoded = orjson.dumps(value)
        except orjson.JSONEncodeError:  # not JSON (not from a decoder): kept as it is
            return value
        key = hash(encoded)
        found = self._table.get(key)
        if found is not None and type(found) is kind and orjson.dumps(found) == encoded:
            return found
        if kind is dict:
            shared: Any = {
                self._share(k, depth): self._share(v, depth + 1) for k, v in value.items()
            }
        else:
            shared = [self._share(v, depth + 1) for v in value]
        self._table.setdefault(key, shared)  # a different value there (a collision) stays
        return shared


SHARED = SharedValues()
"""The process's table: every cache that shares through it shares with every other (a proxy
pod's status with its delegate's, a delegate's spec with the summary's copy of it)."""
