"""Who may call the kubelet API of the virtual nodes: the API server, and nobody else.

TLS requires a client certificate from the cluster's client CA (never the system's public CAs),
and the certificate's user must be allowed ``nodes/proxy``: ``get`` to read logs, ``create`` to
run or attach to anything. That is asked of the API server with a SubjectAccessReview and
remembered for a while, as a kubelet in ``Webhook`` authorization mode does.
"""

from __future__ import annotations

import logging
import ssl
import time
from pathlib import Path

from multicluster import ApiError, Client, Unreachable
from multicluster.resources import SUBJECT_ACCESS_REVIEWS

log = logging.getLogger(__name__)

ALLOWED_TTL = 300.0
DENIED_TTL = 30.0


def user_of(peercert: dict | None) -> tuple[str, list[str]]:
    """User name and groups of a verified client certificate (CN and O, as Kubernetes reads
    them)."""
    user, groups = "", []
    for rdn in (peercert or {}).get("subject") or ():
        for key, value in rdn:
            if key == "commonName":
                user = value
            elif key == "organizationName":
                groups.append(value)
    return user, groups


class Authorizer:
    """Whether a client certificate's user may use the kubelet API (``nodes/proxy``), asked of
    the local API server and remembered for a while, as the kubelet's webhook authorizer does."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._cache: dict[tuple, tuple[float, str | None]] = {}

    async def refusal(self, user: str, groups: list[str], verb: str) -> str | None:
        """None if allowed, else why not."""
        if not user:
            return "the client certificate names no user"
        key = (user, tuple(groups), verb)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached and cached[0] > now:
            return cached[1]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user,
                "groups": groups,
                "resourceAttributes": {"verb": verb, "resource": "nodes", "subresource": "proxy"},
            },
        }
        try:
            answer = await self.client.create(SUBJECT_ACCESS_REVIEWS, review)
        except (ApiError, Unreachable) as e:
            log.error("cannot review access of %s to the kubelet API: %s", user, e)
            return f"cannot check authorization: {e}"
        status = answer.get("status") or {}
        refusal = None
        if not status.get("allowed"):
            why = status.get("reason") or status.get("evaluationError") or ""
            refusal = f'user "{user}" may not {verb} nodes/proxy' + (f": {why}" if why else "")
        if len(self._cache) > 1024:
            self._cache.clear()
        self._cache[key] = (now + (ALLOWED_TTL if refusal is None else DENIED_TTL), refusal)
        return refusal


def verb_for(method: str, path: str) -> str:
    """What a caller must be allowed on ``nodes/proxy``: ``create`` to run or attach to
    anything (whether the upgrade came as GET or POST), ``get`` to read logs."""
    if kind_of(path) in ("exec", "attach") or method not in ("GET", "HEAD"):
        return "create"
    return "get"


def kind_of(path: str) -> str:
    kind = path.strip("/").split("/", 1)[0]
    return {"containerLogs": "logs", "exec": "exec", "attach": "attach"}.get(kind, "other")


def server_context(cert_file: Path, key_file: Path, client_ca_pem: bytes) -> ssl.SSLContext:
    """TLS that requires a client certificate from the cluster's client CA."""
    # Only the client CA: never the system's public CAs (load_default_certs).
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(cert_file, key_file)
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cadata=client_ca_pem.decode())
    return context
