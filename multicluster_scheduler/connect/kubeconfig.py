"""Kubeconfigs on both ends: what a local context says about its cluster, and the kubeconfig a
source cluster's agent uses to reach a target as one service account.

The local kubeconfig is read the way kubectl reads it (the files of ``$KUBECONFIG`` merged, the
first definition of a name wins, relative file paths resolved against the file that holds them)
because export copies the server address and the CA certificate a context uses. Authentication
is not read here: the runtime's ``ClusterConfig`` handles every scheme.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from .problems import ConnectError

NAMED_LISTS = ("clusters", "contexts", "users")


@dataclass(frozen=True)
class ContextCluster:
    """The cluster a kubeconfig context points at, as a client on this machine reaches it."""

    context: str
    server: str
    ca_pem: bytes | None = None
    insecure: bool = False
    tls_server_name: str | None = None
    namespace: str | None = None


def kubeconfig_paths(explicit: str | None = None) -> list[Path]:
    """``--kubeconfig``, else the files of ``$KUBECONFIG``, else ``~/.kube/config``."""
    if explicit:
        return [Path(explicit).expanduser()]
    listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return [Path(p).expanduser() for p in listed]
    return [Path("~/.kube/config").expanduser()]


def load_kubeconfig(explicit: str | None = None) -> dict:
    """The merged kubeconfig of this machine (as kubectl sees it)."""
    documents: list[tuple[dict, Path]] = []
    paths = kubeconfig_paths(explicit)
    for path in paths:
        try:
            text = path.read_text()
        except FileNotFoundError:
            if explicit:
                raise ConnectError(f"kubeconfig {path} does not exist") from None
            continue
        except (OSError, ValueError) as e:  # ValueError: not UTF-8 text
            raise ConnectError(f"cannot read kubeconfig {path}: {e}") from e
        try:
            document = yaml.safe_load(text) or {}
        except (yaml.YAMLError, ValueError, RecursionError) as e:
            # ValueError: a scalar YAML resolves to an impossible date (2024-13-01).
            raise ConnectError(f"kubeconfig {path} is not valid YAML: {e}") from e
        if not isinstance(document, dict):
            raise ConnectError(f"kubeconfig {path} is not a mapping")
        documents.append((document, path))
    if not documents:
        raise ConnectError(
            f"no kubeconfig found (looked at {', '.join(map(str, paths))}): give one with "
            "--kubeconfig FILE, or set KUBECONFIG=FILE (the demo's is .testbed/kubeconfig in "
            "the clone; its report ends with the export line)"
        )
    return merge_kubeconfigs(documents)


def merge_kubeconfigs(documents: list[tuple[dict, Path]]) -> dict:
    """Merge kubeconfig documents, each with the file it was read from (relative paths in it are
    relative to that file's folder). A malformed document is a ConnectError naming the file."""
    merged: dict = {"current-context": None, **{name: [] for name in NAMED_LISTS}}
    seen: dict[str, set[str]] = {name: set() for name in NAMED_LISTS}
    for document, path in documents:
        where = f"kubeconfig {path}"
        current = _string(document, "current-context", where)
        if not merged["current-context"]:
            merged["current-context"] = current or None
        for list_name in NAMED_LISTS:
            for name, entry, _ in named_entries(document, list_name, where):
                if name in seen[list_name]:
                    continue
                seen[list_name].add(name)
                if list_name == "clusters":
                    entry = _absolute_ca(entry, path.parent, where)
                merged[list_name].append(entry)
    return merged


def named_entries(config: dict, list_name: str, where: str) -> list[tuple[str, dict, dict]]:
    """``(name, entry, value)`` of each named entry of ``clusters``, ``contexts`` or ``users``
    (value: its ``cluster``, ``context`` or ``user`` mapping); entries without a name are
    skipped, as kubectl does, and anything of the wrong shape is a ConnectError."""
    listed = config.get(list_name)
    if listed is None:
        return []
    if not isinstance(listed, list):
        raise ConnectError(f"{where}: {list_name} is not a list")
    field = list_name[:-1]
    found = []
    for entry in listed:
        if entry is None:
            continue
        if not isinstance(entry, dict):
            raise ConnectError(
                f"{where}: an entry of {list_name} is not a mapping: {_short(entry)}"
            )
        name = entry.get("name")
        if name is None or name == "":
            continue
        if not isinstance(name, str):
            raise ConnectError(f"{where}: a {field} name is not a string: {_short(name)}")
        value = entry.get(field)
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConnectError(f"{where}: {field} {name!r} is not a mapping: {_short(value)}")
        found.append((name, entry, value))
    return found


def _string(mapping: dict, key: str, where: str) -> str | None:
    value = mapping.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ConnectError(f"{where}: {key} is not a string: {_short(value)}")


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _absolute_ca(entry: dict, base: Path, where: str) -> dict:
    cluster = dict(entry.get("cluster") or {})
    path = _string(cluster, "certificate-authority", f"{where}: cluster {entry['name']!r}")
    if path and not os.path.isabs(path):
        cluster["certificate-authority"] = str(base / path)
    return {**entry, "cluster": cluster}


def context_cluster(config: dict, context: str | None = None) -> ContextCluster:
    """The cluster of ``context`` (default: the current context) with its CA certificate read."""
    where = "the kubeconfig"
    name = context or _string(config, "current-context", where)
    if not name:
        raise ConnectError("no context given and the kubeconfig has no current-context")
    contexts = {n: value for n, _, value in reversed(named_entries(config, "contexts", where))}
    if name not in contexts:
        known = ", ".join(sorted(contexts)) or "none"
        raise ConnectError(f"context {name!r} is not in the kubeconfig (contexts: {known})")
    of_context = f"{where}: context {name!r}"
    cluster_name = _string(contexts[name], "cluster", of_context)
    namespace = _string(contexts[name], "namespace", of_context)
    _string(contexts[name], "user", of_context)
    clusters = {n: value for n, _, value in reversed(named_entries(config, "clusters", where))}
    if not cluster_name:
        raise ConnectError(f"context {name!r} names no cluster")
    if cluster_name not in clusters:
        raise ConnectError(f"context {name!r} names cluster {cluster_name!r}, which is not defined")
    cluster = clusters[cluster_name]
    of_cluster = f"{where}: cluster {cluster_name!r} of context {name!r}"
    server = (_string(cluster, "server", of_cluster) or "").rstrip("/")
    if not server:
        raise ConnectError(f"cluster {cluster_name!r} of context {name!r} has no server")
    insecure = cluster.get("insecure-skip-tls-verify")
    if insecure is not None and not isinstance(insecure, bool):
        raise ConnectError(
            f"{of_cluster}: insecure-skip-tls-verify is not true or false: {_short(insecure)}"
        )
    return ContextCluster(
        context=name,
        server=server,
        ca_pem=_ca_pem(cluster, name, of_cluster),
        insecure=bool(insecure),
        tls_server_name=_string(cluster, "tls-server-name", of_cluster) or None,
        namespace=namespace or None,
    )


def _ca_pem(cluster: dict, context: str, where: str) -> bytes | None:
    data = _string(cluster, "certificate-authority-data", where)
    if data:
        try:
            return base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ConnectError(
                f"certificate-authority-data of context {context!r} is not base64: {e}"
            ) from e
    path = _string(cluster, "certificate-authority", where)
    if path:
        return read_ca_file(path)
    return None


def read_ca_file(path: str | os.PathLike) -> bytes:
    """A PEM CA certificate file (``--ca-file``), checked to look like one."""
    try:
        data = Path(path).expanduser().read_bytes()
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise ConnectError(f"cannot read CA certificate {path}: {e}") from e
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise ConnectError(f"{path} is not a PEM certificate (no BEGIN CERTIFICATE line)")
    return data


def exported_cluster(
    local: ContextCluster,
    *,
    server: str | None = None,
    ca_pem: bytes | None = None,
    token_ca_pem: bytes | None = None,
    tls_server_name: str | None = None,
) -> dict:
    """The ``cluster`` entry of an exported kubeconfig.

    Server: the override, else the local context's. CA: the override; else, when the local
    context skips TLS verification, no CA and the same skip; else the CA the token controller
    put next to the token, else the local context's. TLS server name: the override; else the
    local context's, but only when the server is the local context's too (a name meant for one
    address says nothing about another).
    """
    address = (server or local.server).rstrip("/")
    cluster: dict = {"server": address}
    if ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(ca_pem).decode()
    elif local.insecure:
        cluster["insecure-skip-tls-verify"] = True
    elif token_ca_pem or local.ca_pem:
        cluster["certificate-authority-data"] = base64.b64encode(
            token_ca_pem or local.ca_pem or b""
        ).decode()
    if tls_server_name:
        cluster["tls-server-name"] = tls_server_name
    elif local.tls_server_name and address == local.server:
        cluster["tls-server-name"] = local.tls_server_name
    return cluster


def service_account_kubeconfig(
    name: str, cluster: dict, token: str, namespace: str, service_account: str
) -> dict:
    """A one-context kubeconfig that authenticates as ``namespace/service_account``."""
    user = f"{namespace}/{service_account}"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": user, "namespace": namespace}}
        ],
        "current-context": name,
    }
