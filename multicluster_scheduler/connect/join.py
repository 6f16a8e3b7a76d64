"""``multicluster-scheduler join``: connect a source cluster to a target in one command.

The user guide's three steps, in order, each idempotent (server-side apply): a Source (or
ClusterSource) in the target; once the target's agent has made its service account, that
account exported as a kubeconfig Secret into the source; a Target (or ClusterTarget) in the
source that uses the Secret. Then, by default, wait until the Target is Ready. Joining a cluster
to itself (the same context, or two contexts of one cluster) makes a self Target. Running join
twice changes nothing. An existing Secret of the same name is overwritten only when join or
export wrote it.

All or nothing: the namespaces are checked before anything is written, and when a step fails
(or the Target reports a failure, or the user interrupts), what this run created is deleted
again, newest first. What existed before stays, changed or not. Progress (what it waits for, the
Target's condition as it changes) goes to standard error; what was done to standard output.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import yaml

from multicluster import Resource
from multicluster.errors import Forbidden
from multicluster.resources import NAMESPACES, SECRETS, SERVICEACCOUNTS

from ..api.naming import virtual_node_name
from ..api.resources import CLUSTER_SOURCES, CLUSTER_TARGETS, SOURCES, TARGETS
from . import manifests
from .export import (
    DEFAULT_TOKEN_TIMEOUT,
    add_connection_arguments,
    export,
    namespace_exists,
)
from .kubeconfig import read_ca_file
from .problems import ConnectError, say
from .remote import FIELD_MANAGER, Context, open_context, poll

DEFAULT_CLUSTER_NAMESPACE = "admiralty"
DEFAULT_TIMEOUT = 60.0
# A Target that reports the same failure (Unreachable, Unauthorized…) for this long is given up
# on before the timeout: the agent retries, but a wrong address or token does not heal itself.
GIVE_UP_AFTER = 10.0
# Reasons of a Target still on its way, never a failure.
ON_ITS_WAY = {"Connecting", "Ready"}

EXAMPLES = """\
  # connect cluster1 (source) to cluster2 (target) in namespace default, as the user guide does
  multicluster-scheduler join --source-context cluster1 --target-context cluster2 -n default

  # every namespace of cluster1 (a ClusterSource and a ClusterTarget)
  multicluster-scheduler join --source-context cluster1 --target-context cluster2 \\
      --cluster-scoped

  # a cluster that the source's agent reaches at another address than your kubeconfig's
  multicluster-scheduler join --source-context cluster1 --target-context cluster2 -n default \\
      --server https://10.0.0.12:6443 --ca-file cluster2-ca.pem

  # the source itself as a target (a self Target: no Source, no Secret)
  multicluster-scheduler join --source-context cluster1 --target-context cluster1 -n default
"""

# What to do when a Target stays not Ready, by the reason the targets controller gives.
READY_HINTS = {
    "Unreachable": "the address in the Secret must be reachable from the source cluster's "
    "agent: join again with --server (and --ca-file) giving an address it can reach",
    "Unauthorized": "the target rejected the exported token: join again to export a fresh one",
    "Forbidden": "the service account lacks its bindings in the target: is the source "
    "controller enabled there (chart value sourceController.enabled)?",
    "SummaryMissing": "the target publishes no ClusterSummary: is the multicluster-scheduler "
    "agent running in the target?",
}
NO_STATUS_HINT = "nobody reported on it: is the multicluster-scheduler agent running in the source?"
STALE_HINT = (
    "it still reports the connection made with the previous Secret, nobody reconnected with the "
    "new one: is the multicluster-scheduler agent running in the source?"
)
# Every cluster has it; its uid tells whether two contexts reach the same cluster.
IDENTITY_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class JoinPlan:
    """What join writes where. The Source is named after the source cluster (the guide's
    ``c1``), the Target and its Secret after the target cluster (``c2``)."""

    source_context: str
    target_context: str
    cluster_scoped: bool
    namespace: str | None
    source_name: str
    service_account: str
    service_account_namespace: str
    target_name: str
    secret_namespace: str
    key: str = "config"
    # Two contexts found to reach the same cluster (see same_cluster).
    same_cluster: bool = False

    @property
    def self_target(self) -> bool:
        return self.same_cluster or self.source_context == self.target_context

    @property
    def secret_name(self) -> str:
        return self.target_name

    def source_manifest(self) -> dict:
        if self.cluster_scoped:
            return manifests.cluster_source(
                self.source_name, self.service_account, self.service_account_namespace
            )
        assert self.namespace is not None
        return manifests.source(self.source_name, self.namespace, self.service_account)

    def target_manifest(self) -> dict:
        secret = None if self.self_target else self.secret_name
        if self.cluster_scoped:
            return manifests.cluster_target(
                self.target_name,
                secret=secret,
                secret_namespace=self.secret_namespace,
                key=self.key,
            )
        assert self.namespace is not None
        return manifests.target(self.target_name, self.namespace, secret=secret, key=self.key)

    @property
    def virtual_node(self) -> str:
        return virtual_node_name(self.target_name, None if self.cluster_scoped else self.namespace)


def describe(kind: str, name: str, namespace: str | None) -> str:
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def plan_from(args: argparse.Namespace, default_namespace: str | None = None) -> JoinPlan:
    """The plan for parsed arguments; ``default_namespace``: the source context's namespace."""
    source_name = manifests.check_dns_label(
        args.name or manifests.name_from_context(args.source_context), "--name"
    )
    target_name = manifests.check_dns_label(
        args.target_name or manifests.name_from_context(args.target_context), "--target-name"
    )
    namespace = None if args.cluster_scoped else args.namespace or default_namespace or "default"
    return JoinPlan(
        source_context=args.source_context,
        target_context=args.target_context,
        cluster_scoped=args.cluster_scoped,
        namespace=namespace,
        source_name=source_name,
        service_account=args.service_account or source_name,
        service_account_namespace=namespace or args.service_account_namespace,
        target_name=target_name,
        secret_namespace=namespace or args.secret_namespace,
        key=getattr(args, "key", "config"),
    )


def ready_condition(target: dict) -> dict | None:
    """The Target's Ready condition, if it is about its current generation."""
    generation = target["metadata"].get("generation")
    for condition in (target.get("status") or {}).get("conditions") or ():
        if condition.get("type") != "Ready":
            continue
        observed = condition.get("observedGeneration")
        if observed is not None and generation is not None and observed < generation:
            return None
        return condition
    return None


def fresh_ready_condition(target: dict, stale: dict | None) -> dict | None:
    """``ready_condition``, except the Ready condition ``stale`` (read before join changed the
    Secret) while it stays as it was: it is about the connection made with the old Secret. The
    agent reconnects on every change of the Secret, reporting Connecting before Ready again, so
    a Ready that followed the change has another ``lastTransitionTime``."""
    condition = ready_condition(target)
    if (
        condition is not None
        and stale is not None
        and stale.get("status") == "True"
        and stale.get("lastTransitionTime")
        and condition.get("status") == "True"
        and condition.get("lastTransitionTime") == stale.get("lastTransitionTime")
    ):
        return None
    return condition


def not_ready_message(
    what: str, context: str, timeout: float, condition: dict | None, stale: bool = False
) -> str:
    if condition is None:
        hint = STALE_HINT if stale else NO_STATUS_HINT
        return f"{what} in context {context} not Ready after {timeout:g}s: {hint}"
    reason = condition.get("reason") or "Unknown"
    message = f"{what} in context {context} not Ready after {timeout:g}s: {reason}"
    if condition.get("message"):
        message += f" ({condition['message']})"
    advice = READY_HINTS.get(reason)
    return f"{message}; {advice}" if advice else message


@dataclass
class Made:
    """What one join run created, newest last, to delete again when a later step fails."""

    objects: list[tuple[Context, Resource, str, str | None, str | None]] = field(
        default_factory=list
    )

    def add(self, ctx: Context, resource: Resource, obj: dict) -> None:
        meta = obj["metadata"]
        self.objects.append((ctx, resource, meta["name"], meta.get("namespace"), meta.get("uid")))

    async def undo(self, report: Callable[[str], None]) -> list[str]:
        """Delete them, newest first; what could not be deleted, said as it is left."""
        left = []
        while self.objects:
            ctx, resource, name, namespace, uid = self.objects.pop()
            what = describe(resource.kind, name, namespace)
            try:
                if await ctx.delete(resource, name, namespace, uid):
                    report(f"{what} deleted in {ctx.name} (rolled back)")
            except ConnectError as e:
                left.append(f"{what} left in context {ctx.name} ({e})")
        return left


async def join(
    plan: JoinPlan,
    source: Context,
    target: Context,
    *,
    server: str | None = None,
    ca_pem: bytes | None = None,
    tls_server_name: str | None = None,
    wait: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    token_timeout: float = DEFAULT_TOKEN_TIMEOUT,
    report: Callable[[str], None] = print,
    progress: Callable[[str], None] = lambda _: None,
    rollback: bool = True,
    give_up_after: float = GIVE_UP_AFTER,
) -> None:
    """Connect the plan's source to its target; when a step fails (or the run is cancelled),
    delete what this run created, unless ``rollback`` is False."""
    made = Made()
    try:
        await _join(
            plan,
            source,
            target,
            made,
            server=server,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            wait=wait,
            timeout=timeout,
            token_timeout=token_timeout,
            report=report,
            progress=progress,
            give_up_after=give_up_after,
        )
    except (ConnectError, asyncio.CancelledError) as e:
        if not rollback or not made.objects:
            raise
        left = await made.undo(report)
        if isinstance(e, ConnectError) and left:
            raise ConnectError(f"{e}; not rolled back: {'; '.join(left)}") from e
        raise


async def _join(
    plan: JoinPlan,
    source: Context,
    target: Context,
    made: Made,
    *,
    server: str | None,
    ca_pem: bytes | None,
    tls_server_name: str | None,
    wait: bool,
    timeout: float,
    token_timeout: float,
    report: Callable[[str], None],
    progress: Callable[[str], None],
    give_up_after: float,
) -> None:
    if not plan.self_target:
        sameness = await same_cluster(source, target)
        if sameness:
            plan = replace(plan, same_cluster=True)
            report(
                f"contexts {source.name} and {target.name} reach the same cluster ({sameness}): "
                f"making a self Target"
            )
    await check_namespaces(plan, source, target)
    resource = CLUSTER_TARGETS if plan.cluster_scoped else TARGETS
    what = describe(resource.kind, plan.target_name, plan.namespace)
    stale: dict | None = None
    if not plan.self_target:
        await check_secret_is_ours(plan, source)
        before = await source.get(resource, plan.target_name, plan.namespace)
        ready_before = ready_condition(before) if before is not None else None
        secret_outcome = await _grant_and_export(
            plan,
            source,
            target,
            made,
            server=server,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            timeout=timeout,
            token_timeout=token_timeout,
            report=report,
            progress=progress,
        )
        if secret_outcome == "configured":
            stale = ready_before
    applied, outcome = await source.apply(resource, plan.target_manifest())
    if outcome == "created":
        made.add(source, resource, applied)
    report(f"{what} {outcome} in {source.name}")
    if wait:
        await wait_ready(plan, source, target, stale, timeout, report, progress, give_up_after)


async def check_namespaces(plan: JoinPlan, source: Context, target: Context) -> None:
    """Before anything is written: the namespaces join writes in exist (where it may read
    namespaces; the API server says so otherwise, and what was made is rolled back)."""
    needed: list[tuple[Context, str]] = []
    if plan.namespace:
        needed.append((source, plan.namespace))
        if not plan.self_target:
            needed.append((target, plan.namespace))
    elif not plan.self_target:
        needed += [(source, plan.secret_namespace), (target, plan.service_account_namespace)]
    for ctx, namespace in needed:
        if namespace and await namespace_exists(ctx, namespace) is False:
            raise ConnectError(
                f"namespace {namespace} not found in context {ctx.name}: create it first "
                f"(kubectl --context {ctx.name} create namespace {namespace}) or name another "
                f"one; nothing was written"
            )


def failing(condition: dict | None) -> str | None:
    """The reason of a Ready condition that reports a failure (not one on its way)."""
    if condition is None or condition.get("status") == "True":
        return None
    reason = condition.get("reason") or "Unknown"
    return None if reason in ON_ITS_WAY else reason


async def wait_ready(
    plan: JoinPlan,
    source: Context,
    target: Context,
    stale: dict | None,
    timeout: float,
    report: Callable[[str], None],
    progress: Callable[[str], None] = lambda _: None,
    give_up_after: float = GIVE_UP_AFTER,
) -> None:
    """Until the Target says Ready (a condition newer than ``stale``), or why not: at the
    timeout, or as soon as it has reported the same failure for ``give_up_after`` seconds."""
    resource = CLUSTER_TARGETS if plan.cluster_scoped else TARGETS
    what = describe(resource.kind, plan.target_name, plan.namespace)
    last: dict | None = None
    waiting_for_reconnection = False
    shown: tuple | None = None
    failure: tuple[str, float] | None = None  # (reason, since)
    started = time.monotonic()
    progress(f"waiting for {what} to be Ready (at most {timeout:g}s)")

    async def ready() -> bool | None:
        nonlocal last, waiting_for_reconnection, shown, failure
        current = await source.get(resource, plan.target_name, plan.namespace)
        if current is None:
            raise ConnectError(f"{what} disappeared from context {source.name} while waiting")
        last = fresh_ready_condition(current, stale)
        waiting_for_reconnection = last is None and ready_condition(current) is not None
        if last is not None and last.get("status") == "True":
            return True
        if last is not None and (last.get("reason"), last.get("message")) != shown:
            shown = (last.get("reason"), last.get("message"))
            progress(f"{what}: {shown[0] or 'Unknown'} ({shown[1] or 'no message'})")
        reason, now = failing(last), time.monotonic()
        if reason is None or failure is None or failure[0] != reason:
            failure = (reason, now) if reason else None
        elif now - failure[1] >= give_up_after:
            return False
        return None

    outcome = await poll(ready, timeout)
    if outcome is not True:
        waited = round(time.monotonic() - started, 1) if outcome is False else timeout
        message = not_ready_message(what, source.name, waited, last, waiting_for_reconnection)
        if not plan.self_target:
            message += await source_problem(plan, target)
        raise ConnectError(message)
    report(f"{what} Ready: virtual node {plan.virtual_node}")


async def cluster_uid(ctx: Context) -> str | None:
    """The uid of the context's kube-system namespace; None when the context may not read it."""
    try:
        namespace = await ctx.get(NAMESPACES, IDENTITY_NAMESPACE)
    except ConnectError as e:
        if isinstance(e.__cause__, Forbidden):
            return None
        raise
    return (namespace or {}).get("metadata", {}).get("uid") or None


async def same_cluster(source: Context, target: Context) -> str | None:
    """How we know that two contexts reach one cluster, or None when they do not: the uid of
    their kube-system namespace, or, when a context may not read it, the server address (and
    TLS server name) of both."""
    source_uid, target_uid = await cluster_uid(source), await cluster_uid(target)
    if source_uid and target_uid:
        if source_uid != target_uid:
            return None
        return f"{IDENTITY_NAMESPACE} namespace uid {source_uid}"
    a, b = source.cluster, target.cluster
    if (a.server, a.tls_server_name) == (b.server, b.tls_server_name):
        return f"server {a.server}"
    return None


def foreign_secret(secret: dict, key: str) -> str | None:
    """Why an existing Secret is not one that join or export wrote (so join must not overwrite
    it), or None when it is: labelled by them, applied by join's field manager, or an Opaque
    Secret holding nothing but a kubeconfig under ``key`` (one made step by step)."""
    meta = secret.get("metadata") or {}
    kind = secret.get("type") or "Opaque"
    if kind != "Opaque":
        return f"its type is {kind}"
    if all((meta.get("labels") or {}).get(k) == v for k, v in manifests.CREATED_BY.items()):
        return None
    for entry in meta.get("managedFields") or ():
        if entry.get("manager") == FIELD_MANAGER and entry.get("operation") == "Apply":
            return None
    data = secret.get("data") or {}
    others = sorted(k for k in data if k != key)
    if others:
        return f"it holds {', '.join(others)}"
    if key in data and not _is_kubeconfig(data[key]):
        return f"its {key} is not a kubeconfig"
    return None


def _is_kubeconfig(encoded: str) -> bool:
    try:
        document = yaml.safe_load(base64.b64decode(encoded, validate=True))
    except (binascii.Error, ValueError, yaml.YAMLError, RecursionError):
        return False
    return isinstance(document, dict) and ("clusters" in document or "contexts" in document)


async def check_secret_is_ours(plan: JoinPlan, source: Context) -> None:
    """Refuse, before writing anything, to overwrite a Secret join did not write."""
    existing = await source.get(SECRETS, plan.secret_name, plan.secret_namespace)
    if existing is None:
        return
    why = foreign_secret(existing, plan.key)
    if why is None:
        return
    where = describe("Secret", plan.secret_name, plan.secret_namespace)
    raise ConnectError(
        f"{where} already exists in context {source.name} and was not written by join or "
        f"export ({why}); join would overwrite it: name the Target and its Secret otherwise "
        f"with --target-name, or delete that Secret if it is a leftover"
    )


async def source_problem(plan: JoinPlan, target: Context) -> str:
    """What the target's Source says about itself when it is not Ready ("" otherwise)."""
    resource = CLUSTER_SOURCES if plan.cluster_scoped else SOURCES
    found = await target.get(resource, plan.source_name, plan.namespace)
    condition = ready_condition(found) if found else None
    if condition is None or condition.get("status") == "True":
        return ""
    what = describe(resource.kind, plan.source_name, plan.namespace)
    text = f"; {what} in context {target.name} is not Ready: {condition.get('reason')}"
    return text + (f" ({condition['message']})" if condition.get("message") else "")


async def _grant_and_export(
    plan: JoinPlan,
    source: Context,
    target: Context,
    made: Made,
    *,
    server: str | None,
    ca_pem: bytes | None,
    tls_server_name: str | None,
    timeout: float,
    token_timeout: float,
    report: Callable[[str], None],
    progress: Callable[[str], None],
) -> str:
    """Source, service account, Secret; returns what happened to the Secret."""
    resource = CLUSTER_SOURCES if plan.cluster_scoped else SOURCES
    applied, outcome = await target.apply(resource, plan.source_manifest())
    if outcome == "created":
        made.add(target, resource, applied)
    what = describe(resource.kind, plan.source_name, plan.namespace)
    report(f"{what} {outcome} in {target.name}")

    account_namespace, account = plan.service_account_namespace, plan.service_account

    async def account_exists() -> dict | None:
        return await target.get(SERVICEACCOUNTS, account, account_namespace)

    if await account_exists() is None:
        progress(
            f"waiting for service account {account_namespace}/{account} in {target.name} "
            f"(the agent there makes it for the {resource.kind})"
        )
    if await poll(account_exists, timeout) is None:
        raise ConnectError(
            f"service account {account_namespace}/{account} did not appear in context "
            f"{target.name} within {timeout:g}s: is multicluster-scheduler installed in "
            f"{target.name} with sourceController.enabled?" + await source_problem(plan, target)
        )
    tokens: list[dict] = []
    try:
        secret = await export(
            target,
            namespace=account_namespace,
            service_account=account,
            secret_name=plan.secret_name,
            key=plan.key,
            server=server,
            ca_pem=ca_pem,
            tls_server_name=tls_server_name,
            token_timeout=token_timeout,
            made=tokens,
        )
    finally:
        for token in tokens:
            made.add(target, SECRETS, token)
            where = describe("Secret", token["metadata"]["name"], account_namespace)
            report(
                f"{where} created in {target.name} (the token for {account_namespace}/{account})"
            )
    secret["metadata"]["namespace"] = plan.secret_namespace
    applied, outcome = await source.apply(SECRETS, secret)
    if outcome == "created":
        made.add(source, SECRETS, applied)
    where = describe("Secret", plan.secret_name, plan.secret_namespace)
    report(f"{where} {outcome} in {source.name} (kubeconfig of {account_namespace}/{account})")
    return outcome


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    """Which clusters, and the names of what join writes: shared by join and unjoin."""
    add = parser.add_argument
    add(
        "--source-context",
        required=True,
        metavar="CONTEXT",
        help="kubeconfig context of the source cluster (where pods are elected)",
    )
    add(
        "--target-context",
        required=True,
        metavar="CONTEXT",
        help="kubeconfig context of the target cluster (where delegates run)",
    )
    add(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config)",
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        help="namespace of the Source, Secret and Target, the same in both clusters "
        "(default: the source context's, else default)",
    )
    scope.add_argument(
        "--cluster-scoped",
        action="store_true",
        help="a ClusterSource and a ClusterTarget, for every namespace of the source (default: "
        "a namespaced Source and Target)",
    )
    add("--name", help="name of the Source (default: derived from the source context)")
    add(
        "--target-name",
        metavar="NAME",
        help="name of the Target and its Secret (default: derived from the target context)",
    )
    add(
        "--service-account",
        metavar="NAME",
        help="service account of the Source in the target (default: the Source's name)",
    )
    add(
        "--service-account-namespace",
        metavar="NAMESPACE",
        default=DEFAULT_CLUSTER_NAMESPACE,
        help="with --cluster-scoped: namespace of the service account in the target",
    )
    add(
        "--secret-namespace",
        metavar="NAMESPACE",
        default=DEFAULT_CLUSTER_NAMESPACE,
        help="with --cluster-scoped: namespace of the kubeconfig Secret in the source",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_plan_arguments(parser)
    add = parser.add_argument
    add("--key", default="config", help="data key of the kubeconfig in the Secret")
    add(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wait until the Target is Ready (default: --wait)",
    )
    add(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="seconds to wait for the service account, and for the Target to be Ready; a "
        f"Target that reports the same failure for {GIVE_UP_AFTER:g}s is given up on sooner",
    )
    add(
        "--rollback",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="when a step fails, delete what this run created (default: --rollback; "
        "--no-rollback keeps it to look into)",
    )
    add_connection_arguments(parser)


async def run(args: argparse.Namespace) -> None:
    ca_pem = read_ca_file(args.ca_file) if args.ca_file else None
    async with (
        open_context(args.kubeconfig, args.source_context) as source,
        open_context(args.kubeconfig, args.target_context) as target,
    ):
        plan = plan_from(args, source.cluster.namespace)
        await join(
            plan,
            source,
            target,
            server=args.server,
            ca_pem=ca_pem,
            tls_server_name=args.tls_server_name,
            wait=args.wait,
            timeout=args.timeout,
            token_timeout=args.token_timeout,
            report=say,
            progress=lambda line: say(line, sys.stderr),
            rollback=args.rollback,
        )


def main(args: argparse.Namespace) -> int:
    try:
        asyncio.run(run(args))
    except ConnectError as e:
        say(f"error: {e}", sys.stderr)
        return 1
    return 0
