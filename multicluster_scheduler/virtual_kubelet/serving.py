"""The virtual kubelet's serving certificate, for the API server's ``logs/exec/attach`` proxy.

An API server that checks kubelet certificates (``--kubelet-certificate-authority``) trusts the
ones its ``kubernetes.io/kubelet-serving`` signer issues, so that signer is asked first: a
CertificateSigningRequest the agent approves itself (its RBAC lets it approve for that signer
only), deleted once answered. Where the signer is off, refused or silent (a managed cluster that
signs kubelet certificates elsewhere, an old API, a controller manager without signing keys),
the agent's own CA (the webhook's) signs instead, and the reason is logged and kept: an API
server that does not check kubelet certificates, the default, accepts that one all the same.
Renewed when a third of its validity is left, and reloaded without a restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import hashlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from multicluster import ApiError, Client, Conflict, Gone
from multicluster.kubetime import format_time
from multicluster.pki import KeyPair, ServingFiles, key_pem, needs_renewal, public_der
from multicluster.pki import certificate_request as pki_request
from multicluster.resources import CERTIFICATE_SIGNING_REQUESTS as CSRS

from ..webhook.certificates import new_serving_certificate

log = logging.getLogger(__name__)

KUBELET_SERVING_SIGNER = "kubernetes.io/kubelet-serving"
SIGNER_OFF = ("", "none")
USAGES = ["digital signature", "server auth"]
ISSUER_SIGNER, ISSUER_AGENT_CA = "signer", "agent-ca"
APPROVAL_REASON = "AutoApproved"
FallbackCA = KeyPair | Callable[[], Awaitable[KeyPair]]


class KubeletCertificateError(RuntimeError):
    """No serving certificate: the signer did not sign and there is no CA to fall back on."""


class _NotSigned(Exception):
    """Why the signer gave no certificate for the CSR named ``csr``."""

    def __init__(self, csr: str, reason: str) -> None:
        super().__init__(reason)
        self.csr = csr
        self.reason = reason


# -- what is asked and what is answered (pure) -------------------------------------------------


CN_PREFIX = "system:node:"
MAX_CN = 64  # X.509's upper bound on a common name


def kubelet_subject(node_name: str) -> x509.Name:
    """The subject ``kubernetes.io/kubelet-serving`` requires: the node's user and group. A name
    too long for a common name (a release and pod name can be) is shortened with a hash; API
    servers check a kubelet certificate's addresses, never its common name."""
    room = MAX_CN - len(CN_PREFIX)
    if len(node_name) > room:
        digest = hashlib.sha256(node_name.encode()).hexdigest()[:16]
        node_name = f"{node_name[: room - len(digest) - 1]}-{digest}"
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"{CN_PREFIX}{node_name}"),
        ]
    )


def certificate_request(
    key: ec.EllipticCurvePrivateKey, node_name: str, addresses: list[str]
) -> bytes:
    """A PEM certificate request for the node's serving certificate at ``addresses``."""
    return pki_request(key, kubelet_subject(node_name), addresses)


def csr_name(prefix: str, key: ec.EllipticCurvePrivateKey) -> str:
    """``<prefix>-<short hash of the public key>``: a new name for each key."""
    return f"{prefix}-{hashlib.sha256(public_der(key.public_key())).hexdigest()[:12]}"


def csr_object(
    name: str, signer: str, request_pem: bytes, expiration_seconds: int | None = None
) -> dict:
    spec: dict = {
        "request": base64.b64encode(request_pem).decode(),
        "signerName": signer,
        "usages": list(USAGES),
    }
    if expiration_seconds is not None:
        spec["expirationSeconds"] = expiration_seconds
    return {
        "apiVersion": CSRS.api_version,
        "kind": CSRS.kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def approved(csr: dict, node_name: str, now: dt.datetime | None = None) -> dict:
    """The CSR with an ``Approved`` condition, for the ``approval`` subresource."""
    now = now or dt.datetime.now(dt.UTC)
    condition = {
        "type": "Approved",
        "status": "True",
        "reason": APPROVAL_REASON,
        "message": "multicluster-scheduler approved the serving certificate of its own "
        f"virtual kubelet (node {node_name})",
        "lastUpdateTime": format_time(now),
    }
    status = dict(csr.get("status") or {})
    status["conditions"] = [*(status.get("conditions") or ()), condition]
    return {**csr, "status": status}


def refusal(csr: dict) -> str | None:
    """Why the CSR will never be signed (a ``Denied`` or ``Failed`` condition), else None."""
    for condition in (csr.get("status") or {}).get("conditions") or ():
        if condition.get("type") in ("Denied", "Failed") and condition.get("status") == "True":
            verb = condition["type"].lower()
            why = condition.get("message") or "no message"
            return f"{verb} ({condition.get('reason') or 'no reason'}): {why}"
    return None


def issued_certificate(csr: dict) -> bytes | None:
    """The PEM certificate (maybe a chain, leaf first) the signer set, None while unsigned."""
    encoded = (csr.get("status") or {}).get("certificate")
    return base64.b64decode(encoded) if encoded else None


def serving_pair(certificate_pem: bytes, key: ec.EllipticCurvePrivateKey) -> KeyPair:
    """The whole chain with our key, once the leaf is checked to be for that key."""
    try:
        chain = x509.load_pem_x509_certificates(certificate_pem)
    except ValueError as e:
        raise ValueError(f"the issued certificate is not PEM: {e}") from e
    if public_der(chain[0].public_key()) != public_der(key.public_key()):
        raise ValueError("the issued certificate is for another key")
    pem = b"".join(cert.public_bytes(serialization.Encoding.PEM) for cert in chain)
    return KeyPair(pem, key_pem(key))


# -- obtaining it ------------------------------------------------------------------------------


class KubeletCertificates(ServingFiles):
    """Obtains, writes, reloads and renews the virtual kubelet's serving certificate.

    After :meth:`obtain`, ``issuer`` is ``"signer"`` or ``"agent-ca"`` and ``fallback_reason``
    says why the signer's was not used (None when it was). ``ca`` is the fallback CA or an
    async callable that returns it (called only when needed).
    """

    def __init__(
        self,
        *,
        client: Client,
        node_name: str,
        addresses: list[str],
        signer: str | None = KUBELET_SERVING_SIGNER,
        cert_dir: Path,
        ca: FallbackCA | None,
        timeout: float = 30.0,
        csr_prefix: str = "multicluster-scheduler-kubelet",
        expiration_seconds: int | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("a kubelet serving certificate needs at least one address")
        self.client = client
        self.node_name = node_name
        self.addresses = list(addresses)
        self.signer = signer or ""
        super().__init__(cert_dir)
        self.ca = ca
        self.timeout = timeout
        self.csr_prefix = csr_prefix
        self.expiration_seconds = expiration_seconds
        self.serving: KeyPair | None = None
        self.issuer: str | None = None
        self.fallback_reason: str | None = None

    async def obtain(self) -> None:
        """A new certificate from the signer, else from the CA; written, then reloaded."""
        if self.signer.lower() in SIGNER_OFF:
            reason = "no signer is configured"
            log.info("kubelet serving certificate from the agent CA: no signer configured")
        else:
            try:
                pair = await self._from_signer()
            except _NotSigned as e:
                reason = f"CertificateSigningRequest {e.csr} for signer {self.signer}: {e.reason}"
                log.warning(
                    "kubelet serving certificate from the agent CA instead of the signer "
                    "csr=%s signer=%s reason=%s",
                    e.csr,
                    self.signer,
                    e.reason,
                )
            else:
                self._install(pair, ISSUER_SIGNER, None)
                return
        self._install(await self._from_ca(reason), ISSUER_AGENT_CA, reason)

    async def renew_forever(self, check_every: float = 3600.0) -> None:
        while True:
            await asyncio.sleep(check_every)
            if self.serving is not None and not needs_renewal(self.serving):
                continue
            try:
                await self.obtain()
            except (ApiError, KubeletCertificateError) as e:
                log.warning(
                    "cannot renew the kubelet serving certificate, retry_in=%ss error=%s",
                    check_every,
                    e,
                )
            else:
                log.info("renewed kubelet serving certificate issuer=%s", self.issuer)

    # -- the signer's ------------------------------------------------------------------------

    async def _from_signer(self) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        name = csr_name(self.csr_prefix, key)
        request = certificate_request(key, self.node_name, self.addresses)
        body = csr_object(name, self.signer, request, self.expiration_seconds)
        try:
            created = await self.client.create(CSRS, body)
        except ApiError as e:
            raise _NotSigned(name, f"creating it was refused: {_error(e)}") from e
        try:
            pair = serving_pair(await self._signed(await self._approve(created)), key)
        except ApiError as e:
            raise _NotSigned(name, _error(e)) from e
        except ValueError as e:
            raise _NotSigned(name, str(e)) from e
        finally:
            await self._delete(name)
        log.info("kubelet serving certificate signed csr=%s signer=%s", name, self.signer)
        return pair

    async def _approve(self, csr: dict) -> dict:
        name = csr["metadata"]["name"]
        for _ in range(3):
            try:
                return await self.client.update(
                    CSRS, approved(csr, self.node_name), subresource="approval"
                )
            except Conflict:
                csr = await self.client.get(CSRS, name)
            except ApiError as e:
                raise _NotSigned(name, f"approving it was refused: {_error(e)}") from e
        raise _NotSigned(name, "approving it kept conflicting with other writers")

    async def _signed(self, csr: dict) -> bytes:
        """The certificate, watched for until set, refused or ``timeout`` seconds have passed."""
        name = csr["metadata"]["name"]
        try:
            async with asyncio.timeout(self.timeout):
                while True:
                    why = refusal(csr)
                    if why:
                        raise _NotSigned(name, why)
                    certificate = issued_certificate(csr)
                    if certificate:
                        return certificate
                    try:
                        csr = await self._next_version(csr)
                    except Gone:
                        csr = await self.client.get(CSRS, name)
        except TimeoutError:
            raise _NotSigned(
                name, f"not signed within {self.timeout:g}s (does a controller sign for it?)"
            ) from None

    async def _next_version(self, csr: dict) -> dict:
        """The CSR's next version, from a watch of that one name (its own version if the
        watch ends without one)."""
        meta = csr["metadata"]
        events = self.client.watch(
            CSRS,
            field_selector=f"metadata.name={meta['name']}",
            resource_version=meta["resourceVersion"],
            bookmarks=False,
            timeout_seconds=max(1, round(self.timeout)),
        )
        async with contextlib.aclosing(events):
            async for event in events:
                if event["type"] == "DELETED":
                    raise _NotSigned(meta["name"], "it was deleted before it was signed")
                if event["type"] in ("ADDED", "MODIFIED"):
                    return event["object"]
        return csr

    async def _delete(self, name: str) -> None:
        """Best effort: an answered CSR is of no further use to anyone."""
        try:
            await self.client.delete(CSRS, name, missing_ok=True)
        except ApiError as e:
            log.info("cannot delete certificatesigningrequest csr=%s error=%s", name, e)

    # -- the agent CA's ----------------------------------------------------------------------

    async def _from_ca(self, reason: str) -> KeyPair:
        if self.ca is None:
            raise KubeletCertificateError(
                f"no kubelet serving certificate: {reason}, and no CA to fall back on"
            )
        ca = self.ca if isinstance(self.ca, KeyPair) else await self.ca()
        return new_serving_certificate(ca, self.addresses, subject=kubelet_subject(self.node_name))

    # -- writing it --------------------------------------------------------------------------

    def _install(self, pair: KeyPair, issuer: str, fallback_reason: str | None) -> None:
        self.serving, self.issuer, self.fallback_reason = pair, issuer, fallback_reason
        self.install(pair)


def _error(error: ApiError) -> str:
    return f"{error.status} {error.message}" if error.status else str(error)
