"""``multicluster-scheduler export``: a service account of this cluster as a kubeconfig Secret.

The token is a long-lived service-account token held in a ``kubernetes.io/service-account-token``
Secret, as ``kubemcsa export`` used. Clusters since Kubernetes 1.24 no longer make one per
service account, so when none exists export creates ``<service account>-token`` and waits for
the token controller (in kube-controller-manager) to fill it; one that exists is reused, so
exporting twice prints the same Secret.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import sys

from multicluster.errors import Forbidden
from multicluster.resources import NAMESPACES, SECRETS, SERVICEACCOUNTS

from .kubeconfig import exported_cluster, read_ca_file, service_account_kubeconfig
from .manifests import CREATED_BY, kubeconfig_secret, name_from_context, to_yaml
from .problems import ConnectError, say
from .remote import Context, open_context, poll

TOKEN_TYPE = "kubernetes.io/service-account-token"
SERVICE_ACCOUNT_NAME = "kubernetes.io/service-account.name"
SERVICE_ACCOUNT_UID = "kubernetes.io/service-account.uid"
# Set by the legacy token cleaner on tokens it has invalidated (Kubernetes 1.29 and later).
INVALID_SINCE = "kubernetes.io/legacy-token-invalid-since"
DEFAULT_TOKEN_TIMEOUT = 10.0

EXAMPLES = """\
  # in the target: the service account c1 of namespace default, as the Secret c2 in the source
  multicluster-scheduler export c1 --as c2 -n default --context cluster2 \\
      | kubectl --context cluster1 -n default apply -f -

  # the same, for a source whose agent reaches the target at another address
  multicluster-scheduler export c1 --as c2 -n default --context cluster2 \\
      --server https://10.0.0.12:6443 | kubectl --context cluster1 -n default apply -f -
"""


def token_secret_for(secret: dict, service_account: dict) -> bool:
    """Whether ``secret`` is a usable token Secret of ``service_account`` (filled or not)."""
    meta = secret.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    account = service_account["metadata"]
    uid = annotations.get(SERVICE_ACCOUNT_UID)
    return (
        secret.get("type") == TOKEN_TYPE
        and annotations.get(SERVICE_ACCOUNT_NAME) == account["name"]
        and (not uid or uid == account.get("uid"))
        and INVALID_SINCE not in (meta.get("labels") or {})
        and not meta.get("deletionTimestamp")
    )


def token_of(secret: dict) -> str | None:
    encoded = (secret.get("data") or {}).get("token")
    return base64.b64decode(encoded).decode() if encoded else None


def token_secret_manifest(service_account: str, namespace: str, name: str | None = None) -> dict:
    metadata: dict = {
        "namespace": namespace,
        "annotations": {SERVICE_ACCOUNT_NAME: service_account},
        "labels": dict(CREATED_BY),
    }
    if name:
        metadata["name"] = name
    else:
        metadata["generateName"] = f"{service_account[:240]}-token-"
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": TOKEN_TYPE}


def missing_service_account(namespace: str, name: str, context: str) -> str:
    return (
        f"service account {namespace}/{name} not found in context {context}: create a Source "
        f"for it (the agent makes it) or create it yourself"
    )


def missing_namespace(namespace: str, context: str) -> str:
    return (
        f"namespace {namespace} not found in context {context}: give the namespace of the "
        f"service account with -n (kubectl --context {context} get namespaces lists them)"
    )


async def namespace_exists(ctx: Context, namespace: str) -> bool | None:
    """Whether the namespace exists; None when the context may not read it."""
    try:
        return await ctx.get(NAMESPACES, namespace) is not None
    except ConnectError as e:
        if isinstance(e.__cause__, Forbidden):
            return None
        raise


async def read_service_account(ctx: Context, namespace: str, name: str) -> dict:
    account = await ctx.get(SERVICEACCOUNTS, name, namespace)
    if account is None:
        if await namespace_exists(ctx, namespace) is False:
            raise ConnectError(missing_namespace(namespace, ctx.name))
        raise ConnectError(missing_service_account(namespace, name, ctx.name))
    return account


async def token_secret(
    ctx: Context,
    namespace: str,
    name: str,
    timeout: float = DEFAULT_TOKEN_TIMEOUT,
    made: list[dict] | None = None,
) -> dict:
    """A filled token Secret of service account ``namespace/name``: an existing one (the oldest),
    or one created now (appended to ``made``) and filled by the token controller within
    ``timeout`` seconds."""
    account = await read_service_account(ctx, namespace, name)
    listed, _ = await ctx.call(
        f"list Secrets in namespace {namespace}",
        ctx.client.list(SECRETS, namespace, field_selector=f"type={TOKEN_TYPE}"),
    )
    # The legacy reference first (before 1.24 the controller made one and listed it in the
    # service account), then the oldest: the same Secret every time.
    legacy = {ref.get("name") for ref in account.get("secrets") or ()}
    candidates = sorted(
        (s for s in listed if token_secret_for(s, account)),
        key=lambda s: (
            s["metadata"]["name"] not in legacy,
            s["metadata"].get("creationTimestamp", ""),
            s["metadata"]["name"],
        ),
    )
    for secret in candidates:
        if token_of(secret):
            return secret
    if candidates:
        secret = candidates[0]
    else:
        secret = await _create_token_secret(ctx, namespace, name)
        if made is not None:
            made.append(secret)
    return await _wait_filled(ctx, secret, timeout)


async def _create_token_secret(ctx: Context, namespace: str, name: str) -> dict:
    doing = f"create token Secret {namespace}/{name}-token"
    manifest = token_secret_manifest(name, namespace, f"{name}-token")
    if len(manifest["metadata"]["name"]) > 253:
        manifest = token_secret_manifest(name, namespace)
    existing = await ctx.get(SECRETS, manifest["metadata"].get("name", ""), namespace)
    if existing is not None:
        # Taken by a Secret that is not this account's token: let the server pick a name.
        manifest = token_secret_manifest(name, namespace)
    return await ctx.call(doing, ctx.client.create(SECRETS, manifest, namespace))


async def _wait_filled(ctx: Context, secret: dict, timeout: float) -> dict:
    meta = secret["metadata"]
    namespace, name = meta["namespace"], meta["name"]

    async def filled() -> dict | None:
        current = await ctx.get(SECRETS, name, namespace)
        if current is None:
            raise ConnectError(
                f"token Secret {namespace}/{name} disappeared in context {ctx.name}: the token "
                f"controller deletes tokens of service accounts that no longer exist"
            )
        return current if token_of(current) else None

    found = await poll(filled, timeout)
    if found is None:
        raise ConnectError(
            f"token Secret {namespace}/{name} in context {ctx.name} was not filled within "
            f"{timeout:g}s: is kube-controller-manager's token controller running (it needs "
            f"--service-account-private-key-file)?"
        )
    return found


async def export(
    ctx: Context,
    *,
    namespace: str,
    service_account: str,
    secret_name: str,
    key: str = "config",
    server: str | None = None,
    ca_pem: bytes | None = None,
    tls_server_name: str | None = None,
    token_timeout: float = DEFAULT_TOKEN_TIMEOUT,
    made: list[dict] | None = None,
) -> dict:
    """The Secret (without namespace) holding a kubeconfig for ``namespace/service_account``;
    a token Secret created for it is appended to ``made``."""
    secret = await token_secret(ctx, namespace, service_account, token_timeout, made)
    token_ca = (secret.get("data") or {}).get("ca.crt")
    cluster = exported_cluster(
        ctx.cluster,
        server=server,
        ca_pem=ca_pem,
        token_ca_pem=base64.b64decode(token_ca) if token_ca else None,
        tls_server_name=tls_server_name,
    )
    kubeconfig = service_account_kubeconfig(
        name_from_context(ctx.name),
        cluster,
        token_of(secret) or "",
        namespace,
        service_account,
    )
    return kubeconfig_secret(secret_name, kubeconfig, key=key)


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Options that say how a source reaches the target, shared by export and join."""
    add = parser.add_argument
    add(
        "--server",
        metavar="URL",
        help="API server address as the source cluster's agent reaches it "
        "(default: the one of the kubeconfig context)",
    )
    add(
        "--ca-file",
        metavar="FILE",
        help="PEM CA certificate that signs that server's certificate (default: the one "
        "next to the token, else the kubeconfig context's)",
    )
    add(
        "--tls-server-name",
        metavar="NAME",
        help="name to verify the server's certificate against, when it is not the host of "
        "--server (default: the kubeconfig context's, unless --server gives another address)",
    )
    add(
        "--token-timeout",
        type=float,
        default=DEFAULT_TOKEN_TIMEOUT,
        metavar="SECONDS",
        help="seconds to wait for the token controller to fill a new token Secret",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("service_account", metavar="SERVICE_ACCOUNT", help="service account to export")
    add(
        "--as",
        dest="secret_name",
        required=True,
        metavar="SECRET_NAME",
        help="name of the Secret printed (the name a Target's kubeconfigSecret gives)",
    )
    add(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )
    add(
        "--context",
        help="kubeconfig context of the cluster of the service account (default: the current one)",
    )
    add(
        "-n",
        "--namespace",
        help="namespace of the service account (default: the context's, else default)",
    )
    add("--key", default="config", help="data key of the kubeconfig in the Secret")
    add_connection_arguments(parser)


async def run(args: argparse.Namespace) -> dict:
    ca_pem = read_ca_file(args.ca_file) if args.ca_file else None
    async with open_context(args.kubeconfig, args.context) as ctx:
        return await export(
            ctx,
            namespace=args.namespace or ctx.cluster.namespace or "default",
            service_account=args.service_account,
            secret_name=args.secret_name,
            key=args.key,
            server=args.server,
            ca_pem=ca_pem,
            tls_server_name=args.tls_server_name,
            token_timeout=args.token_timeout,
        )


def main(args: argparse.Namespace) -> int:
    try:
        secret = asyncio.run(run(args))
    except ConnectError as e:
        say(f"error: {e}", sys.stderr)
        return 1
    sys.stdout.write(to_yaml(secret))
    return 0
