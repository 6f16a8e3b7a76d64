"""An API server in memory, for testing controllers without one (controller-runtime's
``pkg/client/fake`` for :mod:`multicluster`).

A reconciler is best tested through the very client it uses in production. A stand-in written
for each test module drifts from what a server does: it never answers a stale write with a
Conflict, keeps no finalizers, sends no watch events, and tests then pass against behaviour no
server has. :class:`FakeServer` keeps objects as a kube-apiserver does: resourceVersions from one
counter (as etcd's), uid, generation, status apart from the rest, finalizers, graceful deletion
of pods on nodes, label and field selectors, watches with a bounded history and 410 Gone.
:class:`FakeClient` is a :class:`~.client.Client` whose calls it answers (each call an
:class:`Action`, as in client-go's fake), and :class:`FakeCluster` a :class:`~.cluster.Cluster`
over one, whose informers are the real ones. Several clients may share a server (two agents on
one cluster). Test hooks on the server: ``add`` (objects to start from), ``objects``,
``actions`` and ``writes``, reactors (``fail_next``, ``prepend_reactor``), ``drop_watches``,
``compact`` and ``bookmark``.

What is approximated, or not modelled:

- Every resource has a ``status`` subresource: an update or patch of the main resource keeps
  the stored status, one of ``status`` (or ``approval``) changes only the status. ``create``
  keeps a status it is given (the real server resets a pod's), so a test can start from a pod
  that runs. The generation bumps when anything but metadata and status changes, and when a
  deletion starts (``deletionTimestamp`` set, even if the object goes at once). The only
  subresource created is ``pods/binding``.
- Strategic merge patch is a merge patch in which the lists named in :data:`MERGE_KEYS` are
  merged by key (``containers`` by name, ``conditions`` by type, ...), whatever type holds
  them, and ``finalizers`` as a set; ``$patch: delete|replace`` and ``$deleteFromPrimitiveList``
  are honoured, other directives dropped. A custom resource (a group that is not built in)
  refuses it with 415, as the real server does.
- Server-side apply creates a missing object, else merges the applied configuration as a
  strategic merge patch, and records its manager in ``managedFields`` (operation ``Apply``,
  fields as ``f:`` keys, lists whole). Fields a manager stops applying are not removed,
  conflicts between managers are not detected (``force`` is ignored), and other writes record
  no manager.
- No garbage collector, admission or validation: ``ownerReferences`` and the propagation
  policy are not followed, namespaces need not exist, fields are not checked.
- A list is one snapshot, cut into pages. A watch ignores ``idle_timeout``; bookmarks come
  only when a test calls ``bookmark``.
"""

from __future__ import annotations

import asyncio
import builtins
import datetime as dt
import random
import re
import uuid
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any, Unpack

import orjson
import yaml

from .client import (
    PAGE_LIMIT,
    PATCH_CONTENT_TYPES,
    WATCH_TIMEOUT,
    Call,
    Client,
    ListOptions,
    PatchType,
    RequestOptions,
    WatchOptions,
)
from .cluster import Cluster
from .config import ClusterConfig
from .errors import ApiError, error_for
from .kubetime import format_time
from .readlimits import CacheBudget
from .resources import PODS, Resource

__all__ = [
    "MERGE_KEYS",
    "Action",
    "FakeClient",
    "FakeCluster",
    "FakeServer",
    "Reactor",
    "merge_patch",
]

ADDED, MODIFIED, DELETED, BOOKMARK = "ADDED", "MODIFIED", "DELETED", "BOOKMARK"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})
MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "volumes": ("name",),
    "env": ("name",),
    "imagePullSecrets": ("name",),
    "volumeMounts": ("mountPath",),
    "ports": ("containerPort", "port"),
    "conditions": ("type",),
    "addresses": ("type",),
    "ownerReferences": ("uid",),
}
"""Strategic merge: the lists merged by key, by field name (the first key the items have)."""

_METHODS = {"get": "GET", "list": "GET", "watch": "WATCH", "create": "POST", "update": "PUT"}
_REASONS = {
    400: "BadRequest",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
}
_NOWHERE = "https://fake.invalid"  # the address of a FakeClient's config: it never connects
_SUFFIX = "bcdfghjklmnpqrstvwxz2456789"  # generateName's alphabet, as the apiserver's
_BUILT_IN_GROUPS = frozenset({"", "apps", "batch", "policy", "autoscaling", "extensions"})
_SERVER_FIELDS = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "resourceVersion",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
)
"""Metadata a write keeps as stored, whatever its body says."""
_STALE = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
_SUCCESS = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
_NO_SUCH_SUBRESOURCE = "the server could not find the requested resource"
_OTHER_NAMESPACE = (
    "the namespace of the provided object does not match the namespace sent on the request"
)
_NO_NEW_FINALIZERS = (
    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"
)

Key = tuple[Resource, str, str]  # resource, namespace ("" when cluster-scoped), name


def _copy(obj: Any) -> Any:
    """A deep copy, through JSON: nothing a caller holds is the store's, nor the other way."""
    return orjson.loads(orjson.dumps(obj))


def _key(resource: Resource, namespace: str | None, name: str | None) -> Key:
    return resource, (namespace or "") if resource.namespaced else "", name or ""


def _set(mapping: dict, key: str, value: Any) -> None:
    if value is None:
        mapping.pop(key, None)
    else:
        mapping[key] = value


# -- calls and reactors ---------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One call to the server (client-go's Action): what reactors see and tests count."""

    verb: str
    resource: Resource
    namespace: str | None
    name: str | None
    subresource: str | None = None
    client: str = ""

    @property
    def context(self) -> str:
        """How the real client names this call in its errors."""
        method = _METHODS.get(self.verb, self.verb.upper())
        path = self.resource.path(self.namespace, self.name, self.subresource)
        return f"{method} {path} on {self.client}"

    def error(self, status: int, message: str, reason: str = "") -> ApiError:
        """The error the real client raises for a Status with this code and message."""
        details = {"name": self.name or "", "group": self.resource.group}
        body = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason or _REASONS.get(status, ""),
            "details": {**details, "kind": self.resource.plural},
            "code": status,
        }
        return error_for(status, body, self.context)

    def not_found(self) -> ApiError:
        return self.error(404, f'{self.resource} "{self.name}" not found')

    def conflict(self, why: str) -> ApiError:
        on = f'{self.resource} "{self.name}"'
        return self.error(409, f"Operation cannot be fulfilled on {on}: {why}")


Reaction = Callable[[Action], ApiError | None]
"""Called before the server answers; an error it returns is raised instead of the answer."""


@dataclass(eq=False)
class Reactor:
    """A reaction to calls of ``verb`` (``*``: any) on ``resource`` (None: any), ``times``
    times (None: always)."""

    verb: str
    resource: Resource | None
    reaction: Reaction
    times: int | None = None

    def applies(self, action: Action) -> bool:
        return self.verb in ("*", action.verb) and self.resource in (None, action.resource)


# -- selectors ------------------------------------------------------------------------------

_LABEL = r"[^\s=!(),]+"
_SET_RULE = re.compile(rf"\s*({_LABEL})\s+(in|notin)\s*\(([^()]*)\)\s*")
_EQUALS_RULE = re.compile(rf"\s*({_LABEL})\s*(==|=|!=)\s*({_LABEL}|)\s*")
_EXISTS_RULE = re.compile(rf"\s*(!?)\s*({_LABEL})\s*")
_FIELD_RULE = re.compile(r"\s*([\w./-]+)\s*(==|=|!=)\s*([^,]*?)\s*")
Requirement = tuple[str, str, frozenset[str]]  # key, "in" | "notin" | "exists" | "!", values


def _label_requirements(text: str) -> list[Requirement]:
    """A label selector (``a=b,c!=d,e in (f,g),h,!i``) parsed; ValueError if malformed."""
    requirements: list[Requirement] = []
    for part in re.split(r",(?![^()]*\))", text):  # commas outside parentheses
        if rule := _SET_RULE.fullmatch(part):
            values = frozenset(v.strip() for v in rule[3].split(",") if v.strip())
            requirements.append((rule[1], rule[2], values))
        elif rule := _EQUALS_RULE.fullmatch(part):
            requirements.append(
                (rule[1], "notin" if rule[2] == "!=" else "in", frozenset([rule[3]]))
            )
        elif rule := _EXISTS_RULE.fullmatch(part):
            requirements.append((rule[2], "!" if rule[1] else "exists", frozenset()))
        elif part.strip():
            raise ValueError(f"unable to parse requirement: {part.strip()!r}")
    return requirements


def _labels_match(requirements: list[Requirement], labels: dict) -> bool:
    for key, op, values in requirements:
        present = key in labels
        if (op == "exists" and not present) or (op == "!" and present):
            return False
        if op == "in" and (not present or labels[key] not in values):
            return False
        if op == "notin" and present and labels[key] in values:
            return False
    return True


def _field_value(obj: dict, path: str) -> str:
    """A field as a field selector sees it: absent is empty, booleans are lower case."""
    value: Any = obj
    for step in path.split("."):
        value = value.get(step) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


@dataclass(frozen=True)
class _Filter:
    """What a list or a watch selects: a namespace (None: all), labels and fields."""

    namespace: str | None
    labels: list[Requirement]
    fields: list[tuple[str, bool, str]]  # path, equal (else not equal), value

    @classmethod
    def parse(cls, namespace: str | None, labels: str | None, fields: str | None) -> _Filter:
        rules = []
        for part in filter(str.strip, (fields or "").split(",")):
            rule = _FIELD_RULE.fullmatch(part)
            if rule is None:
                raise ValueError(f"invalid field selector: {part.strip()!r}")
            rules.append((rule[1], rule[2] != "!=", rule[3]))
        return cls(namespace, _label_requirements(labels or ""), rules)

    def matches(self, obj: dict) -> bool:
        meta = obj["metadata"]
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        if not _labels_match(self.labels, meta.get("labels") or {}):
            return False
        return all(
            (_field_value(obj, path) == value) == equal for path, equal, value in self.fields
        )


# -- patches --------------------------------------------------------------------------------


class _PatchFailed(Exception):
    """A patch that cannot be applied; ``status`` is the server's answer (400, 415 or 422)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies it: maps merged, ``null`` deletes,
    anything else replaces (also for tests that check a patch without a server)."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _strategic_merge(target: Any, patch: Any) -> Any:
    """A merge patch with the strategic directives modelled (see the module's docstring)."""
    if not isinstance(patch, dict):
        return patch
    if patch.get("$patch") == "replace":
        return _strategic_merge({}, {k: v for k, v in patch.items() if k != "$patch"})
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            field = key.partition("/")[2]
            result[field] = [v for v in result.get(field) or () if v not in value]
        elif key.startswith("$"):
            continue
        elif value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, list) and isinstance(result.get(key), list):
            result[key] = _merge_list(key, result[key], value)
        else:
            result[key] = _strategic_merge(result.get(key), value)
    return result


def _merge_list(field: str, current: list, patch: list) -> list:
    if field == "finalizers":
        return current + [v for v in patch if v not in current]
    items = [item for item in patch if isinstance(item, dict)]
    key = next((k for k in MERGE_KEYS.get(field, ()) if any(k in i for i in items)), None)
    if key is None:  # a list without a merge key is replaced
        return [_strategic_merge({}, v) if isinstance(v, dict) else v for v in patch]
    merged = list(current)
    for item in items:
        at = next((i for i, old in enumerate(merged) if _same_key(old, item, key)), None)
        if item.get("$patch") == "delete":
            merged = merged if at is None else merged[:at] + merged[at + 1 :]
        elif at is None:
            merged.append(_strategic_merge({}, item))
        else:
            merged[at] = _strategic_merge(merged[at], item)
    return merged


def _same_key(old: Any, new: dict, key: str) -> bool:
    return isinstance(old, dict) and old.get(key) == new.get(key)


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise _PatchFailed(400, f"invalid JSON pointer: {path!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]


def _at(doc: Any, tokens: list[str], path: str) -> Any:
    for token in tokens:
        if isinstance(doc, dict) and token in doc:
            doc = doc[token]
        elif isinstance(doc, list) and token.isdigit() and int(token) < len(doc):
            doc = doc[int(token)]
        else:
            raise _PatchFailed(422, f"doc is missing path: {path}: missing value")
    return doc


def _add(doc: Any, path: str, value: Any, replace: bool = False) -> Any:
    """``doc`` with ``value`` added at ``path`` (or replacing what is there)."""
    tokens = _pointer(path)
    if not tokens:
        return value
    parent, last = _at(doc, tokens[:-1], path), tokens[-1]
    if isinstance(parent, dict) and (last in parent or not replace):
        parent[last] = value
    elif isinstance(parent, list) and last == "-" and not replace:
        parent.append(value)
    elif isinstance(parent, list) and last.isdigit() and int(last) <= len(parent) - replace:
        parent[int(last) : int(last) + replace] = [value]  # inserted, or in place of one
    else:
        raise _PatchFailed(422, f"doc is missing path: {path}: missing value")
    return doc


def _remove(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise _PatchFailed(422, "the whole document cannot be removed")
    parent = _at(doc, tokens[:-1], path)
    _at(parent, tokens[-1:], path)  # it must be there
    del parent[int(tokens[-1]) if isinstance(parent, list) else tokens[-1]]
    return doc


def _json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 on ``doc`` (changed in place): add, remove, replace, move, copy and test."""
    if not isinstance(operations, list):
        raise _PatchFailed(400, "a JSON patch is a list of operations")
    for op in operations:
        if not isinstance(op, dict) or not isinstance(op.get("path"), str):
            raise _PatchFailed(400, f"not a JSON patch operation: {orjson.dumps(op).decode()}")
        kind, path = op.get("op"), op["path"]
        if kind == "test":
            if _at(doc, _pointer(path), path) != op.get("value"):
                raise _PatchFailed(422, f"testing value {path} failed: test failed")
        elif kind in ("add", "replace") and "value" in op:
            doc = _add(doc, path, _copy(op["value"]), replace=kind == "replace")
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind in ("move", "copy") and "from" in op:
            value = _copy(_at(doc, _pointer(op["from"]), op["from"]))
            doc = _add(_remove(doc, op["from"]) if kind == "move" else doc, path, value)
        else:
            raise _PatchFailed(400, f"not a JSON patch operation: {orjson.dumps(op).decode()}")
    return doc


def _decode(patch: Any, patch_type: PatchType) -> Any:
    """A patch as JSON data (an apply patch may be YAML), copied."""
    if not isinstance(patch, bytes | str):
        return _copy(patch)
    try:
        return yaml.safe_load(patch) if patch_type == "apply" else orjson.loads(patch)
    except (yaml.YAMLError, orjson.JSONDecodeError) as e:
        raise _PatchFailed(400, f"error decoding patch: {e}") from None


def _patched(resource: Resource, stored: dict, patch: Any, patch_type: PatchType) -> dict:
    """A copy of ``stored`` with ``patch`` applied."""
    if patch_type == "json":
        result = _json_patch(_copy(stored), patch)
    elif not isinstance(patch, dict):
        raise _PatchFailed(400, f"a {patch_type} patch is an object")
    elif patch_type == "merge":
        result = merge_patch(_copy(stored), patch)
    elif (
        patch_type == "apply"
        or resource.group in _BUILT_IN_GROUPS
        or resource.group.endswith(".k8s.io")
    ):
        result = _strategic_merge(_copy(stored), patch)
    else:
        raise _PatchFailed(415, "strategic merge patch is not supported for custom resources")
    if not isinstance(result, dict):
        raise _PatchFailed(422, "the patched document is not an object")
    return result


def _managed_fields(applied: Any) -> dict:
    """The fields set by an applied configuration, as FieldsV1 (maps only; lists whole)."""
    if not isinstance(applied, dict):
        return {}
    return {f"f:{k}": _managed_fields(v) for k, v in applied.items() if not k.startswith("$")}


def _own(obj: dict, manager: str, action: Action, applied: dict) -> None:
    """Record ``manager`` in ``managedFields`` as the applier of ``applied`` (its entry kept,
    time included, when it applies the same fields again)."""
    identity = ("apiVersion", "kind", "name", "namespace", "resourceVersion", "uid")
    meta = {k: v for k, v in (applied.get("metadata") or {}).items() if k not in identity}
    body = {k: v for k, v in applied.items() if k not in (*identity, "metadata")}
    fields = _managed_fields({**body, "metadata": meta} if meta else body)
    entry: dict[str, Any] = {"manager": manager, "operation": "Apply"}
    entry.update(apiVersion=action.resource.api_version, time=format_time())
    entry.update(fieldsType="FieldsV1", fieldsV1=fields)
    if action.subresource:
        entry["subresource"] = action.subresource
    whose = (manager, "Apply", action.subresource)
    others: list[dict] = []
    mine: list[dict] = []
    for old in obj["metadata"].get("managedFields") or ():
        owner = (old.get("manager"), old.get("operation"), old.get("subresource"))
        (mine if owner == whose else others).append(old)
    if mine and mine[0].get("fieldsV1") == fields:
        entry = mine[0]
    obj["metadata"]["managedFields"] = [*others, entry]


def _applied_object(action: Action, applied: Any, manager: str) -> dict:
    """The object an apply creates."""
    if not isinstance(applied, dict):
        raise _PatchFailed(400, "an applied configuration is an object")
    obj = _strategic_merge({}, applied)
    if obj.setdefault("metadata", {}).setdefault("name", action.name) != action.name:
        raise _PatchFailed(400, "the name of the object does not match the name in the URL")
    _own(obj, manager, action, applied)
    return obj


# -- deletion -------------------------------------------------------------------------------


def _grace(resource: Resource, obj: dict, asked: int | None) -> int:
    """The grace period of a deletion: a pod running on a node ends gracefully (in its
    ``terminationGracePeriodSeconds``, 30 by default); anything else at once."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    if resource != PODS or not spec.get("nodeName"):
        return 0
    if status.get("phase") in ("Succeeded", "Failed"):
        return 0
    if asked is not None:
        return max(asked, 0)
    return int(spec.get("terminationGracePeriodSeconds", 30))


def _released(obj: dict) -> bool:
    """Deleted, with no finalizer left and no grace period to wait: the object goes."""
    meta = obj["metadata"]
    if not meta.get("deletionTimestamp") or meta.get("finalizers"):
        return False
    return not meta.get("deletionGracePeriodSeconds")


def _check_preconditions(action: Action, stored: dict, preconditions: dict) -> None:
    meta = stored["metadata"]
    for field, name in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
        wanted = preconditions.get(field)
        if wanted is not None and wanted != meta.get(field):
            raise action.conflict(
                f"Precondition failed: {name} in precondition: {wanted}, "
                f"{name} in object meta: {meta.get(field)}"
            )


# -- the server -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Event:
    version: int
    resource: Resource
    type: str
    obj: dict
    old: dict | None  # before a MODIFIED or DELETED


class _Watcher:
    """One open watch: what it selects, and the events it has yet to send."""

    def __init__(self, resource: Resource, selected: _Filter, bookmarks: bool) -> None:
        self.resource = resource
        self.selected = selected
        self.bookmarks = bookmarks
        self.queue: asyncio.Queue[dict | None] = asyncio.Queue()  # None: the watch ends

    def view(self, event: _Event) -> dict | None:
        """The event as this watch sees it: an object that stops matching its selectors is
        DELETED to it, one that starts matching ADDED, as the real server filters."""
        if event.resource != self.resource:
            return None
        now = self.selected.matches(event.obj)
        was = event.old is not None and self.selected.matches(event.old)
        if event.type == MODIFIED and was != now:
            return {"type": ADDED if now else DELETED, "object": event.obj}
        if now or (event.type == DELETED and was):
            return {"type": event.type, "object": event.obj}
        return None

    async def events(self, timeout: float | None) -> AsyncGenerator[dict, None]:
        deadline = None if timeout is None else asyncio.get_running_loop().time() + timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    event = await self.queue.get()
            except TimeoutError:
                return
            if event is None:
                return
            yield event


class FakeServer:
    """Objects of any resource, kept and watched as a kube-apiserver does them (see the
    module's docstring for what is approximated). Its verbs answer :class:`Action` s, as a
    :class:`FakeClient` makes them; a test reads and seeds it through its hooks."""

    def __init__(self, *, name: str = "fake", history: int = 1000) -> None:
        self.name = name
        self.history = history
        self.actions: list[Action] = []
        """Every call, reads included, in order (those a reactor failed too)."""
        self._objects: dict[Key, dict] = {}
        self._version = 0
        self._events: deque[_Event] = deque()
        self._compacted = 0  # a watch from an older version is Gone
        self._watchers: set[_Watcher] = set()
        self._reactors: list[Reactor] = []

    # -- test hooks ---------------------------------------------------------------------------

    @property
    def writes(self) -> builtins.list[Action]:
        """The calls that create, update, patch or delete."""
        return [a for a in self.actions if a.verb in WRITE_VERBS]

    def add(self, resource: Resource, *objects: dict) -> builtins.list[dict]:
        """Create objects to start a test from (no reactor, not in :attr:`actions`)."""
        made = []
        for obj in objects:
            meta = obj.get("metadata") or {}
            namespace = meta.get("namespace") if resource.namespaced else None
            action = Action("create", resource, namespace, meta.get("name"), None, self.name)
            made.append(self._create(action, _copy(obj)))
        return made

    def objects(self, resource: Resource, namespace: str | None = None) -> builtins.list[dict]:
        """A copy of the objects of ``resource`` (in ``namespace``), by namespace and name."""
        return self._select(resource, _Filter(namespace, [], []))

    def prepend_reactor(
        self, verb: str, resource: Resource | None, reaction: Reaction, times: int | None = None
    ) -> Reactor:
        """Call ``reaction`` before any other on calls of ``verb`` (``*``: any) to
        ``resource`` (None: any); an error it returns is raised, ``times`` times at most."""
        reactor = Reactor(verb, resource, reaction, times)
        self._reactors.insert(0, reactor)
        return reactor

    def fail_next(
        self, verb: str, resource: Resource | None, error: ApiError, times: int | None = 1
    ) -> Reactor:
        """Raise ``error`` on the next ``times`` calls of ``verb`` (None: on every call)."""
        return self.prepend_reactor(verb, resource, lambda _: error, times)

    def remove_reactor(self, reactor: Reactor) -> None:
        if reactor in self._reactors:
            self._reactors.remove(reactor)

    def drop_watches(self) -> None:
        """End every open watch, as a restarted API server or a broken connection does."""
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    def compact(self) -> None:
        """Forget the watch history: a watch from any version before now is Gone (410). A watch
        from the current version is still served (as etcd does): to have an informer list
        again, write something first."""
        self._events.clear()
        self._compacted = self._version

    @property
    def resource_version(self) -> str:
        """The latest resourceVersion: a cache that has seen it (a bookmark tells it) is current."""
        return str(self._version)

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current version to every watch that asked for them."""
        for watcher in self._watchers:
            if watcher.bookmarks:
                resource = watcher.resource
                meta = {"resourceVersion": str(self._version)}
                obj = {"kind": resource.kind, "apiVersion": resource.api_version, "metadata": meta}
                watcher.queue.put_nowait({"type": BOOKMARK, "object": obj})

    # -- verbs --------------------------------------------------------------------------------

    def get(self, action: Action) -> dict:
        self._act(action)
        return _copy(self._stored(action))

    def list(
        self, action: Action, labels: str | None = None, fields: str | None = None
    ) -> tuple[builtins.list[dict], str]:
        """The selected objects, by namespace and name, and the list's resourceVersion."""
        self._act(action)
        selected = self._filter(action, labels, fields)
        return self._select(action.resource, selected), str(self._version)

    async def watch(self, action: Action, options: WatchOptions) -> AsyncGenerator[dict, None]:
        """Events after ``options["resource_version"]`` (from none or ``0``: the objects as
        ADDED first); Gone if the history does not reach back that far. Ends after
        ``timeout_seconds``. ``idle_timeout`` is not modelled."""
        self._act(action)
        selected = self._filter(
            action, options.get("label_selector"), options.get("field_selector")
        )
        watcher = _Watcher(action.resource, selected, options.get("bookmarks", True))
        backlog = self._backlog(action, watcher, options.get("resource_version", ""))
        self._watchers.add(watcher)
        try:
            on_open = options.get("on_open")
            if on_open is not None:
                on_open()
            for event in backlog:
                yield _copy(event)
            async for event in watcher.events(options.get("timeout_seconds", WATCH_TIMEOUT)):
                yield _copy(event)
        finally:
            self._watchers.discard(watcher)

    def create(self, action: Action, body: dict) -> dict:
        self._act(action)
        if action.subresource == "binding" and action.resource == PODS:
            return self._bind(action, body)
        if action.subresource:
            raise action.error(404, _NO_SUCH_SUBRESOURCE)
        return self._create(action, _copy(body))

    def update(self, action: Action, body: dict) -> dict:
        """PUT: Conflict if the body's resourceVersion is set and not the stored one."""
        self._act(action)
        stored = self._stored(action)
        self._check_version(action, stored, body)
        return self._write(action, stored, self._next(action, stored, _copy(body)))

    def patch(
        self, action: Action, patch: Any, patch_type: PatchType, field_manager: str | None = None
    ) -> dict:
        """Any of the four patches; an apply creates a missing object."""
        self._act(action)
        manager = field_manager or ""
        stored = self._objects.get(_key(action.resource, action.namespace, action.name))
        try:
            patch = _decode(patch, patch_type)
            if patch_type == "apply" and not manager:
                raise _PatchFailed(400, "fieldManager: Required value: is required for apply patch")
            if stored is None and patch_type == "apply" and not action.subresource:
                return self._create(action, _applied_object(action, patch, manager))
            if stored is None:
                raise action.not_found()
            candidate = _patched(action.resource, stored, patch, patch_type)
        except _PatchFailed as e:
            raise action.error(e.status, str(e)) from None
        self._check_version(action, stored, candidate)
        new = self._next(action, stored, candidate)
        if patch_type == "apply":
            _own(new, manager, action, patch)
        return self._write(action, stored, new)

    def delete(
        self,
        action: Action,
        grace_period_seconds: int | None = None,
        preconditions: dict | None = None,
    ) -> dict:
        """Remove an object at once, or mark it deleted (``deletionTimestamp``) while it has
        finalizers, or while a pod on a node ends gracefully (until deleted with grace 0). A
        second deletion does not move the ``deletionTimestamp``."""
        self._act(action)
        stored = self._stored(action)
        _check_preconditions(action, stored, preconditions or {})
        new = _copy(stored)
        meta = new["metadata"]
        grace = _grace(action.resource, stored, grace_period_seconds)
        if meta.get("deletionTimestamp"):  # ending already: only a grace of 0 changes that
            if grace != 0 or not meta.get("deletionGracePeriodSeconds"):
                return new
        else:
            when = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=grace)
            meta["deletionTimestamp"] = format_time(when)
            if meta.get("generation"):  # the server counts the start of a deletion as a change
                meta["generation"] += 1
        meta["deletionGracePeriodSeconds"] = grace
        return self._commit(action.resource, DELETED if _released(new) else MODIFIED, new, stored)

    # -- how calls are answered ---------------------------------------------------------------

    def _act(self, action: Action) -> None:
        """Record a call, and let the reactors fail it."""
        self.actions.append(action)
        for reactor in builtins.list(self._reactors):
            if reactor.applies(action) and (error := reactor.reaction(action)) is not None:
                if reactor.times is not None:
                    reactor.times -= 1
                    if reactor.times <= 0:
                        self.remove_reactor(reactor)
                raise error

    def _stored(self, action: Action) -> dict:
        stored = self._objects.get(_key(action.resource, action.namespace, action.name))
        if stored is None:
            raise action.not_found()
        return stored

    def _filter(self, action: Action, labels: str | None, fields: str | None) -> _Filter:
        try:
            return _Filter.parse(action.namespace, labels, fields)
        except ValueError as e:
            raise action.error(400, str(e)) from None

    def _select(self, resource: Resource, selected: _Filter) -> builtins.list[dict]:
        found = sorted((k[1:], o) for k, o in self._objects.items() if k[0] == resource)
        return [_copy(obj) for _, obj in found if selected.matches(obj)]

    def _backlog(self, action: Action, watcher: _Watcher, version: str) -> builtins.list[dict]:
        if version in ("", "0"):
            objects = self._select(watcher.resource, watcher.selected)
            return [{"type": ADDED, "object": obj} for obj in objects]
        if not version.isdigit():
            raise action.error(400, f"invalid resource version: {version!r}")
        if int(version) < self._compacted:
            raise action.error(410, f"too old resource version: {version} ({self._compacted})")
        seen = (watcher.view(e) for e in self._events if e.version > int(version))
        return [event for event in seen if event is not None]

    def _create(self, action: Action, obj: dict) -> dict:
        resource, meta = action.resource, obj.setdefault("metadata", {})
        if not resource.namespaced:
            meta.pop("namespace", None)
        elif not action.namespace:
            raise action.error(405, "a namespaced object is created in a namespace")
        elif (meta.get("namespace") or action.namespace) != action.namespace:
            raise action.error(400, _OTHER_NAMESPACE)
        else:
            meta["namespace"] = action.namespace
        if meta.get("resourceVersion"):
            raise action.error(500, "resourceVersion should not be set on objects to be created")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + "".join(random.choices(_SUFFIX, k=5))
        if not meta.get("name"):
            why = "metadata.name: Required value: name or generateName is required"
            raise action.error(422, f'{resource.kind} "" is invalid: {why}')
        if _key(resource, action.namespace, meta["name"]) in self._objects:
            raise action.error(409, f'{resource} "{meta["name"]}" already exists', "AlreadyExists")
        obj.update(apiVersion=resource.api_version, kind=resource.kind)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=format_time(), generation=1)
        for field in ("deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(field, None)
        return self._commit(resource, ADDED, obj, None)

    def _bind(self, action: Action, binding: dict) -> dict:
        """``pods/binding``: the pod is assigned to the target node, once."""
        stored = self._stored(action)
        node = (stored.get("spec") or {}).get("nodeName")
        if node:
            raise action.conflict(f'pod {action.name} is already assigned to node "{node}"')
        uid = (binding.get("metadata") or {}).get("uid")
        if uid and uid != stored["metadata"].get("uid"):
            raise action.conflict(f"Precondition failed: UID in precondition: {uid}")
        new = _copy(stored)
        new.setdefault("spec", {})["nodeName"] = (binding.get("target") or {}).get("name")
        status = new.setdefault("status", {})
        scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": format_time()}
        status["conditions"] = _merge_list(
            "conditions", status.get("conditions") or [], [scheduled]
        )
        self._write(action, stored, new)
        return {**_SUCCESS, "code": 201}

    def _check_version(self, action: Action, stored: dict, candidate: dict) -> None:
        version = (candidate.get("metadata") or {}).get("resourceVersion")
        if version and version != stored["metadata"]["resourceVersion"]:
            raise action.conflict(_STALE)

    def _next(self, action: Action, stored: dict, candidate: dict) -> dict:
        """What a write of ``candidate`` stores: through a subresource only its status, else
        all but its status and the fields the server owns."""
        if action.subresource not in (None, "status", "approval"):
            raise action.error(404, _NO_SUCH_SUBRESOURCE)
        if action.subresource:
            new = _copy(stored)
            _set(new, "status", candidate.get("status"))
            return new
        if not isinstance(candidate.setdefault("metadata", {}), dict):
            raise action.error(400, "metadata is not an object")
        for field in _SERVER_FIELDS:
            _set(candidate["metadata"], field, _copy(stored["metadata"].get(field)))
        _set(candidate, "status", _copy(stored.get("status")))
        candidate.update(apiVersion=stored["apiVersion"], kind=stored["kind"])
        return candidate

    def _write(self, action: Action, stored: dict, new: dict) -> dict:
        """Store ``new`` in place of ``stored``: nothing if nothing changed, as the real server
        does; the object goes once it is deleted and its finalizers are gone."""
        meta, old_meta = new["metadata"], stored["metadata"]
        if old_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or ()) - set(old_meta.get("finalizers") or ())
            if added:
                why = f"{_NO_NEW_FINALIZERS}, found new finalizers {sorted(added)}"
                raise action.error(422, f'{action.resource.kind} "{action.name}" is invalid: {why}')
        if new == stored:
            return _copy(stored)
        if _content(new) != _content(stored):
            meta["generation"] = old_meta.get("generation", 0) + 1
        return self._commit(action.resource, DELETED if _released(new) else MODIFIED, new, stored)

    def _commit(self, resource: Resource, kind: str, obj: dict, old: dict | None) -> dict:
        """Store ``obj`` (which nobody else holds) at the next resourceVersion, or remove it,
        and tell the watches. A stored object is never changed in place."""
        self._version += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self._version)
        key = _key(resource, meta.get("namespace"), meta["name"])
        if kind == DELETED:
            del self._objects[key]
        else:
            self._objects[key] = obj
        event = _Event(self._version, resource, kind, obj, old)
        self._events.append(event)
        while len(self._events) > self.history:
            self._compacted = self._events.popleft().version
        for watcher in self._watchers:
            if (seen := watcher.view(event)) is not None:
                watcher.queue.put_nowait(seen)
        return _copy(obj)


def _content(obj: dict) -> dict:
    """What a generation counts: all but metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


_PATCH_TYPES: dict[str, PatchType] = {v: k for k, v in PATCH_CONTENT_TYPES.items()}


# -- the client and the cluster -------------------------------------------------------------


class FakeClient(Client):
    """A :class:`~.client.Client` answered by a :class:`FakeServer` (a new one if none is
    given). The real client's verbs (get, create, update, update_status, patch, delete) encode
    each call as they would for a server and hand it to :meth:`call`, answered here (the one
    method a test overrides to delay or hold a verb); lists and watches are answered by
    :meth:`list_pages` and :meth:`watch`. Each call yields to the event loop once, as a request
    would. Raw requests (``request``: logs, exec, reviews) are answered 404."""

    def __init__(self, server: FakeServer | None = None, *, name: str = "fake") -> None:
        super().__init__(ClusterConfig(_NOWHERE, None), name=name)
        self.server = server if server is not None else FakeServer()

    def _action(
        self,
        verb: str,
        resource: Resource,
        namespace: str | None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> Action:
        namespace = namespace if resource.namespaced and namespace else None
        return Action(verb, resource, namespace, name, subresource, self.name)

    async def request(self, method: str, path: str, **_: Any) -> Any:
        """What is not a verb (a pod's log, a review) is not served: 404, as for a path the
        server does not know, which callers handle as the API error it is."""
        status = {
            "kind": "Status",
            "status": "Failure",
            "message": "the server could not find the requested resource",
            "reason": "NotFound",
            "code": 404,
        }
        raise error_for(404, status, f"{method} {path} on {self.name}")

    async def call(self, call: Call, **options: Unpack[RequestOptions]) -> Any:
        """Answer one verb from the server: the real client's verbs encoded it (query, body,
        content type), and it is read back here as the API server would."""
        await asyncio.sleep(0)
        body = options.get("body") or {}
        params = options.get("params") or {}
        name = call.name
        if call.verb == "create" and name is None:
            name = (body.get("metadata") or {}).get("name")
        action = self._action(call.verb, call.resource, call.namespace, name, call.subresource)
        if call.verb == "get":
            return self.server.get(action)
        if call.verb == "create":
            return self.server.create(action, body)
        if call.verb == "update":
            return self.server.update(action, body)
        if call.verb == "patch":
            patch_type = _PATCH_TYPES[options.get("content_type", "")]
            return self.server.patch(action, body, patch_type, params.get("fieldManager"))
        return self.server.delete(action, body.get("gracePeriodSeconds"), body.get("preconditions"))

    async def list_pages(
        self, resource: Resource, namespace: str | None = None, **options: Unpack[ListOptions]
    ) -> AsyncGenerator[dict, None]:
        """Pages of ``limit`` items cut from one snapshot, with continue tokens."""
        await asyncio.sleep(0)
        action = self._action("list", resource, namespace)
        selectors = options.get("label_selector"), options.get("field_selector")
        items, version = self.server.list(action, *selectors)
        limit = options.get("limit", PAGE_LIMIT)
        size = limit if limit > 0 else max(len(items), 1)
        for start in range(0, max(len(items), 1), size):
            meta = {"resourceVersion": version}
            if start + size < len(items):
                meta["continue"] = f"fake-{version}-{start + size}"
            kind = {"kind": f"{resource.kind}List", "apiVersion": resource.api_version}
            yield {**kind, "metadata": meta, "items": items[start : start + size]}

    async def watch(
        self, resource: Resource, namespace: str | None = None, **options: Unpack[WatchOptions]
    ) -> AsyncGenerator[dict, None]:
        await asyncio.sleep(0)
        async for event in self.server.watch(self._action("watch", resource, namespace), options):
            yield event


class FakeCluster(Cluster):
    """A :class:`~.cluster.Cluster` whose client is a :class:`FakeClient` of ``server`` (a new
    one if none is given): its informers are real ones, started by :meth:`start`."""

    def __init__(
        self,
        name: str = "fake",
        server: FakeServer | None = None,
        *,
        idle_timeout: float = 150.0,
        budget: CacheBudget | None = None,
    ) -> None:
        server = server if server is not None else FakeServer(name=name)
        # The server's address: clusters are one place when their addresses are the same.
        config = ClusterConfig(f"https://{server.name}.fake.invalid", None)
        super().__init__(name, config, idle_timeout=idle_timeout, budget=budget)
        self.server = server
        self.client: FakeClient = FakeClient(self.server, name=name)
