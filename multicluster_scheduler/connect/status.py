"""``multicluster-scheduler status`` (and ``kubectl multicluster status``): how scheduling goes in
one source cluster, read from it alone.

It lists the Targets and ClusterTargets, their virtual nodes and the proxy pods (a few API
calls, all at once), looks up the owners of ReplicaSets and Jobs so that pods are counted by
Deployment and CronJob, and prints the report that :mod:`.status_report` computes. Only what
the report cannot do without is required: a user who may not read nodes or ClusterTargets (a
namespace's tenant, say) gets the rest and a warning saying what is missing.

It also looks for what makes pods run at home without a word: the namespaces of the Targets
(enabled or not), the pods there that carry the election or a key like it and are not proxy
pods, and the chart's webhook configuration (installed or not).

Exit codes: 0 every target listed is Ready (or none is listed) and nothing keeps pods from being
elected, 3 some target is not Ready or something does, 1 the cluster could not be read (a
missing context or namespace, no answer, refused), 2 a usage error.
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
    namespaces_to_check,
    not_elected_pods,
)

OWNER_RESOURCES = {"ReplicaSet": REPLICASETS, "Job": JOBS}
OWNER_LOOKUPS = 16  # owners read at once
VIRTUAL_NODES = f"{keys.PROVIDER_KEY}={keys.PROVIDER}"
NOT_PROXIES = f"spec.schedulerName!={keys.PROXY_SCHEDULER_NAME}"
WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
CHART_LABEL = "app.kubernetes.io/part-of=multicluster-scheduler"

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


async def _check_namespace(ctx: Context, namespace: str) -> dict | None:
    """The namespace (None when it may not be read); an error when it does not exist."""
    try:
        found = await ctx.get(NAMESPACES, namespace)
    except ConnectError as e:
        if _forbidden(e):
            return None  # may not read namespaces: the lists below still say what they can
        raise
    if found is None:
        raise ConnectError(f"namespace {namespace} does not exist in context {ctx.name}")
    return found


async def _namespaces(ctx: Context, names: list[str], warnings: list[str]) -> dict[str, dict]:
    """The namespaces ``names`` that may be read and exist, by name."""

    async def read(name: str) -> dict | None:
        try:
            return await ctx.get(NAMESPACES, name)
        except ConnectError as e:
            refused = _forbidden(e)
            if refused is None:
                raise
            warnings.append(
                f"cannot read namespace {name} (403 Forbidden: {refused.message}): whether it "
                "is enabled is not said"
            )
            return None

    found = await asyncio.gather(*(read(name) for name in names))
    return {name: ns for name, ns in zip(names, found, strict=True) if ns is not None}


async def _installed(ctx: Context) -> bool | None:
    """Whether the chart's webhook configuration exists (None: it may not be looked for)."""
    try:
        found = await _list(
            ctx, WEBHOOK_CONFIGURATIONS, "list webhook configurations", None,
            label_selector=CHART_LABEL,
        )  # fmt: skip
    except ConnectError as e:
        if _forbidden(e):
            return None
        raise
    return bool(found)


async def _other_pods(
    ctx: Context, namespaces: list[str], warnings: list[str]
) -> list[dict] | None:
    """The pods of ``namespaces`` that are not proxy pods (None when they may not be listed)."""

    async def read(name: str) -> list[dict]:
        return await _list(ctx, PODS, f"list pods in namespace {name}", name,
                           field_selector=NOT_PROXIES)  # fmt: skip

    try:
        lists = await asyncio.gather(*(read(name) for name in namespaces))
    except ConnectError as e:
        refused = _forbidden(e)
        if refused is None:
            raise
        warnings.append(
            f"cannot list pods (403 Forbidden: {refused.message}): pods that carry the election "
            "and run in this cluster are not looked for"
        )
        return None
    return [pod for found in lists for pod in found]


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
            "the virtual nodes' readiness and allocatable are not shown, nor whether an agent "
            "keeps them",
        ),
        _list(
            ctx, PODS, f"list proxy pods in {where}", namespace, field_selector=PROXY_FIELD_SELECTOR
        ),
        _installed(ctx),
        return_exceptions=True,
    )
    for result in results:  # the first failure in the order above says the most
        if isinstance(result, BaseException):
            raise result
    asked, targets, (cluster_targets, no_cluster_targets), (nodes, no_nodes), proxies, installed = (
        cast(tuple[dict | None, list[dict], tuple, tuple, list[dict], bool | None], results)
    )
    warnings = [w for w in (no_cluster_targets, no_nodes) if w]
    observed = Observed(
        context=ctx.name,
        namespace=namespace,
        targets=targets,
        cluster_targets=cluster_targets or [],
        nodes=nodes,
        proxies=proxies,
        warnings=warnings,
        installed=installed,
    )
    names = namespaces_to_check(observed)
    known = {namespace: asked} if namespace and asked else {}
    observed.namespaces = known | await _namespaces(
        ctx, [n for n in names if n not in known], warnings
    )
    # Where pods that should be elected are looked for: the namespace asked for; with -A, those
    # of the Targets.
    looked = [namespace] if namespace else names
    observed.pods = await _other_pods(ctx, looked, warnings) if looked else []
    flagged = [pod for pod, _ in not_elected_pods(observed)]
    observed.controllers = await controllers_of(ctx, [*proxies, *flagged], warnings)
    return observed


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
