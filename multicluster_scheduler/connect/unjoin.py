"""``multicluster-scheduler unjoin``: disconnect a source cluster from a target, join undone.

In this order, each step once the one before has finished:

1. the Target (or ClusterTarget) in the source. The source's agent then deletes the delegates
   and copies it made in the target and the virtual node, with the credentials it still holds.
   unjoin waits until the virtual node is gone, since deleting the Secret or the Source first
   would take those credentials away and leave delegates running in the target;
2. the kubeconfig Secret in the source, if join or export wrote it and no other Target (of
   either kind) uses it;
3. the Source (or ClusterSource) in the target. The target's agent made its service account
   and bindings, and Kubernetes deletes them with it;
4. the token Secret that export made in the target for that service account. Deleting it
   revokes the token even when the service account was made by hand and stays.

Nothing else is touched: a Secret that join did not write, a service account made by hand.
Before the Target goes, unjoin says how many pods run in that target (proxy pods bound to its
virtual node): their delegates are deleted with it, and their owners make new pods, which go to
another target or wait Pending. ``--dry-run`` says all that and deletes nothing. Running unjoin
twice is harmless: the second run finds nothing to delete, and says so as an error (exit code
1) naming the Targets that do exist, as it does when the names given are not those join was
given. When the target does not answer, the source side is still disconnected, and the error
names what is left in the target.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

from multicluster import Resource
from multicluster.errors import Forbidden
from multicluster.resources import NODES, PODS, SECRETS

from ..api.resources import CLUSTER_SOURCES, CLUSTER_TARGETS, SOURCES, TARGETS
from .export import SERVICE_ACCOUNT_NAME, TOKEN_TYPE
from .join import (
    DEFAULT_TIMEOUT,
    JoinPlan,
    add_plan_arguments,
    describe,
    foreign_secret,
    plan_from,
    same_cluster,
)
from .manifests import CREATED_BY
from .problems import ConnectError, say
from .remote import Context, open_context, poll

EXAMPLES = """\
  # see what would be removed, then remove it
  multicluster-scheduler unjoin --source-context cluster1 --target-context cluster2 -n default \\
      --dry-run
  multicluster-scheduler unjoin --source-context cluster1 --target-context cluster2 -n default

  # undo a cluster-scoped join
  multicluster-scheduler unjoin --source-context cluster1 --target-context cluster2 \\
      --cluster-scoped
"""


@dataclass(frozen=True)
class Doomed:
    """An object that unjoin deletes (or, with --dry-run, would delete)."""

    ctx: Context
    resource: Resource
    obj: dict
    note: str = ""

    @property
    def what(self) -> str:
        meta = self.obj["metadata"]
        return describe(self.resource.kind, meta["name"], meta.get("namespace"))

    async def delete(self, dry_run: bool, report: Callable[[str], None]) -> None:
        note = f" ({self.note})" if self.note else ""
        if dry_run:
            report(f"{self.what} would be deleted in {self.ctx.name}{note}")
            return
        meta = self.obj["metadata"]
        gone = await self.ctx.delete(
            self.resource, meta["name"], meta.get("namespace"), meta.get("uid")
        )
        report(f"{self.what} {'deleted' if gone else 'already gone'} in {self.ctx.name}{note}")


def secret_of(plan: JoinPlan, target: dict | None) -> tuple[str, str | None]:
    """The kubeconfig Secret a Target uses: the one its spec names, else the one join names."""
    ref = ((target or {}).get("spec") or {}).get("kubeconfigSecret") or {}
    namespace = plan.namespace or ref.get("namespace") or plan.secret_namespace
    return ref.get("name") or plan.secret_name, namespace


def secret_users(targets: list[dict], name: str, namespace: str | None, but: str) -> list[str]:
    """The Targets other than ``but`` that use the Secret ``namespace/name``."""
    users = []
    for target in targets:
        meta = target["metadata"]
        ref = (target.get("spec") or {}).get("kubeconfigSecret") or {}
        if meta["name"] == but or ref.get("name") != name:
            continue
        if (meta.get("namespace") or ref.get("namespace")) == namespace:
            users.append(meta["name"])
    return sorted(users)


def exported_token(secret: dict, service_account: str) -> bool:
    """Whether ``secret`` is a token Secret that export made for ``service_account``."""
    meta = secret.get("metadata") or {}
    labels = meta.get("labels") or {}
    return (
        secret.get("type") == TOKEN_TYPE
        and all(labels.get(k) == v for k, v in CREATED_BY.items())
        and (meta.get("annotations") or {}).get(SERVICE_ACCOUNT_NAME) == service_account
    )


async def source_side(
    plan: JoinPlan, source: Context, report: Callable[[str], None]
) -> tuple[list[Doomed], dict | None]:
    """The Target and its Secret (when ours and no other Target's), and the Target."""
    resource = CLUSTER_TARGETS if plan.cluster_scoped else TARGETS
    found: list[Doomed] = []
    target = await source.get(resource, plan.target_name, plan.namespace)
    if target is None:
        report(
            f"{describe(resource.kind, plan.target_name, plan.namespace)} not found in "
            f"{source.name}"
        )
    else:
        found.append(Doomed(source, resource, target))
    if plan.self_target or ((target or {}).get("spec") or {}).get("self"):
        return found, target
    name, namespace = secret_of(plan, target)
    secret = await source.get(SECRETS, name, namespace)
    where = describe("Secret", name, namespace)
    if secret is None:
        report(f"{where} not found in {source.name}")
        return found, target
    why = foreign_secret(secret, plan.key)
    if why is not None:
        report(f"{where} kept in {source.name}: join or export did not write it ({why})")
        return found, target
    listed, _ = await source.call(
        f"list {resource.kind}s", source.client.list(resource, plan.namespace), resource=resource
    )
    users = [
        f"{resource.kind} {u}" for u in secret_users(listed, name, namespace, plan.target_name)
    ]
    # Targets of the other kind may use it too: ClusterTargets name a Secret of any namespace,
    # and a namespace's Targets one of their own (the namespace a ClusterTarget's Secret is in).
    other = TARGETS if plan.cluster_scoped else CLUSTER_TARGETS
    try:
        others, _ = await source.call(
            f"list {other.kind}s",
            source.client.list(other, namespace if other.namespaced else None),
            resource=other,
        )
    except ConnectError as e:
        if not isinstance(e.__cause__, Forbidden):
            raise
        others = []  # a namespace's tenant may not read ClusterTargets: none is theirs to keep
    users += [f"{other.kind} {user}" for user in secret_users(others, name, namespace, "")]
    if users:
        verb = "uses" if len(users) == 1 else "use"
        report(f"{where} kept in {source.name}: {', '.join(users)} {verb} it too")
    else:
        found.append(Doomed(source, SECRETS, secret))
    return found, target


async def other_targets(plan: JoinPlan, source: Context) -> list[str]:
    """The names of the Targets (or ClusterTargets) that exist where the one asked for does not
    (none when they may not be listed)."""
    resource = CLUSTER_TARGETS if plan.cluster_scoped else TARGETS
    try:
        listed, _ = await source.call(
            f"list {resource.kind}s",
            source.client.list(resource, plan.namespace),
            resource=resource,
        )
    except ConnectError as e:
        if isinstance(e.__cause__, Forbidden):
            return []
        raise
    return sorted(t["metadata"]["name"] for t in listed)


def nothing_to_unjoin(plan: JoinPlan, source: Context, others: list[str]) -> str:
    kind = "ClusterTarget" if plan.cluster_scoped else "Target"
    asked = describe(kind, plan.target_name, plan.namespace)
    where = f"namespace {plan.namespace} of {source.name}" if plan.namespace else source.name
    if not others:
        return (
            f"nothing to unjoin: {asked} not found, and no {kind} is in {where} (unjoined already?)"
        )
    plural = "s" if len(others) > 1 else ""
    return (
        f"nothing to unjoin: {asked} not found in {source.name}; the {kind}{plural} in {where}: "
        f"{', '.join(others)}. Give the names join was given: --target-name for the {kind} "
        f"(and --name for its Source in the target, if join had one)"
    )


async def pods_sent_back(
    plan: JoinPlan, source: Context, target: dict, dry_run: bool
) -> str | None:
    """What deleting ``target`` does to the pods that run there: a line, or None when none runs
    (or they may not be listed)."""
    node = plan.virtual_node
    try:
        bound, _ = await source.call(
            f"list the pods bound to virtual node {node}",
            source.client.list(PODS, plan.namespace, field_selector=f"spec.nodeName={node}"),
        )
    except ConnectError as e:
        if isinstance(e.__cause__, Forbidden):
            return None
        raise
    running = [
        p
        for p in bound
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    if not running:
        return None
    orphans = sum(
        not any(r.get("controller") for r in p["metadata"].get("ownerReferences") or ())
        for p in running
    )
    count = len(running)
    pods = f"{count} pod{'s' if count > 1 else ''}"
    name = target["metadata"]["name"]
    verb = "would be" if dry_run else "are"
    line = (
        f"{pods} {'run' if count > 1 else 'runs'} in target {name} (bound to virtual node "
        f"{node}): {'their' if count > 1 else 'its'} delegates there {verb} deleted with the "
        f"Target, and {'their owners make' if count > 1 else 'its owner makes'} new pods, which "
        f"go to another target or wait Pending"
    )
    if orphans:
        line += f"; {orphans} without an owner {'is' if orphans == 1 else 'are'} deleted for good"
    return line


async def target_side(
    plan: JoinPlan, target: Context, report: Callable[[str], None]
) -> list[Doomed]:
    """The Source, and the token Secrets export made for its service account."""
    resource = CLUSTER_SOURCES if plan.cluster_scoped else SOURCES
    found: list[Doomed] = []
    source = await target.get(resource, plan.source_name, plan.namespace)
    if source is None:
        report(
            f"{describe(resource.kind, plan.source_name, plan.namespace)} not found in "
            f"{target.name}"
        )
    else:
        found.append(
            Doomed(target, resource, source, "its service account and bindings go with it")
        )
    namespace = plan.service_account_namespace
    listed, _ = await target.call(
        f"list Secrets in namespace {namespace}",
        target.client.list(SECRETS, namespace, field_selector=f"type={TOKEN_TYPE}"),
    )
    for secret in sorted(listed, key=lambda s: s["metadata"]["name"]):
        if exported_token(secret, plan.service_account):
            note = f"the token export made for {namespace}/{plan.service_account}"
            found.append(Doomed(target, SECRETS, secret, note))
    return found


async def node_gone(
    plan: JoinPlan, source: Context, timeout: float, progress: Callable[[str], None]
) -> bool:
    """Whether the Target's virtual node is gone within ``timeout`` (the agent deletes it last,
    once it has deleted the delegates and copies of that target). Who may not read nodes (a
    namespace's tenant) waits until no pod of the namespace is bound to it."""
    node = plan.virtual_node
    try:
        await source.get(NODES, node)
    except ConnectError as e:
        if not isinstance(e.__cause__, Forbidden) or plan.namespace is None:
            raise

        async def check() -> bool | None:
            bound, _ = await source.call(
                f"list pods in namespace {plan.namespace}",
                source.client.list(PODS, plan.namespace, field_selector=f"spec.nodeName={node}"),
            )
            return True if not bound else None

        what = f"the pods of namespace {plan.namespace} bound to virtual node {node}"
    else:

        async def check() -> bool | None:
            return True if await source.get(NODES, node) is None else None

        what = f"virtual node {node} with what it made in the target"
    if await check():
        return True
    progress(f"waiting for the agent to delete {what} (at most {timeout:g}s)")
    return bool(await poll(check, timeout))


async def unjoin(
    plan: JoinPlan,
    source: Context,
    target: Context,
    *,
    dry_run: bool = False,
    wait: bool = True,
    timeout: float = DEFAULT_TIMEOUT,
    report: Callable[[str], None] = print,
    progress: Callable[[str], None] = lambda _: None,
) -> None:
    if not plan.self_target:
        try:
            sameness = await same_cluster(source, target)
        except ConnectError:  # the target does not answer: disconnect the source all the same
            sameness = None
        if sameness:
            plan = replace(plan, same_cluster=True)
            report(f"contexts {source.name} and {target.name} reach the same cluster ({sameness})")
    on_source, target_obj = await source_side(plan, source, report)
    others = [] if target_obj is not None else await other_targets(plan, source)
    if target_obj is not None:
        line = await pods_sent_back(plan, source, target_obj, dry_run)
        if line:
            report(line)
    node = plan.virtual_node
    for doomed in on_source:
        await doomed.delete(dry_run, report)
        if doomed.resource in (TARGETS, CLUSTER_TARGETS) and not dry_run and wait:
            if not await node_gone(plan, source, timeout, progress):
                raise ConnectError(
                    f"virtual node {node} is still in context {source.name} {timeout:g}s after "
                    f"its {doomed.what} was deleted: is the multicluster-scheduler agent running "
                    f"in the source? Nothing else was deleted, so that the agent can still delete "
                    f"its delegates in {target.name}; run unjoin again later, or with --no-wait "
                    f"to delete the rest now (the delegates may then stay in {target.name})"
                )
            report(f"virtual node {node} deleted by the agent, with its delegates and copies")
    if plan.self_target or ((target_obj or {}).get("spec") or {}).get("self"):
        if not on_source:
            raise ConnectError(nothing_to_unjoin(plan, source, others))
        return
    try:
        on_target = await target_side(plan, target, report)
        for doomed in on_target:
            await doomed.delete(dry_run, report)
    except ConnectError as e:
        done = "checked" if dry_run else "disconnected"
        raise ConnectError(
            f"{e}; the source side is {done}, but the Source and token of "
            f"{plan.service_account_namespace}/{plan.service_account} may be left in context "
            f"{target.name}: run unjoin again once it answers"
        ) from e
    if not on_source and not on_target:
        raise ConnectError(nothing_to_unjoin(plan, source, others))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_plan_arguments(parser)
    add = parser.add_argument
    add(
        "--dry-run",
        action="store_true",
        help="say what would be deleted, delete nothing (default: delete)",
    )
    add(
        "--wait",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after deleting the Target, wait until the agent has deleted its virtual node, "
        "delegates and copies, before the credentials it uses go (default: --wait)",
    )
    add(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="seconds to wait for the virtual node to go",
    )


async def run(args: argparse.Namespace) -> None:
    async with (
        open_context(args.kubeconfig, args.source_context) as source,
        open_context(args.kubeconfig, args.target_context) as target,
    ):
        await unjoin(
            plan_from(args, source.cluster.namespace),
            source,
            target,
            dry_run=args.dry_run,
            wait=args.wait,
            timeout=args.timeout,
            report=say,
            progress=lambda line: say(line, sys.stderr),
        )


def main(args: argparse.Namespace) -> int:
    try:
        asyncio.run(run(args))
    except ConnectError as e:
        say(f"error: {e}", sys.stderr)
        return 1
    return 0
