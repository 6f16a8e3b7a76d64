"""Ingresses that follow global Services into targets (upstream v0.17's ingress follow): which
ones do, and what their copies look like.

A global Service is copied to targets, where its copy selects the delegates running there. An
Ingress of the same namespace that sends traffic to it belongs there too, so that an ingress
controller of each target routes the same hosts and paths to the delegates it can reach. Its
copy keeps the spec unchanged: the backends name the Service, whose copy has the same name.

These rules are pure functions so that the controller only moves data between clusters.
"""

from __future__ import annotations

import copy as _copy
import re
from collections.abc import Callable

from . import keys
from .copies import (
    LAST_APPLIED,
    MANAGED_KEYS,
    TRUE,
    Managed,
    copy_metadata,
    differs,
    is_copy,
    managed_record,
    metadata_differs,
    update_body,
)
from .services import copy_body, is_global

API_VERSION = "networking.k8s.io/v1"
KIND = "Ingress"
# What an Ingress that is copied says about it, next to our finalizer (as upstream).
MARKS = {keys.GLOBAL: TRUE}
# Annotations that a cluster's own controllers write about the Ingress in that cluster (GKE's
# load balancer, Rancher's endpoints): the original's are not copied, and the target's own on
# a copy are theirs.
LOCAL_ANNOTATIONS = frozenset(
    {
        LAST_APPLIED,
        "field.cattle.io/publicEndpoints",
        "ingress.kubernetes.io/backends",
        "ingress.kubernetes.io/forwarding-rule",
        "ingress.kubernetes.io/https-forwarding-rule",
        "ingress.kubernetes.io/https-target-proxy",
        "ingress.kubernetes.io/ssl-cert",
        "ingress.kubernetes.io/target-proxy",
        "ingress.kubernetes.io/url-map",
        MANAGED_KEYS,
    }
)


# Annotation keys that make an Ingress refused (not copied), matched anywhere in the key: ingress
# controllers' raw configuration (ingress-nginx's configuration-, server-, auth-, stream- and
# modsecurity-snippet, HAProxy's config snippets...) would let whoever writes Ingresses in a
# source namespace write the configuration of a target's ingress controller, which may read
# every Secret there; URLs the controller calls or sends traffic to (auth-url, auth-signin,
# mirror-target) would reach into the target's network (its cloud's metadata address, say).
DEFAULT_REFUSED_ANNOTATIONS = r"(?i)snippet|auth-url|auth-signin|mirror-(target|host|uri)"


def _names_another_namespace(key: str, value: object, namespace: str | None) -> bool:
    if "secret" not in key.lower() or not isinstance(value, str) or "/" not in value:
        return False
    return value.split("/", 1)[0].strip() != namespace


def refused_annotations(ingress: dict, refused: re.Pattern[str] | None) -> list[str]:
    """The annotation keys of ``ingress`` that are refused, sorted: those ``refused`` matches
    (anywhere in the key), and, whatever the pattern, those that name a Secret of another
    namespace (a key with ``secret`` in it and a ``namespace/name`` value, as ingress-nginx's
    auth-secret, auth-tls-secret, proxy-ssl-secret take): the copy would make a target's
    ingress controller use that namespace's Secret for this one."""
    meta = ingress["metadata"]
    namespace = meta.get("namespace")
    found = []
    for key, value in (meta.get("annotations") or {}).items():
        if (refused is not None and refused.search(key)) or _names_another_namespace(
            key, value, namespace
        ):
            found.append(key)
    return sorted(found)


def ingress_reference(ingress: dict) -> dict:
    """A cached Ingress (lists carry no kind) as events need it."""
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": ingress["metadata"]}


def _field(obj: object, name: str) -> object:
    return obj.get(name) if isinstance(obj, dict) else None


def _items(obj: object, name: str) -> list:
    value = _field(obj, name)
    return value if isinstance(value, list) else []


def backend_services(ingress: dict) -> set[str]:
    """Names of the Services the HTTP paths of its rules send traffic to
    (``spec.rules[].http.paths[].backend.service.name``). As upstream, the default backend and
    resource backends are not looked at; a rule without ``http`` (a host only) names none."""
    names = set()
    for rule in _items(ingress.get("spec"), "rules"):
        for path in _items(_field(rule, "http"), "paths"):
            name = _field(_field(_field(path, "backend"), "service"), "name")
            if isinstance(name, str) and name:
                names.add(name)
    return names


def follows(ingress: dict, service: Callable[[str], dict | None]) -> bool:
    """Whether ``ingress`` is copied to targets: it is not a copy, and one of the Services its
    paths send traffic to is global (``service(name)``: the Service of that name in the
    Ingress's namespace, or None) and this cluster's own: a Service copied in from another
    source is global there, not here (nobody here made this Ingress follow)."""
    if is_copy(ingress):
        return False
    for name in backend_services(ingress):
        found = service(name)
        if found is not None and is_global(found) and not is_copy(found):
            return True
    return False


def desired_copy(ingress: dict, cluster_name: str) -> dict:
    """The copy of ``ingress`` to keep in a target: same name, namespace and spec, its labels and
    annotations (but the cluster's own, :data:`LOCAL_ANNOTATIONS`) plus parent references,
    ``parent-uid``, ``is-delegate``, ``global`` and :data:`MANAGED_KEYS`, which lists all of
    these keys and every field of the spec. The status is the target's."""
    labels, annotations = copy_metadata(ingress, cluster_name, local_annotations=LOCAL_ANNOTATIONS)
    annotations.update(MARKS)
    spec = _copy.deepcopy(ingress.get("spec") or {})
    annotations[MANAGED_KEYS] = managed_record(labels, annotations, spec)
    return copy_body(ingress_reference(ingress), labels, annotations, spec)


def _managed(existing: dict) -> Managed:
    return Managed(existing, local_annotations=LOCAL_ANNOTATIONS)


def copy_differs(desired: dict, existing: dict) -> bool:
    """Whether the copy in a target (``existing``) must be written to become ``desired``: our
    labels, annotations or spec fields differ (upstream compares the whole spec, and annotations
    only for keys the original has). What the target added (an ingress class its admission
    defaulted, a controller's annotations, the status) never makes a copy out of date."""
    ours = _managed(existing)
    if metadata_differs(desired, existing, ours):
        return True
    return differs(desired["spec"], existing.get("spec") or {}, ours.spec)


def must_recreate(_desired: dict, _existing: dict) -> bool:
    """An Ingress copy always changes in place."""
    return False


def copy_update(desired: dict, existing: dict) -> dict:
    """The body that replaces ``existing`` with ``desired`` (a PUT, conditional on the
    resourceVersion): the spec fields, labels and annotations of ours written, those the
    original dropped removed (upstream never removes an annotation); the rest kept as the
    target has it."""
    return update_body(desired, existing, _managed(existing))
