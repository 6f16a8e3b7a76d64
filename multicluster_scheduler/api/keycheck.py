"""Annotations that look like ours but are not: the mistakes that make a pod run at home.

A pod is elected by one exact key, ``multicluster.admiralty.io/elect``. A key misspelt
(``multicluster.admiralty.io/elected``), under a prefix cut short (``multicluster.admiralty/elect``)
or in a namespace not labelled ``multicluster-scheduler=enabled`` leaves the pod an ordinary pod:
it runs in its own cluster, and nothing fails. These rules find such keys; the chart's
ValidatingAdmissionPolicy (``templates/admission-warnings.yaml``) applies the same rules as
admission warnings, which ``kubectl apply`` prints, and ``status`` applies them to the pods it
finds (docs/reference.md says both). A test checks that the chart's list of keys is this one.

The rules, for an annotation key of a pod or pod template:

- *unknown*: under our prefix, ``multicluster.admiralty.io/``, but not a key that goes on pods
  (:data:`POD_ANNOTATIONS`, Admiralty's included);
- *near miss*: under another prefix, a key that names ``admiralty`` (any case), or whose name
  (after the last ``/``) is ``elect`` in any case: meant as the election, and not it.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import keys

# What goes on pods under our prefix: what users set, what the agent writes on proxy pods and
# delegates, and Admiralty's own (its agents wrote them; a pod copied from there may carry them).
USER_POD_ANNOTATIONS = (
    keys.ELECT,
    keys.PROXY_POD_SCHEDULING_CONSTRAINTS,
    keys.USE_CONSTRAINTS_FROM_SPEC,
    keys.NO_PREFIX_LABEL_REGEXP,
    keys.NO_RESERVATION,
)
AGENT_POD_ANNOTATIONS = (
    keys.SOURCEPOD_MANIFEST,
    keys.SOURCEPOD_MANIFEST_MAC,
    keys.MIRRORED_ANNOTATIONS,
    keys.PARENT_NAME,
    keys.PARENT_NAMESPACE,
    keys.PARENT_CLUSTER_NAME,
    keys.PREFIX + "recreated-while-source-away",
)
ADMIRALTY_POD_ANNOTATIONS = tuple(
    keys.PREFIX + name for name in ("is-reserved", "is-allowed", "pod-missing-since", "restartedAt")
)
POD_ANNOTATIONS = USER_POD_ANNOTATIONS + AGENT_POD_ANNOTATIONS + ADMIRALTY_POD_ANNOTATIONS
UNKNOWN, NEAR_MISS = "UnknownKey", "NearMiss"


@dataclass(frozen=True)
class KeyMistake:
    key: str
    kind: str  # UNKNOWN or NEAR_MISS

    @property
    def message(self) -> str:
        if self.kind == NEAR_MISS:
            return f'annotation "{self.key}" is not "{keys.ELECT}"'
        if "elect" in self.key.lower():
            return f'annotation "{self.key}" is unknown: did you mean "{keys.ELECT}"?'
        return f'annotation "{self.key}" is unknown to multicluster-scheduler'


def key_mistake(key: str) -> KeyMistake | None:
    """What is wrong with annotation ``key`` of a pod or pod template, if it is one of ours gone
    wrong; None for a key of ours and for anyone else's."""
    if key.startswith(keys.PREFIX):
        return None if key in POD_ANNOTATIONS else KeyMistake(key, UNKNOWN)
    if "admiralty" in key.lower() or key.rsplit("/", 1)[-1].lower() == "elect":
        return KeyMistake(key, NEAR_MISS)
    return None


def annotation_mistakes(annotations: dict[str, str] | None) -> list[KeyMistake]:
    """The mistakes among ``annotations``, by key."""
    found = (key_mistake(key) for key in sorted(annotations or {}))
    return [m for m in found if m is not None]


def namespace_enabled(namespace: dict) -> bool:
    labels = namespace.get("metadata", {}).get("labels") or {}
    return labels.get(keys.NAMESPACE_ENABLED_LABEL) == keys.NAMESPACE_ENABLED_VALUE
