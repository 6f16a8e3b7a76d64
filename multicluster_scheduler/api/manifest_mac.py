"""Proof that a proxy pod's saved manifest is the one the webhook saved: a keyed MAC.

The delegate that runs in a target is built from the proxy pod's ``sourcepod-manifest``
annotation, not from the pod the API server admitted, and whoever may update pods in a namespace
may rewrite an annotation. So, next to the manifest, the webhook writes
``sourcepod-manifest-mac``: an HMAC-SHA256, under a key only the agents hold (a Secret of their
namespace), of the manifest's bytes, the pod's namespace, a hash of the user whose request the
webhook answered and the time it answered. The scheduler builds a delegate only from a manifest
whose MAC verifies for the pod's namespace (docs/reference.md, "The saved manifest and its
MAC").

The API server gives a pod its uid (and a generated name) after mutating admission, so the MAC
cannot name the pod itself: what ties a manifest to its pod is checked beside it, by the webhook
(the requesting user, the time, the pod's name and owners) and the scheduler (the pod's name).

Pure, and free of the runtime: the webhook's process imports it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from typing import Final

VERSION: Final = "v1"
KEY_BYTES: Final = 32
_USER_HASH = re.compile(r"[0-9a-f]{32}")
_ISSUED = re.compile(r"[0-9]{1,12}")
_DIGEST_BYTES = hashlib.sha256().digest_size


@dataclass(frozen=True)
class ManifestKey:
    """The agents' shared key (never shown: it is left out of ``repr``), and when it was made,
    in seconds since the epoch (None when unknown: then no manifest without a MAC is trusted)."""

    secret: bytes = field(repr=False)
    created: float | None = None

    @classmethod
    def new(cls, created: float | None = None) -> ManifestKey:
        return cls(secrets.token_bytes(KEY_BYTES), created)


@dataclass(frozen=True)
class ManifestMac:
    """What a MAC that verified says: when the webhook wrote it, and for whom (a hash)."""

    issued: int
    user: str


def user_hash(username: str) -> str:
    """The requesting user as the MAC holds it: 128 bits of its SHA-256, in hex (the pod need not
    show who made it)."""
    return hashlib.sha256(_bytes(username)).hexdigest()[:32]


def seal(key: ManifestKey, namespace: str, username: str, manifest: str, issued: int) -> str:
    """The ``sourcepod-manifest-mac`` annotation for ``manifest``, saved by the webhook at
    ``issued`` (seconds since the epoch) for ``username`` in ``namespace``:
    ``v1.<issued>.<user hash>.<MAC, base64url>``."""
    user = user_hash(username)
    digest = _digest(key, namespace, user, issued, manifest)
    return f"{VERSION}.{issued}.{user}.{base64.urlsafe_b64encode(digest).rstrip(b'=').decode()}"


def verify(key: ManifestKey, namespace: str, manifest: str, value: object) -> ManifestMac:
    """What the MAC ``value`` says of ``manifest`` in ``namespace``; ValueError with the reason
    when it is not a MAC that ``key`` made for them."""
    parts = value.split(".") if isinstance(value, str) else []
    if len(parts) != 4:
        raise ValueError("it is not a MAC written by multicluster-scheduler")
    version, issued, user, mac = parts
    if version != VERSION:
        raise ValueError(f"its version {version[:16]!r} is not {VERSION!r}")
    if not _ISSUED.fullmatch(issued) or not _USER_HASH.fullmatch(user):
        raise ValueError("it is not a MAC written by multicluster-scheduler")
    try:
        given = base64.urlsafe_b64decode(mac + "=" * (-len(mac) % 4))
    except (binascii.Error, ValueError):
        given = b""
    expected = _digest(key, namespace, user, int(issued), manifest)
    if len(given) != _DIGEST_BYTES or not hmac.compare_digest(given, expected):
        raise ValueError("it does not verify for this manifest in this namespace")
    return ManifestMac(int(issued), user)


def _digest(key: ManifestKey, namespace: str, user: str, issued: int, manifest: str) -> bytes:
    """HMAC-SHA256 of the fields, each preceded by its length (no field can run into the
    next)."""
    message = b"".join(
        len(part).to_bytes(8, "big") + part
        for part in map(_bytes, (VERSION, namespace, user, str(issued), manifest))
    )
    return hmac.new(key.secret, message, hashlib.sha256).digest()


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")
