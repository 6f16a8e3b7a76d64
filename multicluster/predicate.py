"""Predicates: which events are worth a reconcile. ``predicate(event_type, obj, old) -> bool``."""

from __future__ import annotations

from collections.abc import Callable

Predicate = Callable[[str, dict, "dict | None"], bool]


def in_namespaces(*namespaces: str) -> Predicate:
    wanted = set(namespaces)
    return lambda _e, obj, _o: obj["metadata"].get("namespace") in wanted


def has_labels(labels: dict[str, str]) -> Predicate:
    items = labels.items()

    def check(_e: str, obj: dict, _o: dict | None) -> bool:
        have = obj["metadata"].get("labels") or {}
        return all(have.get(k) == v for k, v in items)

    return check


def has_annotation(key: str) -> Predicate:
    return lambda _e, obj, _o: key in (obj["metadata"].get("annotations") or {})


def generation_changed() -> Predicate:
    """Updates pass only when ``metadata.generation`` changed (spec edits, not status)."""

    def check(event: str, obj: dict, old: dict | None) -> bool:
        if event != "MODIFIED" or old is None:
            return True
        return obj["metadata"].get("generation") != old["metadata"].get("generation")

    return check


def labels_or_annotations_changed() -> Predicate:
    def check(event: str, obj: dict, old: dict | None) -> bool:
        if event != "MODIFIED" or old is None:
            return True
        new_meta, old_meta = obj["metadata"], old["metadata"]
        return new_meta.get("labels") != old_meta.get("labels") or new_meta.get(
            "annotations"
        ) != old_meta.get("annotations")

    return check


def any_of(*predicates: Predicate) -> Predicate:
    return lambda e, obj, old: any(p(e, obj, old) for p in predicates)
