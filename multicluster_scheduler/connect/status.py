"""``multicluster-scheduler status`` (and ``kubectl multicluster status``): how scheduling goes in
one source cluster, read from it alone.

It lists the Targets and ClusterTargets, their virtual nodes and the proxy pods (a few API
calls, all at once), looks up the owners of ReplicaSets and Jobs so that pods are counted by
Deployment and CronJob, and prints the report that :mod:`.status_report` computes. Only what
the report cannot do without is required: a user who may not read nodes or ClusterTargets (a
namespace's tenant, say) gets the rest and a warning saying what is missing.

Exit codes: 0 every target listed is Ready (or none is listed), 3 some target is not Ready,
1 the cluster could not be read (a missing context or namespace, no answer, refused), 2 a
usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable
from typing import Any, cast

from multicluster.errors import Forbidden
from multicluster.resources import JOBS, NAMESPACES, NODES, PODS, REPLICASETS, Resource

from ..api import keys
from ..api.proxy import PROXY_FIELD_SELECTOR
from ..api.resources import CLUSTER_TARGETS, TARGETS
from .problems import ConnectError, say
from .remote import Context, open_context
from .status_render import render, use_colour
from .status_report import (
    EXIT_ERROR,
    RESOLVED_OWNERS,
    Controllers,
    Observed,
    build_report,
    exit_code,
)

OWNER_RESOURCES = {"ReplicaSet": REPLICASETS, "Job": JOBS}
OWNER_LOOKUPS = 16  # owners read at once
VIRTUAL_NODES = f"{keys.PROVIDER_KEY}={keys.PROVIDER}"

EXAMPLES = """\
  # targets of the current context's namespace, and where its elected pods run
  multicluster-scheduler status

  # every namespace of cluster1, as a kubectl plugin (kubectl-multicluster on the PATH)
  kubectl multicluster status --context cluster1 -A

  # for a script: is every target Ready? (exit code 3 when one is not)
  multicluster-scheduler status -n prod -o json | jq '.targets[] | select(.ready | not)'
"""


def _forbidden(error: ConnectError) -> Forbidden | None:
    cause = error.__cause__
    return cause if isinstance(cause, Forbidden) else None


async def _list(
    ctx: Context, resource: Resource, doing: str, namespace: str | None, **options: Any
) -> list[dict]:
    items, _ = await ctx.call(
        doing, ctx.client.list(resource, namespace, **options), resource=resource
    )
    return items


async def _optional(
    read: Awaitable[list[dict]], what: str, left_out: str
) -> tuple[list[dict] | None, str | None]:
    """What ``read`` lists; when that is forbidden, None and a warning."""
    try:
        return await read, None
    except ConnectError as e:
        refused = _forbidden(e)
        if refused is None:
            raise
        return None, f"cannot {what} (403 Forbidden: {refused.message}): {left_out}"


async def _check_namespace(ctx: Context, namespace: str) -> None:
    try:
        found = await ctx.get(NAMESPACES, namespace)
    except ConnectError as e:
        if _forbidden(e):
            return  # may not read namespaces: the lists below still say what they can
        raise
    if found is None:
        raise ConnectError(f"namespace {namespace} does not exist in context {ctx.name}")


async def controllers_of(ctx: Context, proxies: list[dict], warnings: list[str]) -> Controllers:
    """The controllers of the ReplicaSets and Jobs that own proxy pods (one read each, a few at
    once); those that cannot be read keep their own name, with one warning per kind."""
    wanted = set()
    for pod in proxies:
        meta = pod["metadata"]
        for ref in meta.get("ownerReferences") or ():
            if ref.get("controller") and ref.get("kind") in RESOLVED_OWNERS:
                wanted.add((ref["kind"], meta.get("namespace") or "", ref.get("name"), ref["uid"]))
    limit = asyncio.Semaphore(OWNER_LOOKUPS)
    failed: dict[str, str] = {}
    found: Controllers = {}

    async def look_up(kind: str, namespace: str, name: str, uid: str) -> None:
        async with limit:
            try:
                owner = await ctx.get(OWNER_RESOURCES[kind], name, namespace)
            except ConnectError as e:
                refused = _forbidden(e)
                why = f"403 Forbidden: {refused.message}" if refused else str(e)
                failed.setdefault(kind, f"cannot read {kind} {namespace}/{name} ({why})")
                return
        if owner is None or owner["metadata"].get("uid") != uid:
            return
        for ref in owner["metadata"].get("ownerReferences") or ():
            if ref.get("controller") and ref.get("kind") and ref.get("name"):
                found[(kind, namespace, name)] = (ref["kind"], ref["name"])

    await asyncio.gather(*(look_up(*key) for key in sorted(wanted)))
    for kind, why in sorted(failed.items()):
        warnings.append(f"{why}: pods of such {kind}s are counted by {kind}")
    return found


async def observe(ctx: Context, namespace: str | None) -> Observed:
    """Read what the report needs from the source cluster (``namespace`` None: all of them)."""
    where = f"namespace {namespace}" if namespace else "all namespaces"
    results = await asyncio.gather(
        _check_namespace(ctx, namespace) if namespace else asyncio.sleep(0),
        _list(ctx, TARGETS, f"list Targets in {where}", namespace),
        _optional(
            _list(ctx, CLUSTER_TARGETS, "list ClusterTargets", None),
            f"list ClusterTargets in context {ctx.name}",
            "they are left out",
        ),
        _optional(
            _list(ctx, NODES, "list virtual nodes", None, label_selector=VIRTUAL_NODES),
            f"list nodes in context {ctx.name}",
            "the virtual nodes' readiness and allocatable are not shown",
        ),
        _list(
            ctx, PODS, f"list proxy pods in {where}", namespace, field_selector=PROXY_FIELD_SELECTOR
        ),
        return_exceptions=True,
    )
    for result in results:  # the first failure in the order above says the most
        if isinstance(result, BaseException):
            raise result
    _, targets, (cluster_targets, no_cluster_targets), (nodes, no_nodes), proxies = cast(
        tuple[None, list[dict], tuple, tuple, list[dict]], results
    )
    warnings = [w for w in (no_cluster_targets, no_nodes) if w]
    controllers = await controllers_of(ctx, proxies, warnings)
    return Observed(
        context=ctx.name,
        namespace=namespace,
        targets=targets,
        cluster_targets=cluster_targets or [],
        nodes=nodes,
        proxies=proxies,
        controllers=controllers,
        warnings=warnings,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
    add("--context", help="kubeconfig context of the source cluster (default: the current one)")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        help="namespace of the Targets and workloads shown, besides every ClusterTarget "
        "(default: the context's, else default)",
    )
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="Targets and workloads of every namespace (default: off)",
    )
    add(
        "-o",
        "--output",
        choices=("table", "json", "yaml"),
        default="table",
        help="tables for people; json or yaml (the schema in docs/reference.md) for scripts",
    )


async def run(args: argparse.Namespace) -> dict:
    async with open_context(args.kubeconfig, args.context) as ctx:
        namespace = None
        if not args.all_namespaces:
            namespace = args.namespace or ctx.cluster.namespace or "default"
        return build_report(await observe(ctx, namespace))


def main(args: argparse.Namespace) -> int:
    try:
        report = asyncio.run(run(args))
    except ConnectError as e:
        say(f"error: {e}", sys.stderr)
        return EXIT_ERROR
    for warning in report["warnings"]:
        say(f"warning: {warning}", sys.stderr)
    sys.stdout.write(render(report, args.output, colour=use_colour(sys.stdout)))
    sys.stdout.flush()
    return exit_code(report)
