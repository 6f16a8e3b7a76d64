"""The targets controller (source side): each Target and ClusterTarget becomes a live connection.

Targets are created, changed and deleted at run time, no restart: a kubeconfig Secret is read
from the cache (and followed: fixing it reconnects), the connection is a runtime Cluster added
to the manager, and its readiness is whether the target's ClusterSummary is seen. Each target is
reconciled on its own, so a broken or unreachable one never delays another. The result is
written where users look: ``status.conditions`` (Ready, with a precise reason and message) and
an event on every change.

A tenant's Targets are bounded (how many per namespace, what their caches hold): see
:mod:`.limits`.
"""

from __future__ import annotations

import asyncio
import logging

from multicluster import (
    ApiError,
    BadResponse,
    CacheFull,
    Client,
    Cluster,
    ClusterConfig,
    Controller,
    EnqueueMapped,
    Forbidden,
    Manager,
    NotFound,
    Registration,
    Request,
    Result,
    Unauthorized,
)
from multicluster.config import ConfigError
from multicluster.events import EventRecorder
from multicluster.informer import Handler
from multicluster.resources import PODS, SECRETS

from ..api import keys
from ..api.conditions import ready_condition
from ..api.naming import virtual_node_name
from ..api.proxy import DELEGATE_LABEL_SELECTOR, slim_delegate
from ..api.regexps import compile_regexp
from ..api.resources import CLUSTER_SUMMARIES, CLUSTER_TARGETS, TARGETS
from .limits import (
    CACHE_FULL,
    TOO_MANY,
    TargetLimits,
    admitted,
    cache_full_message,
    too_many_message,
)
from .registry import (
    DELEGATE_INDEX,
    REFERENCE_INDEX,
    TargetConnection,
    TargetRegistry,
    by_parent_uid,
    by_reference,
)

log = logging.getLogger(__name__)
SINGLETON = f"metadata.name={keys.CLUSTER_SUMMARY_NAME}"
RECHECK_READY = 10.0
RECHECK_NOT_READY = 2.0
SELF_SUBJECT_REVIEWS = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
IDENTITY_TIMEOUT = 5.0


def slim_secret(secret: dict) -> dict:
    """What the cache keeps of a Secret: its identity and the names of its keys, never its
    data (every Secret of the cluster is watched, and anyone who may create Secrets in a
    namespace could fill the agent's memory with theirs). A Target's Secret is read when it
    changes."""
    meta = secret["metadata"]
    return {
        "metadata": {
            "name": meta["name"],
            "namespace": meta.get("namespace"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "keys": sorted(secret.get("data") or ()),
    }


def secret_reference(target: dict) -> str | None:
    """``namespace/name`` of the kubeconfig Secret a Target or ClusterTarget uses."""
    ref = (target.get("spec") or {}).get("kubeconfigSecret")
    if not ref:
        return None
    namespace = ref.get("namespace") or target["metadata"].get("namespace")
    return f"{namespace}/{ref.get('name')}"


async def identity_of(client: Client) -> tuple[str, str] | None:
    """Who the target says we are (a SelfSubjectReview): our user name there and its uid (""
    when it gives none), or None when it does not say in time."""
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
    try:
        async with asyncio.timeout(IDENTITY_TIMEOUT):
            answer = await client.request("POST", SELF_SUBJECT_REVIEWS, body=review)
    except (ApiError, TimeoutError) as e:
        log.info("target did not say who we are server=%s error=%s", client.name, e)
        return None
    status = (answer or {}).get("status") if isinstance(answer, dict) else None
    user = status.get("userInfo") if isinstance(status, dict) else None
    name = user.get("username") if isinstance(user, dict) else None
    if not isinstance(name, str):
        return None
    uid = user.get("uid") if isinstance(user, dict) else None
    return name, uid if isinstance(uid, str) else ""


def classify(error: Exception, namespace: str | None = None) -> tuple[str, str]:
    """The reason and message of a target's error (``namespace``: a Target's)."""
    if isinstance(error, NotFound):
        return "SummaryMissing", (
            "the target has no ClusterSummary resource: is multicluster-scheduler installed "
            f"there? ({error})"
        )
    if isinstance(error, Unauthorized):
        return "Unauthorized", f"the target rejected our credentials: {error}"
    if isinstance(error, CacheFull):
        return CACHE_FULL, cache_full_message(namespace, error)
    if isinstance(error, BadResponse):
        return "InvalidResponse", (
            f"the target answers as no Kubernetes API server does (is the kubeconfig's server "
            f"an API server?): {error}"
        )
    if isinstance(error, Forbidden):
        return "Forbidden", (
            f"the target forbids reading its ClusterSummary (bind the "
            f"{keys.CLUSTER_SUMMARY_VIEWER_CLUSTER_ROLE} ClusterRole): {error}"
        )
    return "Unreachable", str(error)


class TargetsReconciler:
    def __init__(
        self,
        local: Cluster,
        manager: Manager,
        registry: TargetRegistry,
        cluster_options: dict | None = None,
        limits: TargetLimits | None = None,
    ) -> None:
        self.local = local
        self.limits = limits or TargetLimits()
        self.cluster_options = cluster_options or {}
        self.manager = manager
        self.registry = registry
        self.targets = local.informer(TARGETS)
        self.cluster_targets = local.informer(CLUSTER_TARGETS)
        self.secrets = local.informer(SECRETS, transform=slim_secret)
        for informer in (self.targets, self.cluster_targets):
            informer.add_indexer("secret", lambda t: [r] if (r := secret_reference(t)) else [])
        self.events = EventRecorder(local.client, "multicluster-scheduler")
        registry.targets_listed = lambda: (
            self.targets.has_synced and self.cluster_targets.has_synced
        )
        registry.target_nodes = self._target_nodes
        self.controller: Controller | None = None
        self._config_keys: dict[str, tuple] = {}
        self._handlers: dict[str, Registration] = {}

    def _target_nodes(self) -> set[str] | None:
        if not (self.targets.has_synced and self.cluster_targets.has_synced):
            return None
        nodes = {virtual_node_name(t["metadata"]["name"]) for t in self.cluster_targets.list()}
        by_namespace: dict[str, list[dict]] = {}
        for target in self.targets.list():
            by_namespace.setdefault(target["metadata"]["namespace"], []).append(target)
        for namespace, targets in by_namespace.items():
            nodes |= {
                virtual_node_name(name, namespace)
                for name in admitted(targets, self.limits.max_per_namespace)
            }
        return nodes

    def _admits(self, request: Request) -> bool:
        """Whether a Target may connect (its namespace's limit); ClusterTargets always may. The
        namespace's other Targets whose turn changed (one before them went, say) are queued."""
        if not request.namespace:
            return True
        allowed = admitted(self.targets.list(request.namespace), self.limits.max_per_namespace)
        for target in self.targets.list(request.namespace):
            name = target["metadata"]["name"]
            connected = virtual_node_name(name, request.namespace) in self.registry.connections
            if name != request.name and (name in allowed) != connected and self.controller:
                self.controller.queue.add(Request(request.cluster, request.namespace, name))
        return request.name in allowed

    async def reconcile(self, request: Request) -> Result | None:
        namespaced = bool(request.namespace)
        informer = self.targets if namespaced else self.cluster_targets
        target = informer.get(request.name, request.namespace or None)
        node_name = virtual_node_name(request.name, request.namespace or None)
        connection = self.registry.connections.get(node_name)
        admitted_now = self._admits(request)
        if target is None or not admitted_now:
            if connection is not None:
                await self.registry.remove(node_name)  # listeners may still use the connection
                await self._disconnect(connection)
                log.info("target removed node=%s", node_name)
            if target is not None:
                await self._refuse(target)
            return None
        if connection is None:
            connection = TargetConnection(
                kind="Target" if namespaced else "ClusterTarget",
                name=request.name,
                namespace=request.namespace or None,
            )
            await self.registry.add(connection)
        if not self.secrets.has_synced:  # a Secret not seen yet is not a missing one
            return Result(requeue_after=RECHECK_NOT_READY)
        problem = await self._connect(connection, target, request)
        ready: bool | None
        if problem is not None:
            ready, reason, message = False, *problem
        else:
            ready, reason, message = self._readiness(connection)
        await self._report(connection, target, ready, reason, message)
        return Result(requeue_after=RECHECK_READY if ready else RECHECK_NOT_READY)

    async def _connect(
        self, connection: TargetConnection, target: dict, request: Request
    ) -> tuple[str, str] | None:
        """Make sure the connection uses the target's current configuration; or say why not."""
        spec = target.get("spec") or {}
        if spec.get("self"):
            key: tuple = ("self",)
            config = None
        else:
            ref = spec.get("kubeconfigSecret") or {}
            where = secret_reference(target) or "?"
            namespace, _, name = where.partition("/")
            secret = self.secrets.get(name, namespace)
            if secret is None:
                await self._disconnect(connection)
                return "SecretNotFound", f"secret {where} not found"
            data_key = ref.get("key") or "config"
            if data_key not in secret["keys"]:
                await self._disconnect(connection)
                return "KeyNotFound", f"secret {where} has no key {data_key!r}"
            key = (secret["metadata"].get("resourceVersion"), data_key, ref.get("context"))
            if self._config_keys.get(connection.node_name) == key:
                return None
            try:
                secret = await self.local.client.get(SECRETS, name, namespace)
            except NotFound:
                await self._disconnect(connection)
                return "SecretNotFound", f"secret {where} not found"
            try:
                config = ClusterConfig.from_secret(secret, data_key, ref.get("context"))
            except ConfigError as e:
                await self._disconnect(connection)
                return "InvalidKubeconfig", str(e)
            except Exception as e:  # what a library makes of a kubeconfig nobody foresaw
                await self._disconnect(connection)
                log.warning("kubeconfig refused target=%s error=%s", where, type(e).__name__)
                return (
                    "InvalidKubeconfig",
                    f"secret {where}: unusable kubeconfig ({type(e).__name__})",
                )
        if self._config_keys.get(connection.node_name) == key:
            return None
        await self._disconnect(connection)
        await self._attach(connection, request, key, config)
        return None

    async def _attach(
        self,
        connection: TargetConnection,
        request: Request,
        key: tuple,
        config: ClusterConfig | None,
    ) -> None:
        """Connect to the target's cluster (this one if ``config`` is None): its summary and
        delegates cached, its cluster run by the manager, the registry told."""
        cluster = (
            self.local
            if config is None
            else Cluster(
                connection.node_name,
                config,
                **self.cluster_options,
                **self.limits.cluster_options(connection.name, connection.namespace),
            )
        )
        summaries = cluster.informer(CLUSTER_SUMMARIES, field_selector=SINGLETON)
        self._handlers[connection.node_name] = summaries.add_handler(
            self._enqueuer(request, connection)
        )
        # Delegates live in the proxy's namespace: a namespaced Target sees only its own.
        delegates = cluster.informer(
            PODS,
            connection.namespace,
            label_selector=DELEGATE_LABEL_SELECTOR,
            transform=slim_delegate,
        )
        delegates.add_indexer(DELEGATE_INDEX, by_parent_uid)
        delegates.add_indexer(REFERENCE_INDEX, by_reference)
        connection.cluster, connection.summaries = cluster, summaries
        connection.delegates = delegates
        found = None if cluster is self.local else await identity_of(cluster.client)
        connection.identity, connection.identity_uid = found or (None, "")
        if cluster is not self.local:
            self.manager.add_cluster(cluster)
        self._config_keys[connection.node_name] = key
        self.registry.connected(connection)
        log.info("target connected node=%s server=%s", connection.node_name, cluster.config.server)

    def _enqueuer(self, request: Request, connection: TargetConnection) -> Handler:
        def on_summary(_event: str, _obj: dict, _old: dict | None, _initial: bool) -> None:
            self.registry.changed(connection)
            if self.controller is not None:
                self.controller.queue.add(request)

        return on_summary

    async def _disconnect(self, connection: TargetConnection) -> None:
        cluster = connection.cluster
        delegates = connection.delegates
        self._config_keys.pop(connection.node_name, None)
        registration = self._handlers.pop(connection.node_name, None)
        if registration is not None:
            registration.remove()
        if cluster is not None:
            self.registry.disconnected(connection)
        connection.cluster, connection.summaries, connection.delegates = None, None, None
        if cluster is not None and cluster is not self.local:
            await self.manager.remove_cluster(cluster.name)
        elif delegates is not None and not any(
            other.delegates is delegates for other in self.registry.connections.values()
        ):
            # A self target's delegates are watched on this cluster, which stays: stop that
            # watch unless another self target of the same namespace still uses it.
            await self.local.remove_informer(delegates)

    def _readiness(self, connection: TargetConnection) -> tuple[bool | None, str, str]:
        summaries = connection.summaries
        if summaries is None:
            return None, "Connecting", "connecting to the target"
        if summaries.last_error is not None:
            return False, *classify(summaries.last_error, connection.namespace)
        if not summaries.has_synced:
            return None, "Connecting", "connecting to the target"
        if connection.summary() is None:
            return (
                False,
                "SummaryMissing",
                ("the target has no ClusterSummary: is multicluster-scheduler installed there?"),
            )
        delegates = connection.delegates
        if delegates is not None and isinstance(delegates.last_error, BadResponse | CacheFull):
            return False, *classify(delegates.last_error, connection.namespace)
        if delegates is not None and isinstance(delegates.last_error, Forbidden | Unauthorized):
            where = f"namespace {connection.namespace}" if connection.namespace else "the cluster"
            return (
                False,
                "Forbidden",
                (
                    f"the target forbids our pods in {where} (bind the "
                    f"{keys.SOURCE_CLUSTER_ROLE} ClusterRole there, e.g. with a Source): "
                    f"{delegates.last_error}"
                ),
            )
        return True, "Ready", "the target's ClusterSummary is current"

    async def _refuse(self, target: dict) -> None:
        """A Target after its namespace's first ``max_per_namespace``: no connection, no node."""
        meta = target["metadata"]
        message = too_many_message(self.limits.max_per_namespace)
        if await self._write_condition(target, False, TOO_MANY, message):
            log.warning(
                "target not connected, too many in its namespace namespace=%s name=%s limit=%d",
                meta["namespace"],
                meta["name"],
                self.limits.max_per_namespace,
            )

    async def _report(
        self,
        connection: TargetConnection,
        target: dict,
        ready: bool | None,
        reason: str,
        message: str,
    ) -> None:
        failover = (target.get("spec") or {}).get("failoverAfterSeconds")
        failover = float(failover) if isinstance(failover, int) and failover > 0 else None
        changed = connection.failover_after != failover
        connection.failover_after = failover
        changed = await self._exclude_labels(connection, target) or changed
        if connection.set_ready(bool(ready), reason, message) or changed:
            self.registry.changed(connection)
        await self._write_condition(target, ready, reason, message)

    async def _exclude_labels(self, connection: TargetConnection, target: dict) -> bool:
        """Compile ``spec.excludedLabelsRegexp`` when it changed (whether it did); an invalid one
        excludes nothing, as upstream, and says why in a Warning event."""
        pattern = (target.get("spec") or {}).get("excludedLabelsRegexp")
        pattern = pattern if isinstance(pattern, str) and pattern else None
        if pattern == connection.excluded_labels_regexp:
            return False
        connection.excluded_labels_regexp, connection.excluded_labels = pattern, None
        if pattern is not None:
            try:
                connection.excluded_labels = compile_regexp(pattern)
            except ValueError as e:
                resource = TARGETS if target["metadata"].get("namespace") else CLUSTER_TARGETS
                await self.events.record(
                    {**target, "apiVersion": resource.api_version, "kind": resource.kind},
                    "Warning",
                    "InvalidExcludedLabelsRegexp",
                    f"spec.excludedLabelsRegexp is not a regular expression (RE2 syntax): {e}; "
                    "no label is excluded from the virtual node",
                )
        return True

    async def _write_condition(
        self, target: dict, ready: bool | None, reason: str, message: str
    ) -> bool:
        """The Target's Ready condition, patched when it changed, with an event when its reason
        did; whether the reason changed."""
        status = target.get("status") or {}
        previous = status.get("conditions") or []
        generation = target["metadata"].get("generation")
        condition = ready_condition(ready, reason, message, generation, previous)
        old = next((c for c in previous if c.get("type") == "Ready"), None)
        if old is not None and all(
            old.get(k) == condition[k]
            for k in ("status", "reason", "message", "observedGeneration")
        ):
            return False
        meta = target["metadata"]
        resource = TARGETS if meta.get("namespace") else CLUSTER_TARGETS
        await self.local.client.patch(
            resource,
            meta["name"],
            {"status": {"conditions": [condition]}},
            meta.get("namespace"),
            subresource="status",
        )
        if old is not None and old.get("reason") == reason:
            return False
        await self.events.record(
            {**target, "apiVersion": resource.api_version, "kind": resource.kind},
            "Warning" if ready is False else "Normal",
            reason,
            message,
        )
        return True


def targets_controller(
    local: Cluster,
    manager: Manager,
    registry: TargetRegistry,
    cluster_options: dict | None = None,
    limits: TargetLimits | None = None,
) -> Controller:
    reconciler = TargetsReconciler(local, manager, registry, cluster_options, limits)
    controller = Controller("targets", reconciler, workers=4)
    reconciler.controller = controller
    controller.watch(local, TARGETS)
    controller.watch(local, CLUSTER_TARGETS)

    def by_secret(cluster: str, secret: dict) -> list[Request]:
        ref = f"{secret['metadata'].get('namespace')}/{secret['metadata']['name']}"
        found = reconciler.targets.by_index("secret", ref)
        found += reconciler.cluster_targets.by_index("secret", ref)
        return [
            Request(cluster, t["metadata"].get("namespace", ""), t["metadata"]["name"])
            for t in found
        ]

    controller.watch(local, SECRETS, handler=EnqueueMapped(by_secret), transform=slim_secret)
    return controller
