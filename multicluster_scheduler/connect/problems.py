"""What went wrong, said so that the user knows what to fix.

Every API error of export and join is turned into one sentence naming the step, the kubeconfig
context (and its server), and the remedy: 403 quotes the API server's own words (they name the
verb, resource and namespace that are missing), 401 asks for fresh credentials, no answer names
the address that did not answer.
"""

from __future__ import annotations

import sys
from typing import TextIO

from multicluster.errors import ApiError, Forbidden, NotFound, Unauthorized, Unreachable

from ..virtual_kubelet.delegate_events import printable

MAX_LINE = 8192


class ConnectError(Exception):
    """A failure of export or join, with a message meant for the user (printed by :func:`say`)."""


def say(line: str, stream: TextIO | None = None) -> None:
    """Print one line of what a command reports, as text only: it quotes what the clusters
    wrote (a Source's or Target's condition, names a target's server lists), and a hostile
    target chooses those; control characters, which a terminal would obey, become spaces and
    formatting characters (bidirectional overrides) are dropped."""
    print(printable(line, MAX_LINE), file=stream or sys.stdout, flush=True)


def explain(
    error: ApiError,
    *,
    doing: str,
    context: str,
    server: str,
    installed_kind: str | None = None,
) -> str:
    """One message for an API error raised while ``doing`` something in ``context``.

    ``installed_kind``: the kind being handled when it is one of ours, so that a 404 of the
    resource itself reads as "multicluster-scheduler is not installed there".
    """
    where = f"context {context} ({server})"
    if isinstance(error, Unreachable):
        cause = _cause(error)
        return (
            f"cannot {doing}: the API server of {where} does not answer ({cause}); "
            f"check that the cluster is up and that {server} is the right address"
        )
    if isinstance(error, Unauthorized):
        return (
            f"cannot {doing}: {where} rejected the credentials (401 Unauthorized); "
            f"log in again or fix the user of context {context}"
        )
    if isinstance(error, Forbidden):
        return (
            f"cannot {doing}: {where} does not allow it (403 Forbidden): {error.message}; "
            f"ask an admin of that cluster for this permission or use a context that has it"
        )
    if isinstance(error, NotFound):
        details = error.body.get("details") or {}
        if details.get("kind") == "namespaces":
            return (
                f"cannot {doing}: namespace {details.get('name')} does not exist in context "
                f"{context}; create it first (kubectl --context {context} create namespace "
                f"{details.get('name')})"
            )
        if installed_kind and not details:
            return (
                f"cannot {doing}: context {context} does not know the {installed_kind} kind; "
                f"is multicluster-scheduler installed there (helm install)?"
            )
    return f"cannot {doing} in context {context}: {error.message}"


def _cause(error: Unreachable) -> str:
    """The network error in a few words (aiohttp's own text rather than its repr)."""
    cause = error.__cause__
    if cause is None:
        return str(error).rsplit(": ", 1)[-1]
    if isinstance(cause, TimeoutError):
        return "timed out"
    return str(cause) or type(cause).__name__
