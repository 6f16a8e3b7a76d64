"""Ingresses that follow global Services into targets (upstream v0.17's ingress follow): which
ones do, and what their copies look like.

A global Service is copied to targets, where its copy selects the delegates running there. An
Ingress of the same namespace that sends traffic to it belongs there too, so that an ingress
controller of each target routes the same hosts and paths to the delegates it can reach. Its
copy keeps the spec unchanged: the backends name the Service, whose copy has the same name.

A copy configures the ingress controllers of clusters whose owners are not the tenant who wrote
the original, so it carries only what the source's operator allows (:class:`IngressPolicy`):
annotation keys of an allow list, whose values name nothing outside the Ingress's namespace; a
class kept, refused or rewritten; hosts of an allow list. An Ingress with anything else is not
copied at all (:func:`refusals`), rather than copied without it: a copy that lost an annotation
could route without the protection its original has.

These rules are pure functions so that the controller only moves data between clusters.
"""

from __future__ import annotations

import copy as _copy
import enum
import functools
import ipaddress
import re
import socket
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass

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


# -- what a copy may carry: the operator's allow lists ----------------------------------------

# The chart's default of ingresses.refusedAnnotations: annotation keys refused even when the
# allow list (below) lets them through, matched anywhere in the key. Ingress controllers' raw
# configuration (ingress-nginx's configuration-, server-, auth-, stream- and
# modsecurity-snippet, HAProxy's config snippets...) would let whoever writes Ingresses in a
# source namespace write the configuration of a target's ingress controller, which may read
# every Secret there; URLs the controller calls or sends traffic to (auth-url, auth-signin,
# mirror-target) would reach into the target's network; ingress-nginx before 1.11.5 and 1.12.1
# wrote auth-tls-match-cn into its configuration unchecked (CVE-2025-1097, as auth-url and the
# mirror keys: CVE-2025-24514, CVE-2025-1098). It guards operators who allow a whole prefix
# (``nginx.ingress.kubernetes.io/*``).
DEFAULT_REFUSED_ANNOTATIONS = (
    r"(?i)snippet|auth-url|auth-signin|auth-tls-match-cn|mirror-(target|host|uri)"
)
# The older way of naming the class, which the class policy governs as it does the field.
CLASS_ANNOTATION = "kubernetes.io/ingress.class"
EVERY_HOST = "*"

# Reasons of the Warning events on an Ingress that is not copied, and the rules that refuse:
# each names the chart value that would allow what it refused (none allows a reference to
# another namespace).
ANNOTATION_REFUSED = "AnnotationRefused"
CLASS_REFUSED = "IngressClassRefused"
HOST_REFUSED = "HostRefused"
NOT_ALLOWED = "allowedAnnotations"
BLOCKED = "refusedAnnotations"
OUTSIDE = "namespace"
CLASS = "ingressClass"
HOSTS = "allowedHosts"

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_ANNOTATION_PATTERN = re.compile(r"[A-Za-z0-9*._-]+(/[A-Za-z0-9*._-]+)?")
_HOST_PATTERN = re.compile(rf"\*|(\*\.)?{_LABEL}(\.{_LABEL})*")
_HOST = re.compile(rf"(\*\.)?{_LABEL}(\.{_LABEL})*")
_CLASS_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")
_SHOWN = re.compile(r"[A-Za-z0-9*._@:/-]{1,120}")


class ClassPolicy(enum.StrEnum):
    """What becomes of an Ingress's class (``spec.ingressClassName``, or the older annotation
    ``kubernetes.io/ingress.class``) in its copies."""

    KEEP = "keep"  # copied as the original has it (Admiralty v0.17)
    REFUSE = "refuse"  # an Ingress with a class (other than the one allowed) is not copied
    REWRITE = "rewrite"  # every copy gets the operator's class, whatever the original's


def annotation_pattern(pattern: str) -> str:
    """``pattern`` if it is an entry of ``ingresses.allowedAnnotations``: an annotation key in
    which ``*`` stands for any run of characters (``nginx.ingress.kubernetes.io/proxy-*``);
    ValueError otherwise (a regular expression, say)."""
    if len(pattern) > 317 or not _ANNOTATION_PATTERN.fullmatch(pattern):
        raise ValueError(
            f"{pattern!r} is not an annotation key with * wildcards "
            "(letters, digits, '-', '_', '.', '*', one '/')"
        )
    return pattern


def host_pattern(pattern: str) -> str:
    """``pattern`` if it is an entry of ``ingresses.allowedHosts``: a host name, ``*.`` and a
    domain (its subdomains, at any depth), or ``*`` (any host, and none); ValueError otherwise."""
    if len(pattern) > 253 or not _HOST_PATTERN.fullmatch(pattern):
        raise ValueError(
            f"{pattern!r} is not a lowercase host name, '*.' and a domain, or '*' (any host)"
        )
    return pattern


def class_name(name: str) -> str:
    """``name`` if it can name an IngressClass; ValueError otherwise."""
    if len(name) > 253 or not _CLASS_NAME.fullmatch(name):
        raise ValueError(f"{name!r} is not the name of an IngressClass")
    return name


def _glob(patterns: Iterable[str]) -> re.Pattern[str] | None:
    """One expression that fully matches what any of the patterns (``*``: any run) matches."""
    parts = ["".join(".*" if c == "*" else re.escape(c) for c in p) for p in patterns]
    return re.compile("|".join(f"(?:{p})" for p in parts)) if parts else None


@dataclass(frozen=True)
class IngressPolicy:
    """What the operator of a source cluster lets its Ingresses carry into targets (chart values
    ``ingresses.*``, docs/services.md): annotation keys allowed (patterns of
    :func:`annotation_pattern`) and refused anyway (a regular expression searched in the key),
    what becomes of the class, and the hosts allowed (patterns of :func:`host_pattern`). The
    default allows nothing but the product's own keys, refuses any class and any host."""

    allowed_annotations: tuple[str, ...] = ()
    refused_annotations: str | None = DEFAULT_REFUSED_ANNOTATIONS
    class_policy: ClassPolicy = ClassPolicy.REFUSE
    ingress_class: str | None = None
    allowed_hosts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for pattern in self.allowed_annotations:
            annotation_pattern(pattern)
        for pattern in self.allowed_hosts:
            host_pattern(pattern)
        if self.ingress_class is not None:
            class_name(self.ingress_class)
        if self.class_policy is ClassPolicy.REWRITE and self.ingress_class is None:
            raise ValueError("the class policy rewrite needs the class to write")
        if self.refused_annotations:
            re.compile(self.refused_annotations)

    @functools.cached_property
    def _allowed(self) -> re.Pattern[str] | None:
        return _glob(self.allowed_annotations)

    @functools.cached_property
    def _refused(self) -> re.Pattern[str] | None:
        return re.compile(self.refused_annotations) if self.refused_annotations else None

    def annotation_allowed(self, key: str) -> bool:
        return self._allowed is not None and self._allowed.fullmatch(key) is not None

    def annotation_blocked(self, key: str) -> bool:
        return self._refused is not None and self._refused.search(key) is not None

    def host_allowed(self, host: str | None) -> bool:
        """Whether ``host`` may be routed in targets (None: a rule, a TLS entry or the default
        backend for every host, which only ``*`` allows)."""
        if EVERY_HOST in self.allowed_hosts:
            return True
        if host is None:
            return False
        name = host.lower().removesuffix(".")
        if not _HOST.fullmatch(name):
            return False
        for pattern in self.allowed_hosts:
            if pattern.startswith("*."):
                suffix = pattern[1:]
                if name.endswith(suffix) and len(name) > len(suffix):
                    return True
            elif name == pattern:
                return True
        return False

    @property
    def rewritten_class(self) -> str | None:
        """The class every copy gets, if the policy rewrites it."""
        return self.ingress_class if self.class_policy is ClassPolicy.REWRITE else None


# Upstream's behaviour, as near as the agent goes: every annotation, class and host copied (a
# reference to another namespace is refused all the same, and local annotations never copied).
UPSTREAM_POLICY = IngressPolicy(
    allowed_annotations=("*",),
    refused_annotations=None,
    class_policy=ClassPolicy.KEEP,
    allowed_hosts=(EVERY_HOST,),
)


@dataclass(frozen=True, order=True)
class Refusal:
    """One reason an Ingress is not copied: the Warning's ``reason``, the ``rule`` that refused
    (a chart value of ``ingresses``, or :data:`OUTSIDE`) and what it refused, as said
    (``subject``: an annotation key, a class, a host)."""

    reason: str
    rule: str
    subject: str


def shown(text: str) -> str:
    """What a tenant wrote, as an event may quote it: names and references only."""
    return text if _SHOWN.fullmatch(text) else "(not shown: not a name)"


# -- names outside the Ingress's namespace ---------------------------------------------------

_NAMESPACE_SLASH = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)/")
_PROVIDER_REFERENCE = re.compile(r"([^@\s,;]+)@([A-Za-z0-9][A-Za-z0-9-]*)")
_TOKENS = re.compile(r"[\s,;]+")
_CLUSTER_DNS = ("svc", "pod")


def _provider_reference(name: str, provider: str, namespace: str) -> str | None:
    """What a Traefik reference ``name@provider`` names outside ``namespace``, if anything.
    Traefik names a Middleware (or TLSOption, ServersTransport) of its CRD provider
    ``<namespace>-<name>@kubernetescrd``: joined by a ``-``, both ambiguous as soon as either
    holds one (``team-b-auth`` is ``auth`` of ``team-b`` and ``b-auth`` of ``team``), so only a
    reference with a single ``-``, after this namespace, names this namespace for sure. Any
    other provider (``@file``, ``@internal``...) is the target's own configuration."""
    if provider.lower() != "kubernetescrd":
        return f"Traefik configuration of provider {provider} ({shown(name + '@' + provider)})"
    if name.count("-") == 1 and name.split("-", 1)[0] == namespace:
        return None
    first = name.split("-", 1)[0].lower()
    if name.count("-") == 0 or first != namespace:
        return f"a Traefik object of another namespace ({shown(name + '@' + provider)})"
    return (
        f"a Traefik object that may be another namespace's ({shown(name + '@' + provider)}: "
        "namespace and name joined by '-' are ambiguous when either holds one)"
    )


def _host_of(token: str) -> str | None:
    if "://" in token:
        try:
            return urllib.parse.urlsplit(token).hostname
        except ValueError:
            return None
    host = token.split("/", 1)[0]
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


# What C's inet_aton, and the resolvers built on it, read as an IPv4 address: one to four
# numbers, decimal, octal or hexadecimal (127.1, 2130706433 and 0x7f.0.0.1 are 127.0.0.1;
# 169.254.43518 is 169.254.169.254).
_SHORTHAND_IPV4 = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}")


# Clouds' metadata services that are neither loopback nor link-local (AWS's over IPv6, on Nitro
# instances; Alibaba Cloud's), and the names their resolvers give them (GCE's, AWS's, Tencent
# Cloud's). A bare ``metadata`` (GCE's resolvers add the rest) counts in a URL only.
_METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200")
)
_METADATA_NAMES = frozenset(
    {
        "metadata.google.internal",
        "metadata.goog",
        "instance-data",
        "instance-data.ec2.internal",
        "metadata.tencentyun.com",
    }
)


def _address(name: str, shorthand: bool) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``name`` is, if it is one; with ``shorthand``, in the forms of
    :data:`_SHORTHAND_IPV4` too (not for a bare number, which an annotation's value often is)."""
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        pass
    if not shorthand or not _SHORTHAND_IPV4.fullmatch(name):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except OSError:
        return None


def _host_outside(host: str, namespace: str, in_url: bool = False) -> str | None:
    """What a host name or address names outside ``namespace``: a Service or pod of another
    namespace by its cluster DNS name (``<name>.<namespace>.svc[.<domain>]``), or the target's
    own node or its cloud's metadata service (loopback, link-local, unspecified addresses, also
    written short, as resolvers read them, in a URL or with a dot: ``http://127.1/``; the
    metadata services of clouds that are neither, and their names: ``http://[fd00:ec2::254]/``,
    ``http://metadata.google.internal/``)."""
    name = host.lower().removesuffix(".")
    labels = name.split(".")
    for i, label in enumerate(labels):
        if i >= 2 and label in _CLUSTER_DNS and labels[i - 1] != namespace:
            return f"namespace {shown(labels[i - 1])} ({shown(name)})"
    if name == "localhost" or name.endswith(".localhost"):
        return f"the target's own node ({name})"
    if name in _METADATA_NAMES or (in_url and name == "metadata"):
        return f"the target's own node or its cloud's metadata service ({shown(name)})"
    address = _address(name, in_url or "." in name)
    if address is None:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if (
        address.is_loopback
        or address.is_link_local
        or address.is_unspecified
        or address in _METADATA_ADDRESSES
    ):
        return f"the target's own node or its cloud's metadata service ({address})"
    return None


def outside_references(value: str, namespace: str) -> list[str]:
    """What an annotation's ``value`` names outside ``namespace``, as said in events (sorted;
    empty: nothing). The forms that ingress controllers read as references to objects of a
    namespace, or that reach out of it:

    - ``<namespace>/<name>`` (ingress-nginx's auth-secret, auth-tls-secret, proxy-ssl-secret,
      custom-headers, auth-proxy-set-headers; HAProxy's ssl-certificate, client-ca,
      server-ca...): a value, or an item of a comma-separated list, that starts with a
      namespace's name and ``/``, in any case;
    - Traefik's ``<namespace>-<name>@kubernetescrd`` and ``<name>@<provider>``
      (router.middlewares, router.tls.options...): see :func:`_provider_reference`;
    - cluster DNS names of Services and pods of another namespace, alone or in URLs
      (``http://auth.kube-system.svc.cluster.local/``, upstream-vhost), and the target's own
      node or metadata service by address (``http://169.254.169.254/``).

    A value that merely looks like one of these (``text/html``) is refused too: a false alarm
    costs a Warning, a missed reference another tenant's objects."""
    found = set()
    for item in value.split(","):
        match = _NAMESPACE_SLASH.match(item.strip())
        if match and match.group(1).lower() != namespace:
            found.add(f"namespace {shown(match.group(1).lower())}")
    for token in _TOKENS.split(value):
        if not token:
            continue
        reference = _PROVIDER_REFERENCE.fullmatch(token)
        if reference:
            said = _provider_reference(reference.group(1), reference.group(2), namespace)
            if said:
                found.add(said)
            continue
        host = _host_of(token)
        said = _host_outside(host, namespace, "://" in token) if host else None
        if said:
            found.add(said)
    return sorted(found)


# -- refusals ------------------------------------------------------------------------------------


# ingress-nginx's annotation (under whatever prefix it is configured with) that makes an Ingress
# answer for more hosts: a comma-separated list of names, wildcards or regular expressions.
SERVER_ALIAS = "/server-alias"


def ingress_hosts(ingress: dict) -> list[str | None]:
    """The hosts an Ingress routes (None: every host): each rule's ``host`` (a rule without one
    takes every host), each TLS entry's ``hosts`` (an entry without any: the controller's
    default, every host), the default backend (every host no rule matches), and the names of
    ingress-nginx's ``server-alias`` annotation."""
    spec = ingress.get("spec")
    hosts: list[str | None] = []
    for key, value in (ingress["metadata"].get("annotations") or {}).items():
        if key.endswith(SERVER_ALIAS) and isinstance(value, str):
            hosts.extend(name for name in _TOKENS.split(value) if name)
    for rule in _items(spec, "rules"):
        host = _field(rule, "host")
        hosts.append(host if isinstance(host, str) and host else None)
    for entry in _items(spec, "tls"):
        names = _items(entry, "hosts")
        hosts.extend(h if isinstance(h, str) and h else None for h in names)
        if not names:
            hosts.append(None)
    if _field(spec, "defaultBackend") is not None:
        hosts.append(None)
    return hosts


def ingress_classes(ingress: dict) -> dict[str, str]:
    """Where the Ingress names its class, and which: ``spec.ingressClassName``, and the older
    annotation ``kubernetes.io/ingress.class``."""
    found = {}
    spec_class = _field(ingress.get("spec"), "ingressClassName")
    if isinstance(spec_class, str):
        found["spec.ingressClassName"] = spec_class
    annotated = (ingress["metadata"].get("annotations") or {}).get(CLASS_ANNOTATION)
    if isinstance(annotated, str):
        found[f"annotation {CLASS_ANNOTATION}"] = annotated
    return found


def _annotation_refusals(ingress: dict, policy: IngressPolicy) -> list[Refusal]:
    meta = ingress["metadata"]
    namespace = meta.get("namespace") or ""
    refusals = []
    for key, value in (meta.get("annotations") or {}).items():
        if key in LOCAL_ANNOTATIONS or key == CLASS_ANNOTATION or key.startswith(keys.PREFIX):
            continue  # never copied; the class policy's; the product's own
        subject = shown(key)
        if policy.annotation_blocked(key):
            refusals.append(Refusal(ANNOTATION_REFUSED, BLOCKED, subject))
        elif not policy.annotation_allowed(key):
            refusals.append(Refusal(ANNOTATION_REFUSED, NOT_ALLOWED, subject))
        elif isinstance(value, str):
            refusals.extend(
                Refusal(ANNOTATION_REFUSED, OUTSIDE, f"{subject} names {said}")
                for said in outside_references(value, namespace)
            )
    return refusals


def _class_refusals(ingress: dict, policy: IngressPolicy) -> list[Refusal]:
    if policy.class_policy is not ClassPolicy.REFUSE:
        return []
    return [
        Refusal(CLASS_REFUSED, CLASS, f"{shown(name) if name else '(empty)'} ({where})")
        for where, name in ingress_classes(ingress).items()
        if name != policy.ingress_class
    ]


def _host_refusals(ingress: dict, policy: IngressPolicy) -> list[Refusal]:
    refused = {h for h in ingress_hosts(ingress) if not policy.host_allowed(h)}
    return [
        Refusal(HOST_REFUSED, HOSTS, shown(h) if h is not None else "(none: every host)")
        for h in refused
    ]


def refusals(ingress: dict, policy: IngressPolicy) -> list[Refusal]:
    """Why ``ingress`` may not be copied under ``policy`` (sorted; empty: it may). It is copied
    whole or not at all: a copy without an annotation the operator does not allow could route
    without the protection its original has (an allow list of addresses, authentication), so
    any annotation refused refuses the Ingress, and so does a class or a host.

    Annotations: the product's own (``multicluster.admiralty.io/``), the class annotation (the
    class policy's) and those a cluster writes about its own Ingress (:data:`LOCAL_ANNOTATIONS`,
    never copied) pass; any other must be allowed, not refused, and its value must name nothing
    outside the Ingress's namespace (:func:`outside_references`). Class: with the policy
    ``refuse``, any class but the one allowed, in the field or the annotation. Hosts: each of
    :func:`ingress_hosts` must be allowed."""
    return sorted(
        {
            *_annotation_refusals(ingress, policy),
            *_class_refusals(ingress, policy),
            *_host_refusals(ingress, policy),
        }
    )


def _listed(subjects: list[str]) -> str:
    return ", ".join(subjects)


def refusal_messages(found: Iterable[Refusal], policy: IngressPolicy) -> list[tuple[str, str]]:
    """The Warning events that say why an Ingress is not copied: (reason, message), one per
    rule that refused, each naming what it refused and the chart value (and agent flag) that
    would allow it."""
    by_rule: dict[tuple[str, str], list[str]] = {}
    for refusal in sorted(found):
        by_rule.setdefault((refusal.reason, refusal.rule), []).append(refusal.subject)
    messages = []
    for (reason, rule), subjects in by_rule.items():
        what = _listed(subjects)
        if rule == NOT_ALLOWED:
            said = (
                f"annotation {what}: not in chart value ingresses.allowedAnnotations (agent flag "
                "--ingress-allowed-annotation); a copy carries every annotation of its original "
                "or is not made"
            )
        elif rule == BLOCKED:
            said = (
                f"annotation {what}: refused by chart value ingresses.refusedAnnotations (agent "
                "flag --ingress-refused-annotations), even where ingresses.allowedAnnotations "
                "allows it"
            )
        elif rule == OUTSIDE:
            said = (
                f"annotation {what}: the ingress controllers of target clusters would read "
                "there for an Ingress of this namespace (no chart value allows that: name this "
                "namespace's objects only)"
            )
        elif rule == CLASS:
            only = (
                f"only class {policy.ingress_class} or none is"
                if policy.ingress_class
                else "no class is"
            )
            said = (
                f"ingress class {what}: {only} copied (chart value "
                "ingresses.ingressClass: policy refuse; set its name to the class allowed, or "
                "policy rewrite or keep; agent flags --ingress-class-policy, --ingress-class)"
            )
        else:
            said = (
                f"host {what}: not in chart value ingresses.allowedHosts (agent flag "
                "--ingress-allowed-host)"
            )
        messages.append((reason, f"not copied to targets: {said}"))
    return messages


# -- copies --------------------------------------------------------------------------------


def desired_copy(ingress: dict, cluster_name: str, ingress_class: str | None = None) -> dict:
    """The copy of ``ingress`` to keep in a target: same name, namespace and spec, its labels and
    annotations (but the cluster's own, :data:`LOCAL_ANNOTATIONS`) plus parent references,
    ``parent-uid``, ``is-delegate``, ``global`` and :data:`MANAGED_KEYS`, which lists all of
    these keys and every field of the spec. The status is the target's. With ``ingress_class``
    (the class policy ``rewrite``), the copy's ``spec.ingressClassName`` is that class and the
    class annotation is left out (the API refuses both on one Ingress).

    Only an Ingress without :func:`refusals` is copied: the copy is its original, whole."""
    labels, annotations = copy_metadata(ingress, cluster_name, local_annotations=LOCAL_ANNOTATIONS)
    annotations.update(MARKS)
    spec = _copy.deepcopy(ingress.get("spec") or {})
    if ingress_class is not None:
        spec["ingressClassName"] = ingress_class
        annotations.pop(CLASS_ANNOTATION, None)
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


@dataclass(frozen=True)
class IngressCopyRules:
    """The rules of Ingress copies under an operator's ``policy`` (a
    :class:`..services.copies.CopyRules`): the copy as :func:`desired_copy` makes it, with the
    class the policy rewrites."""

    policy: IngressPolicy
    MARKS = MARKS

    def desired_copy(self, original: dict, cluster_name: str) -> dict:
        return desired_copy(original, cluster_name, self.policy.rewritten_class)

    def copy_differs(self, desired: dict, existing: dict) -> bool:
        return copy_differs(desired, existing)

    def copy_update(self, desired: dict, existing: dict) -> dict:
        return copy_update(desired, existing)

    def must_recreate(self, desired: dict, existing: dict) -> bool:
        return must_recreate(desired, existing)
