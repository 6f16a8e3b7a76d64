"""What a Source or ClusterSource should have made, and what to do about what exists.

Pure functions, so every decision is tested without a cluster: the service account and the
bindings a source asks for (names as the user guide gives them, with a hash when joining the
parts could make two sources' names collide), the labels that say whose
they are, whether an existing binding is kept, updated, recreated (its roleRef is immutable)
or left alone because we did not make it, and the owner references that let several sources
share one service account we made.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from enum import StrEnum

from multicluster import Resource
from multicluster.resources import CLUSTER_ROLE_BINDINGS, ROLE_BINDINGS, SERVICEACCOUNTS

from ..api import keys
from ..api.conditions import ready_condition as ready_condition
from ..api.naming import HASH_LENGTH, unique_name
from ..api.resources import CLUSTER_SOURCES, SOURCES

RBAC_GROUP = "rbac.authorization.k8s.io"
# Kubernetes' rules for service account names (RFC 1123 subdomains) and namespaces (labels).
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
DNS_LABEL = re.compile(_DNS_LABEL)


class NoSubject(ValueError):
    """The source names neither a service account nor a user: there is nobody to bind."""


class InvalidSubject(ValueError):
    """The service account a source names cannot exist (its name or namespace is invalid):
    never put in an API path, where ``..`` or ``/`` would address something else."""


@dataclass(frozen=True)
class Binding:
    """A RoleBinding or ClusterRoleBinding to create or keep: its resource and whole body."""

    resource: Resource
    body: dict

    @property
    def name(self) -> str:
        return self.body["metadata"]["name"]

    @property
    def namespace(self) -> str | None:
        return self.body["metadata"].get("namespace")

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.resource.kind} {where}{self.name}"


class Action(StrEnum):
    CREATE = "create"
    KEEP = "keep"
    UPDATE = "update"  # subjects, labels or owner references drifted
    RECREATE = "recreate"  # roleRef drifted: it is immutable
    FOREIGN = "foreign"  # same name, not ours: never overwritten
    BOUND_BY_OTHERS = "bound-by-others"  # not ours, but grants exactly this: left as it is
    WAIT = "wait"  # ours, being deleted


def resource_of(source: dict) -> Resource:
    return SOURCES if source["metadata"].get("namespace") else CLUSTER_SOURCES


def owner_labels(source: dict) -> dict[str, str]:
    """Labels on everything made for ``source`` (label values: long names are hashed)."""
    meta = source["metadata"]
    name = unique_name([meta["name"]])
    if meta.get("namespace"):
        return {keys.SOURCE_NAMESPACE_LABEL: meta["namespace"], keys.SOURCE_NAME_LABEL: name}
    return {keys.CLUSTER_SOURCE_NAME_LABEL: name}


def owner_key(labels: dict | None) -> str | None:
    """Who a labeled object was made for, as ``Source/<ns>/<name>`` or ``ClusterSource/<name>``
    (with the label's form of the name); None when it carries no owner labels."""
    labels = labels or {}
    if keys.SOURCE_NAME_LABEL in labels:
        namespace = labels.get(keys.SOURCE_NAMESPACE_LABEL, "")
        return f"Source/{namespace}/{labels[keys.SOURCE_NAME_LABEL]}"
    if keys.CLUSTER_SOURCE_NAME_LABEL in labels:
        return f"ClusterSource/{labels[keys.CLUSTER_SOURCE_NAME_LABEL]}"
    return None


def source_key(source: dict) -> str:
    """The owner key of a source itself (what :func:`owner_key` gives for its children)."""
    key = owner_key(owner_labels(source))
    assert key is not None
    return key


def is_ours(obj: dict, source: dict) -> bool:
    labels = obj["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in owner_labels(source).items())


def made_by_us(obj: dict) -> bool:
    """Made by the source controller (for any source): it carries owner labels."""
    return owner_key(obj["metadata"].get("labels")) is not None


def owner_reference(source: dict, *, controller: bool = True) -> dict:
    resource = resource_of(source)
    meta = source["metadata"]
    ref = {
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "name": meta["name"],
        "uid": meta["uid"],
    }
    if controller:
        ref["controller"] = True
    return ref


def is_owned_by(obj: dict, source: dict) -> bool:
    uid = source["metadata"]["uid"]
    return any(r.get("uid") == uid for r in obj["metadata"].get("ownerReferences") or ())


def service_account_of(source: dict) -> tuple[str, str] | None:
    """(namespace, name) of the service account a source names, if any."""
    spec = source.get("spec") or {}
    namespace = source["metadata"].get("namespace")
    if namespace:
        name = spec.get("serviceAccountName")
        return (namespace, name) if name else None
    ref = spec.get("serviceAccount") or {}
    if ref.get("name") and ref.get("namespace"):
        return ref["namespace"], ref["name"]
    return None


def service_account_key(source: dict) -> list[str]:
    """Index values: ``namespace/name`` of the source's service account (none or one)."""
    account = service_account_of(source)
    return [f"{account[0]}/{account[1]}"] if account else []


def subjects(source: dict) -> list[dict]:
    """The service account and/or the user; raises :class:`NoSubject` when neither is given,
    :class:`InvalidSubject` when the service account cannot exist."""
    found = []
    account = service_account_of(source)
    if account:
        _check_service_account(source, *account)
        found.append({"kind": "ServiceAccount", "name": account[1], "namespace": account[0]})
    user = (source.get("spec") or {}).get("userName")
    if user:
        _check_user(source, user)
        found.append({"kind": "User", "apiGroup": RBAC_GROUP, "name": user})
    if not found:
        field = "serviceAccountName" if resource_of(source) is SOURCES else "serviceAccount"
        raise NoSubject(f"set spec.{field} or spec.userName: there is nobody to bind")
    return found


def _check_user(source: dict, user: object) -> None:
    """A user a source may name: not one of Kubernetes' own (``system:anonymous`` would grant
    everyone, unauthenticated, what the source roles grant, the ClusterSummary cluster-wide
    included), but for a service account written as a user: of the Source's own namespace (of
    any, for a ClusterSource)."""
    if not isinstance(user, str):
        raise InvalidSubject(f"spec.userName {user!r} is not a user name")
    if not user.startswith("system:"):
        return
    namespace = source["metadata"].get("namespace")
    parts = user.split(":")
    account = len(parts) == 4 and parts[1] == "serviceaccount" and all(parts[2:])
    if account and (namespace is None or parts[2] == namespace):
        return
    allowed = (
        f"system:serviceaccount:{namespace}:NAME"
        if namespace
        else ("system:serviceaccount:NAMESPACE:NAME")
    )
    raise InvalidSubject(
        f"spec.userName {user!r} is one of Kubernetes' own users: name a user of your own, "
        f"or a service account as {allowed}"
    )


def _check_service_account(source: dict, namespace: str, name: str) -> None:
    namespaced = resource_of(source) is SOURCES
    field = "spec.serviceAccountName" if namespaced else "spec.serviceAccount.name"
    if not isinstance(name, str) or len(name) > 253 or not DNS_SUBDOMAIN.fullmatch(name):
        raise InvalidSubject(
            f"{field} {name!r} is not a valid service account name (a lowercase RFC 1123 "
            "subdomain of at most 253 characters: a-z, 0-9, '-' and '.')"
        )
    if namespaced:
        return  # the Source's own namespace
    if not isinstance(namespace, str) or len(namespace) > 63 or not DNS_LABEL.fullmatch(namespace):
        raise InvalidSubject(
            f"spec.serviceAccount.namespace {namespace!r} is not a valid namespace name (a "
            "lowercase RFC 1123 label of at most 63 characters: a-z, 0-9 and '-')"
        )


def binding_name(head: str, variable: tuple[str, ...], tail: str = "") -> str:
    """``head``, the variable parts and ``tail`` joined with ``-``, as the user guide names
    bindings; when a variable part holds a ``-``, joining could give two sources one name
    (Source ``b-c`` in ``a`` and ``c`` in ``a-b``; ClusterSource ``x-cluster-summary-viewer``
    and the viewer binding of ``x``): then 10 hex digits of SHA-256 of all the parts joined
    with ``/`` (which no part holds) are appended, as virtual node names do. Never cut: RBAC
    names have no length limit (names made before, without the hash, are replaced: the
    controller deletes what it made for a source and no longer wants)."""
    parts = [*head.split("-"), *variable, *([tail] if tail else [])]
    name = "-".join(parts)
    if not any("-" in part for part in variable):
        return name
    digest = hashlib.sha256("/".join(parts).encode()).hexdigest()[:HASH_LENGTH]
    return f"{name}-{digest}"


def binding_names(source: dict) -> tuple[str, str]:
    """Names of the (Cluster)RoleBinding to the source role and of the ClusterRoleBinding to
    the summary viewer role: the user guide's when no part holds a ``-`` (see
    :func:`binding_name`). A Source's RoleBinding lives in its namespace, where no other
    source's binding can take its name: it is never hashed."""
    meta = source["metadata"]
    namespace, name = meta.get("namespace"), meta["name"]
    viewer = "cluster-summary-viewer"
    if namespace:
        return (
            f"admiralty-source-{name}",
            binding_name("admiralty-source", (namespace, name), viewer),
        )
    return (
        binding_name("admiralty-clustersource", (name,)),
        binding_name("admiralty-clustersource", (name,), viewer),
    )


def desired_bindings(source: dict) -> list[Binding]:
    """A Source: a RoleBinding in its namespace, owned by it, and a ClusterRoleBinding without
    owner (a cluster-scoped object may not be owned by a namespaced one; a finalizer cleans it
    up). A ClusterSource: two ClusterRoleBindings it owns."""
    who = subjects(source)
    labels = owner_labels(source)
    namespace = source["metadata"].get("namespace")
    source_role, viewer = binding_names(source)

    def body(
        resource: Resource, name: str, role: str, owned: bool, where: str | None = None
    ) -> Binding:
        meta: dict = {"name": name, "labels": dict(labels)}
        if where:
            meta["namespace"] = where
        if owned:
            meta["ownerReferences"] = [owner_reference(source)]
        return Binding(
            resource,
            {
                "apiVersion": resource.api_version,
                "kind": resource.kind,
                "metadata": meta,
                "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": role},
                "subjects": [dict(s) for s in who],
            },
        )

    if namespace:
        return [
            body(ROLE_BINDINGS, source_role, keys.SOURCE_CLUSTER_ROLE, True, namespace),
            body(CLUSTER_ROLE_BINDINGS, viewer, keys.CLUSTER_SUMMARY_VIEWER_CLUSTER_ROLE, False),
        ]
    return [
        body(CLUSTER_ROLE_BINDINGS, source_role, keys.SOURCE_CLUSTER_ROLE, True),
        body(CLUSTER_ROLE_BINDINGS, viewer, keys.CLUSTER_SUMMARY_VIEWER_CLUSTER_ROLE, True),
    ]


def desired_service_account(source: dict) -> dict | None:
    """The service account to create if missing, owned by the source (allowed both ways: same
    namespace for a Source, cluster-scoped owner for a ClusterSource). Other sources may name
    it too: each is one more owner, none is its controller (see :func:`share_patch`)."""
    account = service_account_of(source)
    if account is None:
        return None
    return {
        "apiVersion": SERVICEACCOUNTS.api_version,
        "kind": SERVICEACCOUNTS.kind,
        "metadata": {
            "name": account[1],
            "namespace": account[0],
            "labels": owner_labels(source),
            "ownerReferences": [owner_reference(source, controller=False)],
        },
    }


def share_patch(account: dict, source: dict) -> dict | None:
    """Merge patch that adds ``source`` as one more owner of a service account we made (for
    this source or another), so that it lives as long as any source naming it does; None when
    there is nothing to add, or when the account is not ours (never owned, never deleted).
    Conditional on resourceVersion: a concurrent change of the list is a conflict."""
    if not made_by_us(account) or is_owned_by(account, source):
        return None
    meta = account["metadata"]
    refs = [*(meta.get("ownerReferences") or ()), owner_reference(source, controller=False)]
    return {"metadata": {"ownerReferences": refs, "resourceVersion": meta["resourceVersion"]}}


def unshare_patch(account: dict, source: dict) -> dict | None:
    """Merge patch that removes ``source`` from the owners of a service account it no longer
    names (conditional on resourceVersion); None when it is not an owner. A patch that leaves
    no owner at all: see :func:`orphaned_by`."""
    if not is_owned_by(account, source):
        return None
    meta = account["metadata"]
    uid = source["metadata"]["uid"]
    refs = [r for r in meta.get("ownerReferences") or () if r.get("uid") != uid]
    return {"metadata": {"ownerReferences": refs, "resourceVersion": meta["resourceVersion"]}}


def orphaned_by(account: dict, source: dict) -> bool:
    """``source`` is the last owner of a service account we made: without it, garbage
    collection would never delete the account."""
    refs = account["metadata"].get("ownerReferences") or ()
    uid = source["metadata"]["uid"]
    return made_by_us(account) and bool(refs) and all(r.get("uid") == uid for r in refs)


def _subject_key(subject: dict) -> tuple[str, str, str, str]:
    kind = subject.get("kind") or ""
    group = subject.get("apiGroup") or ("" if kind == "ServiceAccount" else RBAC_GROUP)
    return kind, group, subject.get("name") or "", subject.get("namespace") or ""


def same_subjects(a: list[dict] | None, b: list[dict] | None) -> bool:
    """Equal as the API server means them (defaulted apiGroup, any order)."""
    return sorted(map(_subject_key, a or ())) == sorted(map(_subject_key, b or ()))


def _owner_refs_current(existing: dict, desired: dict) -> bool:
    have = {
        (r.get("kind"), r.get("uid")) for r in existing["metadata"].get("ownerReferences") or ()
    }
    want = desired["metadata"].get("ownerReferences") or ()
    return all((r["kind"], r["uid"]) in have for r in want)


def grants_the_same(existing: dict, desired: Binding) -> bool:
    """Same roleRef and subjects (e.g. a binding made by hand as the user guide shows)."""
    return existing.get("roleRef") == desired.body["roleRef"] and same_subjects(
        existing.get("subjects"), desired.body["subjects"]
    )


def binding_action(existing: dict | None, desired: Binding, source: dict) -> Action:
    if existing is None:
        return Action.CREATE
    if not is_ours(existing, source):
        if grants_the_same(existing, desired) and not existing["metadata"].get("deletionTimestamp"):
            return Action.BOUND_BY_OTHERS
        return Action.FOREIGN
    if existing["metadata"].get("deletionTimestamp"):
        return Action.WAIT
    if existing.get("roleRef") != desired.body["roleRef"]:
        return Action.RECREATE
    if not same_subjects(existing.get("subjects"), desired.body["subjects"]):
        return Action.UPDATE
    if not _owner_refs_current(existing, desired.body):
        return Action.UPDATE
    return Action.KEEP


def binding_patch(existing: dict, desired: Binding) -> dict:
    """Merge patch that brings an existing binding of ours back to ``desired`` (roleRef aside).
    Owner references to the same kind and name with another uid (a source deleted and created
    again) are replaced; others are kept. Conditional on resourceVersion: the owner list is
    replaced as a whole, so a concurrent change of it must be a conflict, not lost."""
    patch: dict = {"subjects": desired.body["subjects"]}
    meta: dict = {
        "labels": desired.body["metadata"]["labels"],
        "resourceVersion": existing["metadata"]["resourceVersion"],
    }
    wanted = desired.body["metadata"].get("ownerReferences")
    if wanted:
        replaced = {(r["kind"], r["name"]) for r in wanted}
        kept = [
            r
            for r in existing["metadata"].get("ownerReferences") or ()
            if (r.get("kind"), r.get("name")) not in replaced
        ]
        meta["ownerReferences"] = [*kept, *wanted]
    patch["metadata"] = meta
    return patch


def condition_changed(old: dict | None, new: dict) -> bool:
    return old is None or any(
        old.get(k) != new[k] for k in ("status", "reason", "message", "observedGeneration")
    )


def bound_message(source: dict) -> str:
    who = ", ".join(
        f"{s['kind']} {s['namespace'] + '/' if s.get('namespace') else ''}{s['name']}"
        for s in subjects(source)
    )
    namespace = source["metadata"].get("namespace")
    scope = f"in namespace {namespace}" if namespace else "in every namespace"
    return (
        f"{who} may place pods {scope} ({keys.SOURCE_CLUSTER_ROLE}) and read the "
        f"ClusterSummary ({keys.CLUSTER_SUMMARY_VIEWER_CLUSTER_ROLE})"
    )
