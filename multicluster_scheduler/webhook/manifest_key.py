"""The key that seals saved manifests, shared by the agent's replicas through a Secret.

The chart creates the Secret empty (so uninstalling removes it, and ``helm upgrade`` leaves
what the agent wrote): the first replica to find it empty fills it with 32 random bytes and the
time it made them, a concurrent one loses the update race and reads the winner's, as the
webhook's CA is shared (``certificates``). Every replica's webhook seals with it, and the leader's
scheduler checks with it. A proxy pod made before the key was (by an earlier release, whose
webhook wrote no MAC) is trusted without one (docs/operations.md, "Upgrades").

The key's bytes never reach a log, an event or a process's arguments.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import logging
import time

from multicluster import ApiError, Client, Conflict, Unreachable
from multicluster.errors import ServerError, TooManyRequests
from multicluster.kubetime import format_micro_time, parse_time
from multicluster.resources import SECRETS

from ..api.manifest_mac import KEY_BYTES, ManifestKey

log = logging.getLogger(__name__)
KEY, CREATED = "key", "created"


class ManifestKeyError(Exception):
    """The Secret is missing, may not be read or written, or holds something that is not a key:
    the agent does not start."""


def key_from(data: dict) -> ManifestKey | None:
    """The key a Secret's ``data`` holds; None when it holds none yet. ManifestKeyError when
    it holds something else (shorter than 32 bytes, not base64)."""
    if not data.get(KEY):
        return None
    try:
        secret = base64.b64decode(data[KEY], validate=True)
        created_text = base64.b64decode(data.get(CREATED) or "", validate=True).decode()
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise ManifestKeyError("its data is not base64") from None
    if len(secret) < KEY_BYTES:
        raise ManifestKeyError(f"its key is {len(secret)} bytes, fewer than {KEY_BYTES}")
    created = parse_time(created_text)
    if created is None:
        log.warning(
            "the manifest key has no valid creation time: no proxy pod without a MAC is trusted"
        )
    return ManifestKey(secret, created.timestamp() if created is not None else None)


def key_data(key: ManifestKey) -> dict[str, str]:
    """A Secret's ``data`` holding ``key``."""
    created = time.time() if key.created is None else key.created
    stamp = format_micro_time(dt.datetime.fromtimestamp(created, dt.UTC))
    return {
        KEY: base64.b64encode(key.secret).decode(),
        CREATED: base64.b64encode(stamp.encode()).decode(),
    }


async def load_manifest_key(client: Client, namespace: str, name: str) -> ManifestKey:
    """The shared key from the Secret ``namespace/name``, filling the Secret first if it is
    empty. ManifestKeyError when the Secret is missing, may not be read or written, or holds
    something else."""
    while True:
        try:
            secret = await client.get(SECRETS, name, namespace)
        except (Unreachable, ServerError, TooManyRequests) as e:
            log.warning("cannot read the manifest key secret yet, retrying: %s", e)
            await asyncio.sleep(1.0)
            continue
        except ApiError as e:
            raise ManifestKeyError(
                f"Secret {namespace}/{name} cannot be read ({e}): the chart makes it, and lets "
                "the agent read and update it"
            ) from None
        data = secret.get("data") or {}
        try:
            found = key_from(data)
        except ManifestKeyError as e:
            raise ManifestKeyError(f"Secret {namespace}/{name}: {e}") from None
        if found is not None:
            return found
        key = ManifestKey.new(created=time.time())
        secret["data"] = {**data, **key_data(key)}
        try:
            await client.update(SECRETS, secret)
        except Conflict:
            continue  # another replica filled it first: use theirs
        except (Unreachable, ServerError, TooManyRequests) as e:
            log.warning("cannot write the manifest key secret yet, retrying: %s", e)
            await asyncio.sleep(1.0)
            continue
        except ApiError as e:
            raise ManifestKeyError(f"Secret {namespace}/{name} cannot be written ({e})") from None
        log.info("created manifest key secret=%s/%s", namespace, name)
        return key
