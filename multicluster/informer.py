"""Informers: a local cache of one resource in one cluster, kept current by list and watch.

The reflector lists (paginated), then watches from the list's resourceVersion with bookmarks.
When the server says the version is too old (410 Gone) it lists again and emits deletes for the
keys that vanished meanwhile, so handlers never miss a deletion. Errors back off with jitter;
a watch that stays silent past ``idle_timeout`` is dropped and reopened (half-open connections
are otherwise invisible). Objects may be slimmed by a ``transform`` before they are cached.

The backoff counts every way a server can keep us busy, as client-go's reflector does: errors,
and watches that end (or answer 410) within a second of opening, except a 410 to the version it
resumed from (an outage's expected end: the list follows at once). It starts over only once a
watch has lasted ``backoff_reset`` seconds, not after a list that succeeded: a server that lists
well and then refuses every watch would otherwise be asked again and again without a pause.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import random
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from . import metrics
from .client import Client
from .errors import ApiError, BadResponse, Gone, Unreachable
from .readlimits import CacheBudget, CacheFull, cost
from .resources import Resource

log = logging.getLogger(__name__)

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"
SHORT_WATCH = 1.0
"""A watch that ends sooner than this after opening counts as a failure (client-go's rule)."""

Handler = Callable[[str, dict, "dict | None", bool], Any]
"""``handler(event_type, obj, old, initial)``; ``initial`` marks events of the first list."""
IndexFunc = Callable[[dict], Iterable[str]]

_running: weakref.WeakSet[Informer] = weakref.WeakSet()


class _CachedObjects:
    """``informer_cached_objects``: read from the running informers at each scrape, summed by
    cluster and resource (several informers of one resource, with different selectors, may run
    against one cluster)."""

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "informer_cached_objects",
            "Objects held in informer caches.",
            labels=["cluster", "resource"],
        )
        totals: dict[tuple[str, str], int] = {}
        for informer in list(_running):
            key = informer._labels
            totals[key] = totals.get(key, 0) + len(informer.store)
        for key, count in sorted(totals.items()):
            family.add_metric(list(key), count)
        yield family


metrics.REGISTRY.register(_CachedObjects())


def object_key(obj: dict) -> str:
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else meta["name"]


def index_by_namespace(obj: dict) -> Iterable[str]:
    namespace = obj["metadata"].get("namespace")
    return (namespace,) if namespace else ()


def index_by_owner_uid(obj: dict) -> Iterable[str]:
    return [ref["uid"] for ref in obj["metadata"].get("ownerReferences") or ()]


def index_by_label(key: str) -> IndexFunc:
    def index(obj: dict) -> Iterable[str]:
        value = (obj["metadata"].get("labels") or {}).get(key)
        return () if value is None else (value,)

    return index


def strip_managed_fields(obj: dict) -> dict:
    """A transform that drops ``metadata.managedFields`` (often a third of an object)."""
    obj["metadata"].pop("managedFields", None)
    return obj


class Store:
    """Objects by key, plus indexes (index name → value → keys).

    An index value that one object has (a uid, say: most of them) maps to that object's key
    itself, not to a set of one: 10,000 sets of one key cost 2 MB."""

    def __init__(self) -> None:
        self._items: dict[str, dict] = {}
        self._indexers: dict[str, IndexFunc] = {"namespace": index_by_namespace}
        self._indexes: dict[str, dict[str, str | set[str]]] = {"namespace": {}}

    def add_indexer(self, name: str, func: IndexFunc) -> None:
        if name in self._indexers:
            return
        self._indexers[name] = func
        index: dict[str, str | set[str]] = {}
        for key, obj in self._items.items():
            for value in func(obj):
                self._add(index, value, key)
        self._indexes[name] = index

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def get(self, key: str) -> dict | None:
        return self._items.get(key)

    def list_keys(self) -> list[str]:
        return list(self._items)

    def list(self, namespace: str | None = None) -> list[dict]:
        if namespace is None:
            return list(self._items.values())
        return self.by_index("namespace", namespace)

    def by_index(self, index: str, value: str) -> builtins.list[dict]:
        keys = self._indexes[index].get(value, ())
        if isinstance(keys, str):
            return [self._items[keys]]
        return [self._items[k] for k in keys]

    def put(self, key: str, obj: dict) -> dict | None:
        old = self._items.get(key)
        self._items[key] = obj
        for name, func in self._indexers.items():
            index = self._indexes[name]
            old_values = set(func(old)) if old is not None else set()
            new_values = set(func(obj))
            if old_values == new_values:
                continue
            for value in old_values - new_values:
                self._discard(index, value, key)
            for value in new_values - old_values:
                self._add(index, value, key)
        return old

    def delete(self, key: str) -> dict | None:
        old = self._items.pop(key, None)
        if old is not None:
            for name, func in self._indexers.items():
                for value in func(old):
                    self._discard(self._indexes[name], value, key)
        return old

    @staticmethod
    def _add(index: dict[str, str | set[str]], value: str, key: str) -> None:
        keys = index.get(value)
        if keys is None:
            index[value] = key
        elif isinstance(keys, str):
            if keys != key:
                index[value] = {keys, key}
        else:
            keys.add(key)

    @staticmethod
    def _discard(index: dict[str, str | set[str]], value: str, key: str) -> None:
        keys = index.get(value)
        if keys is None:
            return
        if isinstance(keys, str):
            if keys == key:
                del index[value]
            return
        keys.discard(key)
        if len(keys) == 1:
            index[value] = next(iter(keys))
        elif not keys:
            del index[value]


@dataclass(frozen=True)
class Registration:
    """A handler registered with an informer (an event handler, or a healthy handler)."""

    informer: Informer
    handler: Callable[..., Any]

    def remove(self) -> None:
        self.informer.remove_handler(self.handler)


class Informer:
    """Cache of one resource (in one namespace, or all) of one cluster, with event handlers."""

    def __init__(
        self,
        client: Client,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        transform: Callable[[dict], dict] | None = None,
        cluster: str = "",
        idle_timeout: float = 150.0,
        page_size: int = 500,
        backoff_max: float = 30.0,
        backoff_reset: float = 60.0,
        budget: CacheBudget | None = None,
    ) -> None:
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.transform = transform
        self.cluster = cluster or client.name
        self.idle_timeout = idle_timeout
        self.page_size = page_size
        self.backoff_max = backoff_max
        self.backoff_reset = backoff_reset
        self.budget = budget
        self._costs: dict[str, int] = {}  # what each cached object is charged (with a budget)
        self._watch_opened: float | None = None
        self.store = Store()
        self.resource_version = ""
        self._last_error: Exception | None = None
        self._was_healthy = False
        self._handlers: list[Handler] = []
        self._healthy_handlers: list[Callable[[], None]] = []
        self._resyncs: dict[Handler, tuple[float, asyncio.TimerHandle | None]] = {}
        self._synced = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._labels = (self.cluster, str(resource))
        self._event_counters = {
            kind: metrics.INFORMER_EVENTS.labels(*self._labels, kind)
            for kind in (ADDED, MODIFIED, DELETED)
        }

    def __repr__(self) -> str:
        scope = f" in {self.namespace}" if self.namespace else ""
        return f"<Informer {self.resource}{scope} of {self.cluster}>"

    # -- public -------------------------------------------------------------------------------

    def add_handler(self, handler: Handler, *, resync_period: float | None = None) -> Registration:
        """Register a handler; objects already cached are replayed to it as initial ADDED.
        ``remove()`` on what it returns unregisters it (as client-go's registrations do).

        With ``resync_period``, every cached object is also handed to it again that often, as
        ``MODIFIED`` with ``old`` the object itself (client-go's resync), while the informer is
        healthy: a controller looks again at what no event would bring back."""
        self._handlers.append(handler)
        if self.has_synced:
            for obj in self.store.list():
                self._call(handler, ADDED, obj, None, True)
        if resync_period is not None:
            self._resyncs[handler] = (resync_period, None)
            with contextlib.suppress(RuntimeError):  # no loop yet: scheduled when started
                self._schedule_resync(handler)
        return Registration(self, handler)

    def add_healthy_handler(self, callback: Callable[[], None]) -> Registration:
        """``callback()`` whenever the informer becomes healthy: at its first sync, and each
        time it recovers from a failed list or watch (a relist, or a watch resumed, says nothing
        of objects that did not change meanwhile, whatever was given up on while it failed)."""
        self._healthy_handlers.append(callback)
        return Registration(self, callback)

    def remove_handler(self, handler: Callable[..., Any]) -> None:
        if handler in self._handlers:
            self._handlers.remove(handler)
        if handler in self._healthy_handlers:
            self._healthy_handlers.remove(handler)
        _, timer = self._resyncs.pop(handler, (0.0, None))
        if timer is not None:
            timer.cancel()

    def add_indexer(self, name: str, func: IndexFunc) -> None:
        self.store.add_indexer(name, func)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self, timeout: float | None = None) -> bool:
        try:
            await asyncio.wait_for(self._synced.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def get(self, name: str, namespace: str | None = None) -> dict | None:
        return self.store.get(f"{namespace}/{name}" if namespace else name)

    def list(self, namespace: str | None = None) -> list[dict]:
        return self.store.list(namespace)

    def by_index(self, index: str, value: str) -> builtins.list[dict]:
        return self.store.by_index(index, value)

    def start(self) -> asyncio.Task:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=repr(self))
            _running.add(self)
            for handler, (_, timer) in self._resyncs.items():
                if timer is None:
                    self._schedule_resync(handler)
        return self._task

    async def stop(self) -> None:
        for handler, (period, timer) in self._resyncs.items():
            if timer is not None:
                timer.cancel()
            self._resyncs[handler] = (period, None)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        _running.discard(self)
        if self.budget is not None:  # what it cached goes with it
            self.budget.charge(-sum(self._costs.values()), repr(self))
            self._costs.clear()

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    # -- reflector ----------------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. A restarted informer resumes its watch where it
        stopped (a 410 then makes it relist)."""
        failures = 0
        need_list = not self.resource_version
        loop = asyncio.get_running_loop()
        while True:
            error: Exception | None = None
            resumed = not need_list  # watching from a version of an earlier list
            try:
                if need_list:
                    await self._list()
                    need_list = False
                await self._watch()
                reason = "expired"
            except Gone as e:
                need_list = True
                reason, error = "gone", e
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.last_error = error = _without_traceback(e)
                reason = "unreachable" if isinstance(e, Unreachable) else "error"
            metrics.WATCH_RESTARTS.labels(*self._labels, reason).inc()
            opened, self._watch_opened = self._watch_opened, None  # over: it clears no error
            lasted = loop.time() - opened if opened is not None else 0.0
            if lasted >= self.backoff_reset:
                failures = 0
            if reason == "gone" and resumed:
                # The version it resumed from is past the server's window, as it is after an
                # outage: expected once, so the list follows at once (the backoff the outage
                # built would otherwise hold a server that is back). A 410 to the version of a
                # list just made is the server's doing and counts below.
                log.info("watch expired, relisting cluster=%s resource=%s", *self._labels)
                continue
            if reason in ("expired", "gone") and lasted >= SHORT_WATCH:
                if reason == "gone":
                    log.info("watch expired, relisting cluster=%s resource=%s", *self._labels)
                continue
            if error is None:
                self.last_error = error = BadResponse(
                    f"WATCH {self.resource.path(self.namespace)} on {self.cluster}: the server"
                    f" ended the watch {lasted:.1f}s after opening it"
                )
            failures += 1
            delay = min(self.backoff_max, 0.2 * 2 ** min(failures, 10))
            delay *= random.uniform(0.5, 1.0)
            quiet = failures == 1 and isinstance(error, ApiError)
            log.log(
                logging.INFO if quiet else logging.WARNING,
                "list/watch failed cluster=%s resource=%s retry_in=%.1fs error=%s",
                *self._labels,
                delay,
                error,
            )
            await asyncio.sleep(delay)

    async def _list(self) -> None:
        fresh: dict[str, dict] = {}
        costs: dict[str, int] = {}
        version = ""
        budget = self.budget
        held = sum(self._costs.values())  # what the cache holds now, given back once replaced
        listed = 0
        where = f"LIST {self.resource.path(self.namespace)} of {self.cluster}"
        async for page in self.client.list_pages(
            self.resource,
            self.namespace,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            limit=self.page_size,
        ):
            transform = self.transform
            # Taken out of the page one by one: the page (held until the next one arrives) does
            # not keep every decoded pod alive beside its transformed copy.
            items = page.pop("items", None) or []
            items.reverse()
            while items:
                item = items.pop()
                obj = transform(item) if transform else item
                key = object_key(obj)
                fresh[key] = obj
                if budget is not None:
                    costs[key] = charged = cost(obj)
                    listed += charged
            if budget is not None:  # page by page: a list over the budget stops at once
                budget.check(listed - held, where)
            version = page["metadata"].get("resourceVersion", "")
        if budget is not None:
            budget.charge(listed - held, where)
            self._costs = costs
        initial = not self.has_synced
        for key in self.store.list_keys():
            if key not in fresh:
                old = self.store.delete(key)
                if old is not None:
                    self._dispatch(DELETED, old, None, False)
        for key, obj in fresh.items():
            old = self.store.put(key, obj)
            if old is None:
                self._dispatch(ADDED, obj, None, initial)
            elif _version(old) != _version(obj):
                self._dispatch(MODIFIED, obj, old, initial)
        self.resource_version = version
        self.last_error = None
        if initial:
            self._synced.set()
        self._note_health()

    async def _watch(self) -> None:
        transform = self.transform
        store = self.store
        async for event in self.client.watch(
            self.resource,
            self.namespace,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            field_selector=self.field_selector,
            timeout_seconds=random.randint(300, 600),
            idle_timeout=self.idle_timeout,
            on_open=self._connected,
        ):
            kind = event["type"]
            raw = event["object"]
            version = raw.get("metadata", {}).get("resourceVersion")
            if kind == "BOOKMARK":
                self.resource_version = version or self.resource_version
                self.last_error = None
                continue
            obj = transform(raw) if transform else raw
            key = object_key(obj)
            if self.budget is not None:
                self._charge(kind, key, obj)
            if kind == DELETED:
                old = store.delete(key)
                self._dispatch(DELETED, obj, old, False)
            else:
                old = store.put(key, obj)
                if old is None:
                    self._dispatch(ADDED, obj, None, False)
                elif _version(old) != version:
                    self._dispatch(MODIFIED, obj, old, False)
            if version:
                self.resource_version = version
            self.last_error = None  # an event went through: whatever failed before is over

    def _charge(self, kind: str, key: str, obj: dict) -> None:
        """Charge the budget for a watch event's object (raises :class:`CacheFull`)."""
        assert self.budget is not None
        charged = 0 if kind == DELETED else cost(obj)
        context = f"WATCH {self.resource.path(self.namespace)} of {self.cluster}"
        self.budget.charge(charged - self._costs.get(key, 0), context)
        if charged:
            self._costs[key] = charged
        else:
            self._costs.pop(key, None)

    def _connected(self) -> None:
        loop = asyncio.get_running_loop()
        opened = self._watch_opened = loop.time()
        loop.call_later(SHORT_WATCH, self._lasted, opened)

    def _lasted(self, opened: float) -> None:
        """The watch opened at ``opened`` is still open a while later: the last error is over
        (one that ends at once never clears it). An answer no API server gives, or a full
        budget, is over only once an event goes through."""
        if self._watch_opened != opened or not self.running:
            return
        if not isinstance(self.last_error, BadResponse | CacheFull):
            self.last_error = None

    @property
    def healthy(self) -> bool:
        """Synced, and the last list or watch succeeded."""
        return self.has_synced and self._last_error is None

    @property
    def last_error(self) -> Exception | None:
        """Why the last list or watch failed, until one succeeds."""
        return self._last_error

    @last_error.setter
    def last_error(self, error: Exception | None) -> None:
        # Set on every watch event: only a change of health is worth looking at.
        self._last_error = error
        if error is not None:
            self._was_healthy = False
        elif not self._was_healthy:
            self._note_health()

    def _note_health(self) -> None:
        healthy = self.healthy
        if healthy and not self._was_healthy:
            for callback in list(self._healthy_handlers):
                try:
                    callback()
                except Exception:
                    log.exception("healthy handler failed informer=%r", self)
        self._was_healthy = healthy

    def _schedule_resync(self, handler: Handler) -> None:
        period, timer = self._resyncs[handler]
        if timer is not None:
            timer.cancel()
        timer = asyncio.get_running_loop().call_later(period, self._resync, handler)
        self._resyncs[handler] = (period, timer)

    def _resync(self, handler: Handler) -> None:
        if handler not in self._resyncs:
            return
        if self.healthy:
            for obj in self.store.list():
                self._call(handler, MODIFIED, obj, obj, False)
        self._schedule_resync(handler)

    def _dispatch(self, kind: str, obj: dict, old: dict | None, initial: bool) -> None:
        self._event_counters[kind].inc()
        for handler in self._handlers:
            self._call(handler, kind, obj, old, initial)

    def _call(
        self, handler: Handler, kind: str, obj: dict, old: dict | None, initial: bool
    ) -> None:
        try:
            handler(kind, obj, old, initial)
        except Exception:
            log.exception(
                "event handler failed cluster=%s resource=%s event=%s", *self._labels, kind
            )


def _without_traceback(error: Exception) -> Exception:
    """``error`` (and its causes) without their tracebacks: it is kept as ``last_error`` until
    the next success, and its frames would keep alive what the failed list had read so far."""
    seen: BaseException | None = error
    for _ in range(16):  # a chain of causes is short; a cycle of them is not followed
        if seen is None:
            break
        seen.__traceback__ = None
        seen = seen.__cause__ or seen.__context__
    return error


def _version(obj: dict) -> str | None:
    return obj.get("metadata", {}).get("resourceVersion")
