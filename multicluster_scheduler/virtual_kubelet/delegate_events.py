"""What a delegate's Event in its target becomes on the proxy pod (pure functions, no I/O).

``kubectl describe`` of a proxy pod shows the events of the source; what the target said of the
delegate (its image pulled, a back-off, a failed mount, FailedScheduling by the target's own
scheduler) is reflected there by :mod:`.event_reflector`, with these rules.

The target's API server, and whoever may write Events in the delegate's namespace there, wrote
what is read: every field is taken as hostile. An event counts only when the pod it names is,
by uid, a delegate this agent made (:class:`..targets.delegates.DelegateLookup`) and it was
written in that pod's namespace; its type is Normal or Warning, its reason a short CamelCase
word, its message printable text of bounded length (control characters, which a terminal would
obey, become spaces). Each reflected Event names its target at the start of its message, where
``kubectl describe`` shows it (``[target c2] …``; From shows only the source's component), and
its virtual node as the source's host and reporting instance.

Repeats are aggregated as the event recorder's correlator does: the same type, reason and
message (as the target wrote it) about one proxy pod from one target is one Event whose
``count`` is the sum of the counts of the target's Events it stands for (a crash-looping
delegate raises the count of one BackOff). Its name is derived from the target's first such
Event, so that an agent that restarts and sees it again writes the same Event again, not a
second one. Writes are bounded by :class:`multicluster.events.Correlator` token buckets: per
proxy pod (``PROXY_BURST``, then one per ``PROXY_REFILL`` seconds), per owner of targets (the
Targets of a namespace together, or one ClusterTarget: ``TARGET_BURST``, then ``TARGET_RATE`` a
second) and for all targets together (``TOTAL_BURST``, then ``TOTAL_RATE`` a second: these writes
share the agent's requests to its own API server with placing pods, and a tenant's ten Targets,
or many tenants, must not take them); what is over is dropped and counted. A
message is made printable only for an Event written: a target sends Events as fast as its read
limits allow, and looking at each character of each one cost more than reading it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import unicodedata
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property

from multicluster.kubetime import format_time, parse_time

COMPONENT = "admiralty-virtual-kubelet"
TYPES = ("Normal", "Warning")
MAX_MESSAGE = 1024
"""Characters of a reflected message, its ``[target …]`` prefix included."""
MAX_REASON = 64
REASON = re.compile(r"[A-Za-z][A-Za-z0-9]*")
MAX_COUNT = 2**31 - 1  # an Event's count is an int32
MAX_SOURCES = 16
"""Target Events whose counts one reflected Event keeps apart; more are added once, not followed."""
MAX_NAME = 253
REPLAY_WINDOW = 180.0
"""Events listed when the watch starts (an agent restart, a reconnection) are reflected only if
seen this recently: older ones were reflected before, or are history."""
TIMESTAMP_PAST = 3600.0
"""A target's timestamps are kept when they are at most this old and not in the future."""
PROXY_BURST = 25
PROXY_REFILL = 60.0
TARGET_BURST = 100
TARGET_RATE = 5.0
TOTAL_BURST = 200
TOTAL_RATE = 20.0


def _text(value: object, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _field(value: object, name: str) -> object:
    return value.get(name) if isinstance(value, dict) else None


def _count(event: dict) -> int:
    counts = [event.get("count"), _field(event.get("series"), "count")]
    found = [c for c in counts if isinstance(c, int) and not isinstance(c, bool) and c > 0]
    return min(max(found, default=1), MAX_COUNT)


def _last_seen(event: dict) -> str | None:
    candidates = (
        _field(event.get("series"), "lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        _field(event.get("metadata"), "creationTimestamp"),
    )
    return next((c for c in candidates if isinstance(c, str) and c), None)


def slim_event(event: dict) -> dict:
    """What the cache keeps of a target's Event: what a reflection reads, strings cut to what
    it could use. Never raises, whatever the target sent (an informer's transform must not)."""
    meta = event.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    involved = event.get("involvedObject") or event.get("regarding")
    involved = involved if isinstance(involved, dict) else {}
    first = event.get("firstTimestamp") or event.get("eventTime")
    return {
        "metadata": {
            "name": _text(meta.get("name"), MAX_NAME),
            "namespace": _text(meta.get("namespace"), MAX_NAME),
            "uid": _text(meta.get("uid"), 64),
            "resourceVersion": _text(meta.get("resourceVersion"), 64),
        },
        "involvedUid": _text(involved.get("uid"), 64),
        "involvedNamespace": _text(involved.get("namespace"), MAX_NAME),
        "type": _text(event.get("type"), 16),
        "reason": _text(event.get("reason"), MAX_REASON + 1),
        "message": _text(event.get("message") or event.get("note"), MAX_MESSAGE),
        "count": _count(event),
        "first": _text(first, 64) or None,
        "last": _text(_last_seen(event), 64) or None,
    }


def involved_uid(slim: dict) -> list[str]:
    """An index of cached Events by the uid of the pod they are about."""
    uid = slim.get("involvedUid")
    return [uid] if uid else []


def printable(text: str, limit: int) -> str:
    """``text`` on one line with nothing a terminal obeys: control characters and line breaks
    become spaces, format characters (bidirectional overrides, zero-width joiners) are
    dropped; at most ``limit`` characters, an ellipsis ending what was cut."""
    kept = []
    for char in text:
        category = unicodedata.category(char)
        if category in ("Cc", "Zl", "Zp"):
            kept.append(" ")
        elif category not in ("Cf", "Cs", "Co", "Cn"):
            kept.append(char)
    clean = " ".join("".join(kept).split())
    return clean if len(clean) <= limit else clean[: limit - 1] + "…"


@dataclass(frozen=True)
class DelegateEvent:
    """A target's Event about a pod, validated."""

    uid: str  # the target Event's
    namespace: str
    involved_uid: str
    type: str
    reason: str
    raw_message: str  # as the target wrote it (cut to MAX_MESSAGE): repeats are told by it
    count: int
    first: dt.datetime | None
    last: dt.datetime | None

    @cached_property
    def message(self) -> str:
        """The message as it may be shown: made only for an Event written, since it costs a
        look at each character and a target sends Events as fast as it may."""
        return printable(self.raw_message, MAX_MESSAGE)


def delegate_event(slim: dict) -> DelegateEvent | None:
    """The Event as one to reflect; None when it is not one any Kubernetes component writes
    (another type, a reason that is not a short CamelCase word, no uid)."""
    meta = slim["metadata"]
    reason = slim["reason"]
    if (
        slim["type"] not in TYPES
        or len(reason) > MAX_REASON
        or not REASON.fullmatch(reason)
        or not meta["uid"]
        or not slim["involvedUid"]
    ):
        return None
    return DelegateEvent(
        uid=meta["uid"],
        namespace=meta["namespace"],
        involved_uid=slim["involvedUid"],
        type=slim["type"],
        reason=reason,
        raw_message=slim["message"],
        count=slim["count"],
        first=parse_time(slim["first"]),
        last=parse_time(slim["last"]),
    )


def is_recent(slim: dict, since: dt.datetime) -> bool:
    """Whether the Event was last seen at ``since`` or later (a time it does not say is not)."""
    last = parse_time(slim.get("last"))
    return last is not None and last >= since


def reflected_message(target: str, message: str) -> str:
    prefix = f"[target {target}] "
    return prefix + printable(message, MAX_MESSAGE - len(prefix))


def reflected_name(proxy_name: str, node: str, event_uid: str) -> str:
    """The name of the Event reflecting the target's Event ``event_uid`` (seen through virtual
    node ``node``) on a proxy pod: the same after a restart, so written again, not twice."""
    digest = hashlib.sha256(f"{node}/{event_uid}".encode()).hexdigest()[:16]
    return f"{proxy_name[: MAX_NAME - 17]}.{digest}"


def kept_time(when: dt.datetime | None, now: dt.datetime) -> dt.datetime:
    """A target's timestamp, if it is plausible (not ahead of ours, not over an hour old);
    else now."""
    if when is None or when > now or (now - when).total_seconds() > TIMESTAMP_PAST:
        return now
    return when


ReflectionKey = tuple[str, str, str, str, str]  # proxy uid, virtual node, type, reason, message


@dataclass
class Reflection:
    """The Event that reflects some of a target's Events on a proxy pod."""

    name: str
    first: dt.datetime
    last: dt.datetime
    counts: dict[str, int] = field(default_factory=dict)  # the target's Event uid → its count
    written: int = 0  # the count the source's Event has (0: not written yet)
    writing: bool = False

    @property
    def count(self) -> int:
        return min(sum(self.counts.values()), MAX_COUNT)

    def observe(self, event: DelegateEvent, now: dt.datetime) -> bool:
        """Take in the target's Event (new, or counted again); whether the count changed."""
        before = self.count
        if event.uid in self.counts or len(self.counts) < MAX_SOURCES:
            self.counts[event.uid] = max(self.counts.get(event.uid, 0), event.count)
        else:  # past MAX_SOURCES: counted once, as one more
            self.counts[""] = self.counts.get("", 0) + event.count
        self.last = max(self.last, kept_time(event.last, now))
        return self.count != before

    @property
    def due(self) -> bool:
        """Whether the source's Event is behind (not written, or a count not written yet)."""
        return self.written != self.count


class Reflections:
    """The reflections remembered, the least recently used forgotten first."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[ReflectionKey, Reflection] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def observe(
        self,
        key: ReflectionKey,
        proxy_name: str,
        event: DelegateEvent,
        now: dt.datetime,
    ) -> tuple[Reflection, bool]:
        """The reflection of ``event`` (made if new) and whether it has something to write."""
        entry = self._entries.get(key)
        if entry is None:
            first = kept_time(event.first or event.last, now)
            entry = Reflection(reflected_name(proxy_name, key[1], event.uid), first, first)
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        else:
            self._entries.move_to_end(key)
        entry.observe(event, now)
        return entry, entry.due


def reflected_event(
    proxy: dict,
    node: str,
    target: str,
    event: DelegateEvent,
    reflection: Reflection,
) -> dict:
    """The source's Event on ``proxy`` (a cached pod) for ``reflection``, written as ``node``'s."""
    meta = proxy["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": reflection.name, "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "type": event.type,
        "reason": event.reason,
        "message": reflected_message(target, event.message),
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
        "firstTimestamp": format_time(reflection.first),
        "lastTimestamp": format_time(reflection.last),
        "count": reflection.count,
    }


def count_patch(reflection: Reflection) -> dict:
    return {"count": reflection.count, "lastTimestamp": format_time(reflection.last)}
