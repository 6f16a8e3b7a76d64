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
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.config.config_exception import ConfigException

TOKEN_REFRESH_INTERVAL = 30.0


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
        """From kubeconfig text, e.g. the value of a Secret key."""
        try:
            parsed = yaml.safe_load(data)
        except yaml.YAMLError as e:
            raise ConfigError(f"kubeconfig is not valid YAML: {e}") from e
        if not isinstance(parsed, dict):
            raise ConfigError("kubeconfig is not a mapping")
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
        """From a kubeconfig stored in a Secret (as read from the API: base64 ``data``)."""
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
            return cls.from_kubeconfig_data(data, context)
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
