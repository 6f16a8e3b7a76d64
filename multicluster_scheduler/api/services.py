"""Services and proxy pods: when a Service is rerouted to delegates, and what its copies in
targets look like (docs/reference.md, "Labels, annotations and finalizers": global services).

A proxy pod never serves traffic, so a Service whose selector matches proxy pods is *rerouted*:
its selector is rewritten to the prefixed keys that delegates carry, the selector before the
rewrite is saved as JSON in ``original-selector``, and the Service is made global. A global
Service (rerouted, or annotated by its user) is copied to targets, where a copy selects the
delegates running there and a mesh such as Cilium's joins the endpoints of all clusters.

These rules are pure functions so that the controller only moves data between clusters.
"""

from __future__ import annotations

import copy as _copy
from collections.abc import Iterable
from typing import Any

import orjson

from . import keys
from .copies import (
    LAST_APPLIED,
    MANAGED_KEYS,
    TRUE,
    Managed,
    annotations_of,
    copy_metadata,
    differs,
    managed_record,
    metadata_differs,
    update_body,
)
from .proxy import no_prefix_regexp, prefixed_key
from .regexps import without_matching

# Annotations a global Service carries while it is copied: none (its own `global` says it).
MARKS: dict[str, str] = {}

HEADLESS = "None"
# Annotations that a cluster's own controllers write about the Service in that cluster: the
# original's are not copied (the target's controllers write their own on the copy).
# Load balancer addresses asked for by annotation (MetalLB, Cilium, kube-vip, Azure): as
# ``loadBalancerIP`` (below), addresses of the source's network, never copied; the target's own
# on a copy are kept.
SOURCE_ADDRESS_ANNOTATIONS = frozenset(
    {
        "metallb.universe.tf/loadBalancerIPs",
        "metallb.io/loadBalancerIPs",
        "io.cilium/lb-ipam-ips",
        "kube-vip.io/loadbalancerIPs",
        "service.beta.kubernetes.io/azure-load-balancer-ipv4",
        "service.beta.kubernetes.io/azure-load-balancer-ipv6",
    }
)
LOCAL_ANNOTATIONS = frozenset(
    {
        LAST_APPLIED,
        "cloud.google.com/neg-status",
        "field.cattle.io/publicEndpoints",
        "metallb.universe.tf/ip-allocated-from-pool",
        MANAGED_KEYS,
        *SOURCE_ADDRESS_ANNOTATIONS,
    }
)
# Assigned by the cluster a Service lives in: never copied, and kept as the target set them.
ASSIGNED_FIELDS = ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy", "healthCheckNodePort")
# Addresses of the source cluster's network, never copied: in a target they would make that
# cluster's nodes take traffic for addresses its owners never gave (externalIPs intercept
# whatever is sent to them: CVE-2020-8554).
SOURCE_ADDRESS_FIELDS = ("externalIPs", "loadBalancerIP")
# Copied when a copy is created, then the target's (its controllers or webhooks may set them):
# never compared, and kept on update.
TARGET_KEPT_FIELDS = ("internalTrafficPolicy",)
_TARGET_KEPT = frozenset(TARGET_KEPT_FIELDS)
NODE_PORT_TYPES = ("NodePort", "LoadBalancer")


def service_reference(service: dict) -> dict:
    """A cached Service (lists carry no kind) as events need it."""
    return {"apiVersion": "v1", "kind": "Service", "metadata": service["metadata"]}


def copy_body(
    reference: dict, labels: dict[str, str], annotations: dict[str, str], spec: dict
) -> dict:
    """A copy of the object ``reference`` names (a Service, or an Ingress that follows one):
    its kind, name and namespace, with the copy's own labels, annotations and spec."""
    meta = reference["metadata"]
    return {
        "apiVersion": reference["apiVersion"],
        "kind": reference["kind"],
        "metadata": {
            "name": meta["name"],
            "namespace": meta["namespace"],
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def is_global(service: dict) -> bool:
    return annotations_of(service).get(keys.GLOBAL) == TRUE


def is_headless(spec: dict) -> bool:
    return spec.get("clusterIP") == HEADLESS


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """Whether a Service's selector selects a pod with ``labels`` (an empty one selects none:
    a Service without a selector has its endpoints managed by someone else)."""
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def unprefixed_selector(selector: dict[str, str]) -> dict[str, str]:
    """The part of a selector that selects pods by their users' labels (keys outside our
    prefix): what selects proxy pods, and what ``original-selector`` saves."""
    return {k: v for k, v in selector.items() if not k.startswith(keys.PREFIX)}


def no_prefix(service: dict) -> Any:
    """The compiled ``no-prefix-label-regexp`` of a Service, or None; ValueError with the
    reason when it is not a regular expression."""
    return no_prefix_regexp(annotations_of(service))


def user_selector(selector: dict[str, str], unprefixed: Any = None) -> dict[str, str]:
    """What rerouting rewrites: the keys outside our prefix but those whose ``key=value`` the
    Service's ``no-prefix-label-regexp`` (compiled, ``unprefixed``) matches, which delegates
    carry as they are."""
    return without_matching(unprefixed_selector(selector), unprefixed)


def rerouted_selector(selector: dict[str, str], unprefixed: Any = None) -> dict[str, str]:
    """Every key prefixed as on delegates (``app`` → ``multicluster.admiralty.io/app``), but
    those ``unprefixed`` matches, kept as they are.

    Keys already prefixed stay; a user key wins over a prefixed key that it rewrites to (a
    manifest re-applied with ``kubectl apply`` merges its selector into the rerouted one, and
    its values are the current ones). When two user keys rewrite to the same key, the one that
    sorts last wins, as on delegates.
    """
    rewritten = user_selector(selector, unprefixed)
    result = {k: v for k, v in selector.items() if k not in rewritten}
    for key, value in sorted(rewritten.items()):
        result[prefixed_key(key)] = value
    return result


def encode_selector(selector: dict[str, str]) -> str:
    """The ``original-selector`` annotation's value: compact JSON, keys sorted."""
    return orjson.dumps(selector, option=orjson.OPT_SORT_KEYS).decode()


def reroute_patch(service: dict, proxy_labels: Iterable[dict[str, str]]) -> dict | None:
    """The JSON merge patch that reroutes ``service`` to delegates, or None when it selects no
    proxy pod (of those whose labels are given) or is rerouted already. ValueError when its
    ``no-prefix-label-regexp`` is not a regular expression.

    The selector is replaced, not merged: keys that go are set to null. The patch is
    conditional on the resourceVersion it was computed from.
    """
    spec = service.get("spec") or {}
    selector = spec.get("selector") or {}
    unprefixed = no_prefix(service)
    if not user_selector(selector, unprefixed):
        return None  # rerouted already, or every key is kept as it is
    original = unprefixed_selector(selector)
    if not any(selects(original, labels or {}) for labels in proxy_labels):
        return None
    rerouted = rerouted_selector(selector, unprefixed)
    new_selector: dict[str, str | None] = {k: None for k in selector if k not in rerouted}
    new_selector.update({k: v for k, v in rerouted.items() if selector.get(k) != v})
    wanted = {
        keys.CILIUM_GLOBAL_SERVICE: TRUE,
        keys.GLOBAL: TRUE,
        keys.ORIGINAL_SELECTOR: encode_selector(original),
    }
    annotations = annotations_of(service)
    meta = service["metadata"]
    return {
        "metadata": {
            "annotations": {k: v for k, v in wanted.items() if annotations.get(k) != v},
            "resourceVersion": meta["resourceVersion"],
        },
        "spec": {"selector": new_selector},
    }


def is_external_name(service: dict) -> bool:
    """An ExternalName Service is a DNS alias, selecting no pod: it is never copied (its copy
    would make a target's cluster DNS, and ingress controllers, send traffic to whatever name a
    tenant of this cluster chose)."""
    return (service.get("spec") or {}).get("type") == "ExternalName"


def portable_spec(spec: dict) -> dict:
    """A Service spec without what the cluster it lives in assigns: cluster IPs (a headless
    Service's ``None`` stays), IP families, node ports and the health-check node port; nor the
    source's own addresses (external IPs, a load balancer IP)."""
    spec = _copy.deepcopy(spec)
    for field in ASSIGNED_FIELDS:
        if field.startswith("clusterIP") and is_headless(spec):
            continue
        spec.pop(field, None)
    for field in SOURCE_ADDRESS_FIELDS:
        spec.pop(field, None)
    for port in spec.get("ports") or ():
        port.pop("nodePort", None)
    return spec


def desired_copy(service: dict, cluster_name: str) -> dict:
    """The copy of a global ``service`` to keep in a target: same name, namespace and portable
    spec (its selector selects the delegates there), its labels and annotations (but the
    cluster's own, :data:`LOCAL_ANNOTATIONS`) plus parent references, ``parent-uid``,
    ``is-delegate`` and :data:`MANAGED_KEYS`, which lists all of these keys."""
    labels, annotations = copy_metadata(service, cluster_name, local_annotations=LOCAL_ANNOTATIONS)
    spec = portable_spec(service.get("spec") or {})
    annotations[MANAGED_KEYS] = managed_record(
        labels, annotations, (f for f in spec if f not in _TARGET_KEPT)
    )
    return copy_body(service_reference(service), labels, annotations, spec)


def _managed(existing: dict) -> Managed:
    return Managed(existing, local_annotations=LOCAL_ANNOTATIONS, target_kept=_TARGET_KEPT)


def copy_differs(desired: dict, existing: dict) -> bool:
    """Whether the copy in a target (``existing``) must be written to become ``desired``: only
    what is ours is compared (:class:`~.copies.Managed`); what the target's controllers,
    webhooks and defaults add or assign never makes a copy out of date."""
    ours = _managed(existing)
    if metadata_differs(desired, existing, ours):
        return True
    want = {k: v for k, v in desired["spec"].items() if k not in _TARGET_KEPT}
    return differs(want, portable_spec(existing.get("spec") or {}), ours.spec)


def must_recreate(desired: dict, existing: dict) -> bool:
    """A Service cannot become headless, or stop being headless, in place."""
    return is_headless(desired["spec"]) != is_headless(existing.get("spec") or {})


def copy_update(desired: dict, existing: dict) -> dict:
    """The body that replaces ``existing`` with ``desired`` (a PUT, conditional on the
    resourceVersion). Our labels, annotations and spec fields are written, and those of ours
    that ``desired`` dropped removed; everything else is kept as the target has it: others'
    labels, annotations, finalizers and owners, spec fields that are not ours, what the target
    assigned (cluster IPs, IP families, node ports by port name, health-check node port),
    :data:`TARGET_KEPT_FIELDS` and the status."""
    body = update_body(desired, existing, _managed(existing), never_kept=ASSIGNED_FIELDS)
    spec, old = body["spec"], existing.get("spec") or {}
    external = "ExternalName"
    for field in TARGET_KEPT_FIELDS:
        if field in old and spec.get("type") != external:
            spec[field] = old[field]
    if spec.get("type") != external and old.get("type") != external:
        for field in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
            if field in old and field not in spec:
                spec[field] = old[field]
    if spec.get("type") in NODE_PORT_TYPES and old.get("type") in NODE_PORT_TYPES:
        assigned = {
            p.get("name", ""): p["nodePort"] for p in old.get("ports") or () if "nodePort" in p
        }
        for port in spec.get("ports") or ():
            if port.get("name", "") in assigned:
                port["nodePort"] = assigned[port.get("name", "")]
    if (
        spec.get("type") == "LoadBalancer"
        and spec.get("externalTrafficPolicy") == "Local"
        and old.get("healthCheckNodePort")
    ):
        spec["healthCheckNodePort"] = old["healthCheckNodePort"]
    return body
