"""A manifest key for tests, and the seal the webhook would use with it for one namespace and one
user (``mutation_patch(pod, SEAL)``), at the time it is called (so that the webhook takes the
pod again as its own reinvocation) or at ``issued``."""

from __future__ import annotations

import time

from multicluster_scheduler.api.manifest_mac import ManifestKey, seal
from multicluster_scheduler.webhook.mutation import Seal

KEY = ManifestKey(bytes(range(32)), created=0.0)
NAMESPACE = "default"
USER = "alice"
USER_INFO = {"username": USER, "groups": ["system:authenticated"]}


def sealer(
    namespace: str = NAMESPACE,
    username: str = USER,
    issued: int | None = None,
    key: ManifestKey = KEY,
) -> Seal:
    def sealed(manifest: str) -> str:
        return seal(
            key, namespace, username, manifest, int(time.time()) if issued is None else issued
        )

    return sealed


SEAL = sealer()
