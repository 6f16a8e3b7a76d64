"""A tiny RFC 6902 applier (add, remove, replace) that is strict where the API server is: a
patch that would not apply there fails here, so tests prove our patches apply cleanly."""

from __future__ import annotations

import copy
from typing import Any


class PatchError(Exception):
    pass


def apply_patch(document: Any, ops: list[dict]) -> Any:
    """A patched deep copy of ``document``; raises PatchError on any invalid operation."""
    document = copy.deepcopy(document)
    for op in ops:
        document = _apply(document, op)
    return document


def _apply(document: Any, op: dict) -> Any:
    if set(op) - {"op", "path", "value"} or not isinstance(op.get("path"), str):
        raise PatchError(f"malformed operation {op!r}")
    kind = op["op"]
    if kind not in ("add", "remove", "replace") or (kind == "remove") == ("value" in op):
        raise PatchError(f"malformed operation {op!r}")
    tokens = _tokens(op["path"])
    value = copy.deepcopy(op.get("value"))
    if not tokens:
        if kind == "remove":
            raise PatchError("cannot remove the whole document")
        return value
    parent = document
    for token in tokens[:-1]:
        parent = _child(parent, token)
    last = tokens[-1]
    if isinstance(parent, dict):
        if kind != "add" and last not in parent:
            raise PatchError(f"{op['path']}: no such member to {kind}")
        if kind == "remove":
            del parent[last]
        else:
            parent[last] = value
    elif isinstance(parent, list):
        if kind == "add" and last == "-":
            parent.append(value)
            return document
        index = _index(parent, last, allow_end=kind == "add")
        if kind == "add":
            parent.insert(index, value)
        elif kind == "remove":
            del parent[index]
        else:
            parent[index] = value
    else:
        raise PatchError(f"{op['path']}: parent is not a container")
    return document


def _tokens(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"{path!r} is not a JSON pointer")
    tokens = path[1:].split("/")
    for token in tokens:
        if "~" in token.replace("~0", "").replace("~1", ""):
            raise PatchError(f"{path!r}: bad escape")
    return [token.replace("~1", "/").replace("~0", "~") for token in tokens]


def _child(parent: Any, token: str) -> Any:
    if isinstance(parent, dict):
        if token not in parent:
            raise PatchError(f"no member {token!r}")
        return parent[token]
    if isinstance(parent, list):
        return parent[_index(parent, token, allow_end=False)]
    raise PatchError(f"{token!r}: not a container")


def _index(parent: list, token: str, *, allow_end: bool) -> int:
    if not (token.isascii() and token.isdigit()) or (token != "0" and token.startswith("0")):
        raise PatchError(f"{token!r} is not an array index")
    index = int(token)
    if index > len(parent) or (index == len(parent) and not allow_end):
        raise PatchError(f"index {index} out of range")
    return index
