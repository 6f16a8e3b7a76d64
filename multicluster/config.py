"""Where a cluster is and how to authenticate to it, from the official ``kubernetes`` package.

Kubeconfig contexts, kubeconfigs held in Secrets and the in-cluster service account are all read
by ``kubernetes.config``, which knows every authentication scheme (client certificates, bearer
tokens, token files that rotate, exec plugins). We keep only what HTTP needs: the server URL, an
SSL context, and a bearer token that is refreshed off the event loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

TOKEN_REFRESH_INTERVAL = 30.0

# A server of a kubeconfig kept in a Secret is an API server's root, nothing more: with a path or
# a query, whoever writes the Secret would have the agent call any URL of any reachable address
# (an admin endpoint, a metadata service) and read back what it tells about the answer.
SERVER_URL = re.compile(r"https?://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?/?")

# What a kubeconfig kept in a Secret may hold: inline values only. Exec plugins, auth providers
# and file paths (tokenFile, client-certificate, certificate-authority…) would let anyone who may
# write a Secret run a command as the agent or send the agent's own files (its token) anywhere.
INLINE_USER_FIELDS = frozenset(
    {"token", "client-certificate-data", "client-key-data", "username", "password", "extensions"}
)
INLINE_CLUSTER_FIELDS = frozenset(
    {
        "server",
        "certificate-authority-data",
        "insecure-skip-tls-verify",
        "tls-server-name",
        "disable-compression",
        "extensions",
    }
)

# A kubeconfig kept in a Secret is written by whoever may write Secrets in a Target's namespace
# (Kubernetes' edit role), and read on the agent's event loop whenever it changes: YAML costs
# time in the number of its nodes (a Secret of 1 MB of small flow mappings held the loop 13 s,
# for every tenant). One target's kubeconfig has tens of lines, one of 20 contexts 250; its
# certificates are long lines, which cost little. So a Secret's is read within these bounds
# (lines, commas and opening brackets count its nodes), with libyaml when PyYAML has it.
MAX_SECRET_KUBECONFIG = 256 * 1024  # bytes
MAX_SECRET_KUBECONFIG_ITEMS = 4096
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _within_bounds(data: bytes) -> None:
    """ConfigError unless the kubeconfig ``data`` of a Secret is within the bounds above."""
    if len(data) > MAX_SECRET_KUBECONFIG:
        raise ConfigError(
            f"kubeconfig is {len(data)} bytes: at most {MAX_SECRET_KUBECONFIG} are read from a "
            "Secret"
        )
    items = sum(data.count(mark) for mark in (b"\n", b",", b"[", b"{"))
    if items > MAX_SECRET_KUBECONFIG_ITEMS:
        raise ConfigError(
            f"kubeconfig has {items} lines and list or mapping items: at most "
            f"{MAX_SECRET_KUBECONFIG_ITEMS} are read from a Secret (one target's has tens)"
        )


def _parse(data: str | bytes) -> dict:
    """Kubeconfig text as a mapping. Errors never quote the text (it holds credentials)."""
    try:
        text = data.decode() if isinstance(data, bytes) else data
    except UnicodeDecodeError as e:
        raise ConfigError(f"kubeconfig is not UTF-8 text: {e.reason} at byte {e.start}") from None
    try:
        parsed = yaml.load(text, Loader=_LOADER)  # a safe loader: plain data only
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or type(e).__name__
        raise ConfigError(f"kubeconfig is not valid YAML: {problem}{where}") from None
    except (ValueError, RecursionError) as e:  # e.g. a date that is not one, deep nesting
        raise ConfigError(f"kubeconfig is not valid YAML: {type(e).__name__}") from None
    if not isinstance(parsed, dict):
        raise ConfigError("kubeconfig is not a mapping")
    return parsed


def server_problem(server: object) -> str | None:
    """Why a kubeconfig's server may not be used from an untrusted place, or None: it must be
    ``http(s)://host[:port]`` (a trailing ``/`` aside). Names the problem, never the value (a
    query or user info may hold a credential)."""
    if not isinstance(server, str):
        return "is not a URL"
    if SERVER_URL.fullmatch(server):
        return None
    scheme, sep, rest = server.partition("://")
    if not sep or scheme not in ("http", "https"):
        return "is not an http:// or https:// URL"
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    path = rest[len(authority) :].partition("#")[0].partition("?")[0]
    found = [
        what
        for what, present in (
            ("user info", "@" in authority),
            ("a path", path not in ("", "/")),
            ("a query", "?" in rest),
            ("a fragment", "#" in rest),
        )
        if present
    ]
    if found:
        return f"has {' and '.join(found)}"
    return "has characters a host and port cannot have"


def untrusted_problem(parsed: dict) -> str | None:
    """Why a kubeconfig from an untrusted place may not be used, or None. Names fields, never
    values."""
    for entry in parsed.get("clusters") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("cluster"), dict):
            continue  # said below
        problem = server_problem(entry["cluster"].get("server"))
        if problem:
            return (
                f"cluster {entry.get('name')!r}: the server URL {problem}: a kubeconfig kept in a"
                " Secret may only name a server as https://host:port (no path, query, fragment"
                " or user info)"
            )
    for kind, allowed in (("users", INLINE_USER_FIELDS), ("clusters", INLINE_CLUSTER_FIELDS)):
        entries = parsed.get(kind) or []
        if not isinstance(entries, list):
            return f"{kind} is not a list"
        for entry in entries:
            if not isinstance(entry, dict):
                return f"an entry of {kind} is not a mapping"
            body = entry.get(kind[:-1]) or {}
            if not isinstance(body, dict):
                return f"{kind[:-1]} {entry.get('name')!r} is not a mapping"
            refused = sorted(k for k in body if k not in allowed)
            if refused:
                return (
                    f"{kind[:-1]} {entry.get('name')!r} uses {', '.join(refused)}: a kubeconfig "
                    f"kept in a Secret may only hold inline values ({', '.join(sorted(allowed))})"
                    "; the agent runs no command and reads no file for it"
                )
    return None


class ConfigError(ValueError):
    """A kubeconfig or in-cluster environment that cannot be used; the message says why."""


@dataclass
class ClusterConfig:
    """Connection settings for one cluster."""

    server: str
    ssl_context: ssl.SSLContext | None
    _configuration: Any = field(default=None, repr=False)
    _token: str | None = field(default=None, repr=False)
    _token_checked: float = field(default=0.0, repr=False)

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> ClusterConfig:
        """From a kubeconfig file (default: ``$KUBECONFIG`` or ``~/.kube/config``)."""
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_kube_config(
                config_file=path,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (ConfigException, OSError, KeyError, TypeError) as e:
            raise ConfigError(f"kubeconfig context {context or '(current)'}: {e}") from e
        return cls._from_configuration(configuration)

    @classmethod
    def from_kubeconfig_data(cls, data: str | bytes, context: str | None = None) -> ClusterConfig:
        """From kubeconfig text given by the operator (trusted: exec plugins and files are
        allowed; see :meth:`from_secret` for kubeconfigs from Secrets)."""
        parsed = _parse(data)
        return cls._from_dict(parsed, context)

    @classmethod
    def _from_dict(cls, parsed: dict, context: str | None) -> ClusterConfig:
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_kube_config_from_dict(
                parsed,
                context=context,
                client_configuration=configuration,
                persist_config=False,
            )
        except (ConfigException, OSError, KeyError, TypeError, AttributeError, ValueError) as e:
            raise ConfigError(f"kubeconfig context {context or '(current)'}: {e}") from e
        return cls._from_configuration(configuration)

    @classmethod
    def from_secret(
        cls, secret: dict, key: str = "config", context: str | None = None
    ) -> ClusterConfig:
        """From a kubeconfig stored in a Secret (as read from the API: base64 ``data``).

        Whoever may write a Secret is not trusted with what the agent may do: such a kubeconfig
        may only carry inline credentials (see :func:`untrusted_problem`)."""
        meta = secret.get("metadata") or {}
        where = f"secret {meta.get('namespace', '')}/{meta.get('name', '')}"
        encoded = (secret.get("data") or {}).get(key)
        if encoded is None:
            raise ConfigError(f"{where} has no key {key!r}")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ConfigError(f"{where} key {key!r} is not base64: {e}") from e
        try:
            _within_bounds(data)
            parsed = _parse(data)
            problem = untrusted_problem(parsed)
            if problem:
                raise ConfigError(problem)
            return cls._from_dict(parsed, context)
        except ConfigError as e:
            raise ConfigError(f"{where} key {key!r}: {e}") from e

    @classmethod
    def in_cluster(cls) -> ClusterConfig:
        """From the pod's service account (token file re-read as the kubelet rotates it)."""
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)
        except ConfigException as e:
            raise ConfigError(f"in-cluster configuration: {e}") from e
        return cls._from_configuration(configuration)

    @classmethod
    def _from_configuration(cls, configuration: Any) -> ClusterConfig:
        server = configuration.host.rstrip("/")
        context: ssl.SSLContext | None = None
        if server.startswith("https://"):
            try:
                context = ssl.create_default_context(cafile=configuration.ssl_ca_cert or None)
                if configuration.cert_file:
                    context.load_cert_chain(configuration.cert_file, configuration.key_file)
            except (ssl.SSLError, OSError) as e:
                raise ConfigError(f"TLS settings for {server}: {e}") from e
            if not configuration.verify_ssl:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        config = cls(server=server, ssl_context=context, _configuration=configuration)
        config._token = configuration.api_key.get("BearerToken")
        config._token_checked = time.monotonic()
        return config

    @property
    def tls_server_name(self) -> str | None:
        return getattr(self._configuration, "tls_server_name", None)

    def authorization(self) -> str | None:
        """The current ``Authorization`` header value, if any (no I/O)."""
        return self._token

    async def refresh_token(self, force: bool = False) -> None:
        """Run the token refresh hook (file read or exec plugin) in a thread, when due."""
        configuration = self._configuration
        hook = getattr(configuration, "refresh_api_key_hook", None)
        if hook is None:
            return
        now = time.monotonic()
        if not force and now - self._token_checked < TOKEN_REFRESH_INTERVAL:
            return
        self._token_checked = now
        await asyncio.to_thread(hook, configuration)
        self._token = configuration.api_key.get("BearerToken")
