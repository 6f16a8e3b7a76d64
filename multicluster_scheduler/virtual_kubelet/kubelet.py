"""The kubelet API as the agent runs it.

First the cluster's client CA and a serving certificate (:mod:`.serving`), retried until they
can be had without holding up the rest of the agent; then the server (:mod:`.server`), with the
certificate renewed and the client CA followed: a new one replaces the old for new connections.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from multicluster import ApiError, Client, Unreachable
from multicluster.resources import CONFIGMAPS

from ..targets.delegates import DelegateLookup
from ..webhook.certificates import new_ca
from .access import Authorizer, server_context
from .server import KubeletError, KubeletServer
from .serving import KubeletCertificates

log = logging.getLogger(__name__)

CLIENT_CA_NAMESPACE = "kube-system"
CLIENT_CA_CONFIGMAP = "extension-apiserver-authentication"
CLIENT_CA_KEY = "client-ca-file"
RETRY = 10.0
CLIENT_CA_FILE_CHECK = 60.0


class KubeletApi:
    """The kubelet API as the agent runs it: the client CA and a serving certificate first
    (retried until they can be had, without holding up the rest of the agent), then the server,
    with the certificate renewed and new client CAs trusted as they appear."""

    def __init__(
        self,
        client: Client,
        lookup: DelegateLookup,
        *,
        host: str,
        port: int,
        address: str,
        node_name: str,
        signer: str | None,
        client_ca_file: Any,
        cert_dir: Any,
        ca: Any,
        leading: Callable[[], bool],
    ) -> None:
        self.client = client
        self.address = address
        self.node_name = node_name
        self.signer = None if (signer or "none").lower() == "none" else signer
        self.client_ca_file = client_ca_file
        self.cert_dir = cert_dir
        self.ca = ca
        self.server = KubeletServer(
            lookup, Authorizer(client), host=host, port=port, leading=leading
        )
        self.certificates: KubeletCertificates | None = None

    async def client_ca(self) -> bytes:
        """The CA of client certificates the API server presents (its kubelet client one)."""
        if self.client_ca_file:
            return await asyncio.to_thread(_read, self.client_ca_file)
        configmap = await self.client.get(CONFIGMAPS, CLIENT_CA_CONFIGMAP, CLIENT_CA_NAMESPACE)
        pem = (configmap.get("data") or {}).get(CLIENT_CA_KEY)
        if not pem:
            raise KubeletError(
                500, f"{CLIENT_CA_NAMESPACE}/{CLIENT_CA_CONFIGMAP} has no {CLIENT_CA_KEY}"
            )
        return pem.encode()

    async def _prepare(self) -> tuple[ssl.SSLContext, bytes]:
        client_ca = await self.client_ca()
        self.certificates = KubeletCertificates(
            client=self.client,
            node_name=self.node_name,
            addresses=[self.address],
            signer=self.signer,
            cert_dir=self.cert_dir,
            ca=self.ca or new_ca("multicluster-scheduler-kubelet-ca"),
        )
        await self.certificates.obtain()
        certificates = self.certificates
        context = server_context(certificates.cert_file, certificates.key_file, client_ca)
        certificates.on_reload(
            lambda cert, key: (self.server.context or context).load_cert_chain(cert, key)
        )
        log.info(
            "kubelet API certificate issued by %s%s",
            certificates.issuer,
            f" ({certificates.fallback_reason})" if certificates.fallback_reason else "",
        )
        return context, client_ca

    async def run(self) -> None:
        while True:
            try:
                context, client_ca = await self._prepare()
                break
            except (ApiError, Unreachable, KubeletError, OSError, ValueError) as e:
                log.error("kubelet API not served yet (logs, exec and attach): %s", e)
                await asyncio.sleep(RETRY)
        assert self.certificates is not None
        background = [
            asyncio.create_task(_logged(self.certificates.renew_forever(), "certificate renewal")),
            asyncio.create_task(_logged(self._follow_client_ca(client_ca), "client CA")),
        ]
        try:
            while True:
                try:
                    await self.server.serve(self.server.context or context)
                except OSError as e:
                    log.error(
                        "kubelet API cannot listen on %s:%d: %s",
                        self.server.host or "*",
                        self.server.port,
                        e,
                    )
                    await asyncio.sleep(RETRY)
        finally:
            for task in background:
                task.cancel()

    async def _follow_client_ca(self, known: bytes) -> None:
        """Trust the client CA the cluster publishes now, and only that one: a rotated-out CA
        stops being trusted (its ConfigMap is watched; a file is looked at every minute)."""
        while True:
            try:
                async for current in self._client_cas():
                    if current != known:
                        await self._trust(current)
                        known = current
                continue  # the watch ended as watches do: again
            except (ApiError, Unreachable, KubeletError, OSError) as e:
                log.warning("cannot follow the client CA, retrying: %s", e)
            await asyncio.sleep(RETRY)

    async def _client_cas(self) -> AsyncGenerator[bytes, None]:
        if self.client_ca_file:
            while True:
                await asyncio.sleep(CLIENT_CA_FILE_CHECK)
                yield await asyncio.to_thread(_read, self.client_ca_file)
        async for event in self.client.watch(
            CONFIGMAPS,
            CLIENT_CA_NAMESPACE,
            field_selector=f"metadata.name={CLIENT_CA_CONFIGMAP}",
            bookmarks=False,
        ):
            data = (event.get("object") or {}).get("data") or {}
            if event.get("type") in ("ADDED", "MODIFIED") and data.get(CLIENT_CA_KEY):
                yield data[CLIENT_CA_KEY].encode()

    async def _trust(self, client_ca: bytes) -> None:
        certificates = self.certificates
        assert certificates is not None
        try:
            context = server_context(certificates.cert_file, certificates.key_file, client_ca)
        except (ssl.SSLError, ValueError) as e:
            log.error("the cluster's client CA is not usable, keeping the previous one: %s", e)
            return
        await self.server.use_context(context)
        log.info("kubelet API trusts the cluster's current client CA")


async def _logged(work: Awaitable[None], what: str) -> None:
    """Run a background loop; say so if it ever fails (instead of a silent dead task)."""
    try:
        await work
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("kubelet API %s stopped", what)


def _read(path: Any) -> bytes:
    with open(path, "rb") as f:
        return f.read()
