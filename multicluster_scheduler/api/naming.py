"""Names that must be unique and usable as label values (63 characters at most).

Virtual nodes are named after their target: Target ``c1`` in ``default`` becomes
``admiralty-namespace-default-c1``, ClusterTarget ``c1`` becomes ``admiralty-cluster-c1``. When
joining with ``-`` could make two different inputs collide (a variable part holding a ``-``,
with several variable parts) or the result is too long, a hash of all parts disambiguates.

Delegates carry their user labels under our prefix (:func:`prefixed_label_key`), so that
controllers in the target never mistake them for their own pods.
"""

from __future__ import annotations

import hashlib

from . import keys

MAX_LENGTH = 63
HASH_LENGTH = 10


def unique_name(variable: list[str], constant: tuple[str, ...] = ()) -> str:
    parts = [p for p in (*constant, *variable) if p]
    name = "-".join(parts)
    ambiguous = len([p for p in variable if p]) > 1 and any("-" in p for p in variable)
    if not ambiguous and len(name) <= MAX_LENGTH:
        return name
    digest = hashlib.sha256("/".join(parts).encode()).hexdigest()[:HASH_LENGTH]
    head = name[: MAX_LENGTH - HASH_LENGTH - 1].rstrip("-")
    return f"{head}-{digest}"


def virtual_node_name(target_name: str, target_namespace: str | None = None) -> str:
    """The virtual node of a Target (with its namespace) or of a ClusterTarget (without)."""
    if target_namespace:
        return unique_name([target_namespace, target_name], ("admiralty", "namespace"))
    return unique_name([target_name], ("admiralty", "cluster"))


def prefixed_label_key(key: str) -> str:
    """``k`` → ``multicluster.admiralty.io/<part of k after the last '/'>``."""
    return keys.PREFIX + key.rsplit("/", 1)[-1]
