"""``multicluster-scheduler agent``: everything that runs in each cluster, in one process.

The same agent runs in every cluster, in the cluster (its service account) or outside it
(``--kubeconfig``/``--context``). Every replica serves the admission webhook and health
endpoints; the leader runs the controllers. Settings come from flags, or from ``MCS_*``
environment variables of the same names (``--webhook-port`` ↔ ``MCS_WEBHOOK_PORT``).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import hashlib
import logging
import os
import re
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from multicluster import (
    ApiError,
    Client,
    Cluster,
    ClusterConfig,
    Controller,
    LeaderElectionConfig,
    Manager,
    Unreachable,
)
from multicluster.config import ConfigError
from multicluster.errors import ServerError, TooManyRequests
from multicluster.pki import KeyPair
from multicluster.resources import NAMESPACES, NODES

from .api.ingresses import (
    DEFAULT_REFUSED_ANNOTATIONS,
    ClassPolicy,
    IngressPolicy,
    annotation_pattern,
    class_name,
    host_pattern,
)
from .api.manifest_mac import ManifestKey
from .api.summary import slim_node
from .follow.controller import Follow
from .scheduler.controller import Scheduler, proxy_informer
from .services.controller import ServiceSync
from .services.ingresses import IngressSync
from .sources.controller import finalizer_cleanup_controller, sources_controller
from .summary.controller import summary_controller
from .targets.controller import targets_controller
from .targets.delegates import DelegateLookup
from .targets.heartbeat import SourceHeartbeat
from .targets.keeper import DelegateKeeper
from .targets.limits import (
    DEFAULT_CACHE_PER_CLUSTER_TARGET,
    DEFAULT_CACHE_PER_NAMESPACE,
    DEFAULT_MAX_PER_NAMESPACE,
    MIB,
    TargetLimits,
)
from .targets.registry import TargetRegistry
from .virtual_kubelet.event_reflector import EventReflector
from .virtual_kubelet.kubelet import KubeletApi
from .virtual_kubelet.loop import NodeSettings, VirtualKubelet, release_owner
from .virtual_kubelet.pods import PodSync
from .webhook import heap
from .webhook.app import smaller_tls_buffers
from .webhook.certificates import MUTATING_WEBHOOKS, CertificateManager, service_hosts
from .webhook.manifest_key import ManifestKeyError, load_manifest_key
from .webhook.server import WebhookProcess, WebhookServer

log = logging.getLogger("multicluster_scheduler.agent")

EXAMPLES = """\
  # what the chart's Deployment runs, in the cluster (its service account; settings from MCS_*)
  multicluster-scheduler agent --namespace admiralty

  # outside the cluster, against a kubeconfig context: the webhook and the kubelet API must then
  # be reachable from the API server at an address its certificate names
  multicluster-scheduler agent --namespace admiralty --kubeconfig ~/.kube/config \\
      --context cluster1 --webhook-cert-host 192.0.2.10 --node-address 192.0.2.10
"""
IDENTITY_PATIENCE = 20.0
# Bytes read at a time from each TLS connection (asyncio's default: 256 KiB, held per connection;
# an agent with 100 Targets holds 600 connections). Reading a large list costs the client 1.9 ms
# of CPU per MiB with 64 KiB reads, 2.3 with 32 KiB, 3.4 with 16 KiB: 32 KiB halves what each
# connection holds for a sliver of a restart's time.
TLS_READ_SIZE = 32 * 1024

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration(text: str | float) -> float:
    """Seconds from ``15s``, ``1m30s``, ``2h`` or a plain number of seconds."""
    if isinstance(text, int | float):
        return float(text)
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    match = _DURATION.fullmatch(text)
    if not text or not match:
        raise ValueError(f"{text!r} is not a duration such as 15s, 1m30s or 2h")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


DURATIONS = (
    "leader_election_lease_duration",
    "leader_election_renew_deadline",
    "leader_election_retry_period",
    "delegate_timeout",
    "shutdown_delay",
)


class AgentSettings(BaseModel):
    """The agent's settings: each is a flag (``--webhook-port``) and an environment variable
    (``MCS_WEBHOOK_PORT``), the flag first; defaults and help are said here only."""

    namespace: str = Field(min_length=1, description="namespace of the release (required)")
    name: str = Field("multicluster-scheduler", min_length=1, description="release full name")
    kubeconfig: str | None = Field(None, description="run outside the cluster with this file")
    context: str | None = Field(None, description="kubeconfig context")
    identity: str = Field(
        default_factory=lambda: os.environ.get("POD_NAME") or socket.gethostname(),
        description="leader-election identity (default: $POD_NAME, else the host name)",
    )
    webhook_host: str = Field("0.0.0.0", description="listen address of the webhook")
    webhook_port: int = Field(9443, ge=0, le=65535, description="HTTPS port of the webhook")
    webhook_cert_hosts: list[str] = Field(
        default_factory=list,
        description="extra DNS name or IP of the serving certificate (repeatable; in the "
        "environment, comma-separated)",
        json_schema_extra={"flag": "--webhook-cert-host"},
    )
    webhook_cert_dir: Path | None = Field(
        None, description="tls.crt/tls.key from cert-manager instead of self-managed certificates"
    )
    node_address: str = Field(
        default_factory=lambda: os.environ.get("POD_IP") or "127.0.0.1",
        description="address virtual nodes advertise (default: $POD_IP, the agent's pod IP)",
    )
    kubelet_host: str = Field(
        "", description="listen address of the kubelet API (empty: every address, IPv4 and IPv6)"
    )
    kubelet_port: int = Field(
        10250,
        ge=1,
        le=65535,
        description="port of the kubelet API (logs, exec, attach) of the virtual nodes",
    )
    kubelet_serving_signer: str = Field(
        "kubernetes.io/kubelet-serving",
        description="signerName of the kubelet API's certificate request; none: the agent's CA",
    )
    kubelet_websockets: bool = Field(
        True,
        description="true: virtual nodes declare ExtendWebSocketsToKubelet, so API servers from "
        "1.36 pass exec and attach WebSockets through; false: they translate them to SPDY, as "
        "older ones do",
    )
    kubelet_client_ca_file: Path | None = Field(
        None,
        description="CA that signs the API server's kubelet client certificate (default: the "
        "cluster's client CA, from kube-system/extension-apiserver-authentication)",
    )
    health_host: str = Field("0.0.0.0", description="listen address of /healthz, /readyz, /metrics")
    health_port: int = Field(
        8080, ge=0, le=65535, description="port of /healthz, /readyz, /metrics"
    )
    log_level: str = Field("info", description="debug, info, warning or error")
    leader_election_lease_duration: PositiveFloat = Field(15.0, description="lease duration")
    leader_election_renew_deadline: PositiveFloat = Field(
        10.0, description="a leader that cannot renew this long stops leading"
    )
    leader_election_retry_period: PositiveFloat = Field(2.0, description="between lease attempts")
    shutdown_delay: NonNegativeFloat = Field(
        0.0,
        description="after SIGTERM, how long the webhook keeps answering while the lease is "
        "already released (behind a Service: until API servers see the replica gone)",
    )
    source_controller: bool = Field(
        True, description="true or false (chart value sourceController.enabled)"
    )
    webhook_process: bool = Field(
        True,
        description="true: the webhook answers from a process of its own, unaffected by the "
        "controllers' load; false: from the agent's event loop",
    )
    cluster_name: str | None = Field(
        None,
        description="this cluster's name on delegates it creates (default: kube-system's uid)",
    )
    client_qps: PositiveFloat = Field(200.0, description="API requests per second, per cluster")
    client_burst: PositiveInt = Field(400, description="API requests at once, per cluster")
    scheduler_workers: PositiveInt = Field(64, description="proxy pods placed concurrently")
    delegate_timeout: PositiveFloat = Field(
        30.0,
        description="time a target's scheduler has to place a delegate before another target "
        "is tried",
    )
    summary_exclude_labels: str | None = Field(
        None,
        description="regular expression of node label keys left out of the ClusterSummary's "
        "node groups",
    )
    ingress_allowed_annotations: list[str] = Field(
        default_factory=list,
        description="annotation key, * for any run of characters, that Ingresses may carry "
        "into targets (repeatable, or comma-separated); an Ingress with any other is not "
        "copied. Default: none but multicluster.admiralty.io/ keys",
        json_schema_extra={"flag": "--ingress-allowed-annotation", "metavar": "PATTERN"},
    )
    ingress_refused_annotations: str | None = Field(
        DEFAULT_REFUSED_ANNOTATIONS,
        description="regular expression: an Ingress with an annotation whose key it matches is "
        "not copied to targets, even if allowed (raw configuration of their ingress "
        "controllers); empty: none",
    )
    ingress_class_policy: ClassPolicy = Field(
        ClassPolicy.REFUSE,
        description="what becomes of an Ingress's class in its copies: keep; refuse (not "
        "copied if it has a class other than --ingress-class); rewrite (to --ingress-class)",
    )
    ingress_class: str | None = Field(
        None, description="the class allowed (policy refuse) or written (policy rewrite)"
    )
    ingress_allowed_hosts: list[str] = Field(
        default_factory=list,
        description="host an Ingress may route in targets: a name, *.<domain> (its "
        "subdomains), or * (any, and none) (repeatable, or comma-separated); default: none",
        json_schema_extra={"flag": "--ingress-allowed-host", "metavar": "HOST"},
    )
    max_targets_per_namespace: NonNegativeInt = Field(
        DEFAULT_MAX_PER_NAMESPACE,
        description="Targets of one namespace connected, oldest first (each becomes a Node and "
        "a Lease); the others are TooManyTargets. ClusterTargets do not count",
    )
    target_cache_mib: PositiveInt = Field(
        DEFAULT_CACHE_PER_NAMESPACE // MIB,
        description="MiB of objects (their JSON) that the caches of one namespace's Targets "
        "hold together; beyond it they are CacheFull",
    )
    cluster_target_cache_mib: PositiveInt = Field(
        DEFAULT_CACHE_PER_CLUSTER_TARGET // MIB,
        description="MiB of objects (their JSON) that the caches of one ClusterTarget hold; "
        "beyond it it is CacheFull",
    )

    @field_validator("summary_exclude_labels", "ingress_refused_annotations")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        if value:
            try:
                re.compile(value)
            except re.error as e:
                raise ValueError(f"not a regular expression: {e}") from e
        return value or None

    @field_validator("ingress_allowed_annotations", "ingress_allowed_hosts")
    @classmethod
    def _patterns(cls, values: list[str], info: ValidationInfo) -> list[str]:
        check = (
            annotation_pattern if info.field_name == "ingress_allowed_annotations" else host_pattern
        )
        listed = [item.strip() for value in values for item in value.split(",")]
        return [check(item) for item in listed if item]

    @field_validator("ingress_class")
    @classmethod
    def _class(cls, value: str | None) -> str | None:
        return class_name(value) if value else None

    @model_validator(mode="after")
    def _ingress_policy(self) -> AgentSettings:
        if self.ingress_class_policy is ClassPolicy.REWRITE and not self.ingress_class:
            raise ValueError("--ingress-class-policy=rewrite needs --ingress-class")
        return self

    def ingress_policy(self) -> IngressPolicy:
        """What Ingresses may carry into targets (docs/services.md)."""
        return IngressPolicy(
            allowed_annotations=tuple(self.ingress_allowed_annotations),
            refused_annotations=self.ingress_refused_annotations,
            class_policy=self.ingress_class_policy,
            ingress_class=self.ingress_class,
            allowed_hosts=tuple(self.ingress_allowed_hosts),
        )

    @field_validator(*DURATIONS, mode="before")
    @classmethod
    def _duration(cls, value: str | float) -> float:
        return parse_duration(value)

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        if value.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ValueError("log level must be debug, info, warning or error")
        return value.lower()

    @property
    def ca_secret(self) -> str:
        return f"{self.name}-webhook-ca"

    @property
    def manifest_key_secret(self) -> str:
        return f"{self.name}-manifest-key"

    @property
    def self_managed_certificates(self) -> bool:
        return self.webhook_cert_dir is None


def _shown(name: str, default: object) -> str | None:
    """A default as a user writes it on the command line."""
    if default is None or default == "":
        return None
    if isinstance(default, bool):
        return str(default).lower()
    if name in DURATIONS and isinstance(default, float):
        return f"{default:g}s"
    return str(default)


def _metavar(name: str, annotation: object) -> str:
    if name in DURATIONS:
        return "DURATION"
    if annotation is bool:
        return "BOOL"
    if annotation in (int, float):
        return "N"
    if annotation == Path | None:
        return "PATH"
    return "HOST" if annotation == list[str] else "VALUE"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """A flag per setting; an unset flag takes its ``MCS_`` variable, else the default."""
    for name, field in AgentSettings.model_fields.items():
        variable = "MCS_" + name.upper()
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        flag = str(extra.get("flag") or "--" + name.replace("_", "-"))
        shown = (
            None if field.is_required() or field.default_factory else _shown(name, field.default)
        )
        help_text = field.description or ""
        help_text += f" (default: {shown}; ${variable})" if shown else f" (${variable})"
        value = os.environ.get(variable)
        metavar = str(extra.get("metavar") or _metavar(name, field.annotation))
        if field.annotation == list[str]:
            listed = [v for v in (value or "").split(",") if v]
            parser.add_argument(
                flag, dest=name, action="append", default=listed, metavar=metavar, help=help_text
            )
        else:
            parser.add_argument(flag, dest=name, default=value, metavar=metavar, help=help_text)


def settings_from(args: argparse.Namespace) -> AgentSettings:
    values = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    return AgentSettings(**values)


async def cluster_identity(
    client: Client, patience: float = IDENTITY_PATIENCE, retry: float = 1.0
) -> str:
    """A name for this cluster that no other cluster has: the uid of its kube-system namespace
    (or, without permission to read it, a hash of the API server's address).

    The name must be the same at every start, since delegates carry it: an API server that is
    down or starting (unreachable, 5xx, 429, or 403 while its authorizer warms up) is waited
    for, and only a refusal that lasts ``patience`` seconds falls back to the address."""
    deadline = asyncio.get_running_loop().time() + patience
    while True:
        try:
            namespace = await client.get(NAMESPACES, "kube-system")
            return namespace["metadata"]["uid"]
        except (Unreachable, ServerError, TooManyRequests) as e:
            log.warning("cannot read namespace kube-system yet, retrying: %s", e)
        except ApiError as e:
            if asyncio.get_running_loop().time() >= deadline:
                log.warning(
                    "cannot read namespace kube-system, naming this cluster by address: %s", e
                )
                return hashlib.sha256(client.config.server.encode()).hexdigest()[:16]
            log.warning("cannot read namespace kube-system yet, retrying: %s", e)
        await asyncio.sleep(retry)


async def run(settings: AgentSettings) -> None:
    options: dict[str, Any] = {"qps": settings.client_qps, "burst": settings.client_burst}
    if settings.kubeconfig or settings.context:
        config = ClusterConfig.from_kubeconfig(settings.kubeconfig, settings.context)
        cluster = Cluster("local", config, **options)
    else:
        cluster = Cluster.in_cluster("local", **options)
    cluster_name = settings.cluster_name or await cluster_identity(cluster.client)
    manager = Manager(
        leader_election=LeaderElectionConfig(
            namespace=settings.namespace,
            name=settings.name,
            identity=settings.identity,
            lease_duration=settings.leader_election_lease_duration,
            renew_deadline=settings.leader_election_renew_deadline,
            retry_period=settings.leader_election_retry_period,
        ),
        health_port=settings.health_port,
        health_host=settings.health_host,
        shutdown_delay=settings.shutdown_delay,
    )
    manager.add_cluster(cluster)
    key = await load_manifest_key(cluster.client, settings.namespace, settings.manifest_key_secret)
    lookup = await add_controllers(manager, cluster, settings, cluster_name, options, key)
    with tempfile.TemporaryDirectory(prefix="webhook-") as scratch:
        ca = await add_webhook(manager, cluster, settings, Path(scratch), key)
        kubelet_api = KubeletApi(
            cluster.client,
            lookup,
            host=settings.kubelet_host,
            port=settings.kubelet_port,
            address=settings.node_address,
            node_name=f"{settings.name}-{settings.identity}",
            signer=settings.kubelet_serving_signer,
            client_ca_file=settings.kubelet_client_ca_file,
            cert_dir=Path(scratch) / "kubelet",
            ca=ca,
            leading=lambda: manager.is_leader,
        )
        manager.add_runnable(kubelet_api.run, needs_leader=False)
        log.info(
            "agent starting namespace=%s name=%s identity=%s cluster=%s webhook_port=%d",
            settings.namespace,
            settings.name,
            settings.identity,
            cluster_name,
            settings.webhook_port,
        )
        await manager.run(handle_signals=True)


def add_cluster_controllers(
    manager: Manager,
    cluster: Cluster,
    settings: AgentSettings,
    cluster_name: str,
    options: dict[str, Any],
) -> TargetRegistry:
    """This cluster's summary, its Sources, its Targets and what keeps their delegates."""
    exclude = settings.summary_exclude_labels
    manager.add_controller(
        summary_controller(cluster, exclude=re.compile(exclude) if exclude else None)
    )
    if settings.source_controller:
        manager.add_controller(sources_controller(cluster))
    else:  # Sources it gave a finalizer to may still be deleted (docs/sources.md)
        manager.add_controller(finalizer_cleanup_controller(cluster))
    registry = TargetRegistry()
    limits = TargetLimits(
        max_per_namespace=settings.max_targets_per_namespace,
        cache_per_namespace=settings.target_cache_mib * MIB,
        cache_per_cluster_target=settings.cluster_target_cache_mib * MIB,
    )
    manager.add_controller(
        targets_controller(cluster, manager, registry, cluster_options=options, limits=limits)
    )
    manager.add_runnable(DelegateKeeper(cluster, cluster_name).run, needs_leader=True)
    return registry


async def add_controllers(
    manager: Manager,
    cluster: Cluster,
    settings: AgentSettings,
    cluster_name: str,
    options: dict[str, Any],
    manifest_key: ManifestKey,
) -> DelegateLookup:
    """Every controller and loop of the agent but the webhook's and the kubelet API's; the
    scheduler checks saved manifests with ``manifest_key``."""
    registry = add_cluster_controllers(manager, cluster, settings, cluster_name, options)
    lookup = DelegateLookup(registry, proxy_informer(cluster), cluster_name)
    # Made in this order, as they register with the registry and the informers.
    heartbeats = SourceHeartbeat(cluster, registry, cluster_name)
    manager.add_runnable(heartbeats.run, needs_leader=True)
    follow = Follow(cluster, lookup)
    scheduler = Scheduler(
        cluster,
        lookup,
        verify_timeout=settings.delegate_timeout,
        workers=settings.scheduler_workers,
        prepare=follow.prepare,
        manifest_key=manifest_key,
        created=heartbeats.created,
    )
    pods = PodSync(cluster, lookup)
    manager.add_runnable(EventReflector(cluster, lookup).run, needs_leader=True)
    excluded = (settings.namespace,)
    services = ServiceSync(
        cluster, registry, cluster_name=cluster_name, excluded_namespaces=excluded
    )
    ingresses = IngressSync(
        cluster,
        registry,
        cluster_name=cluster_name,
        excluded_namespaces=excluded,
        policy=settings.ingress_policy(),
    )
    for controller in (
        *follow.controllers,
        scheduler.controller,
        *pods.controllers,
        services.controller,
        ingresses.controller,
    ):
        manager.add_controller(controller)
    node = NodeSettings(
        settings.node_address,
        settings.kubelet_port,
        await release_owner(cluster.client, settings.name),
        None if settings.kubelet_websockets else [],
    )
    nodes = cluster.informer(NODES, transform=slim_node)  # the scheduler's: one watch
    virtual_kubelet = VirtualKubelet(cluster.client, registry, node, pods=pods, nodes=nodes)
    manager.add_runnable(virtual_kubelet.sweep, needs_leader=True)
    return lookup


async def add_webhook(
    manager: Manager,
    cluster: Cluster,
    settings: AgentSettings,
    scratch: Path,
    manifest_key: ManifestKey,
) -> KeyPair | None:
    """The webhook's server, with its certificates (made here, or cert-manager's), sealing saved
    manifests with ``manifest_key``; the CA made here, if any (the kubelet API falls back on
    it)."""
    certificates = None
    if settings.webhook_cert_dir is None:
        certificates = CertificateManager(
            cluster.client,
            namespace=settings.namespace,
            ca_secret=settings.ca_secret,
            webhook_configuration=settings.name,
            hosts=[*service_hosts(settings.name, settings.namespace), *settings.webhook_cert_hosts],
            cert_dir=scratch,
        )
        await certificates.load_ca()
        certificates.issue()
        cert_file, key_file = certificates.cert_file, certificates.key_file
        ca_bundle = Controller("webhook-ca-bundle", certificates, workers=1)
        ca_bundle.watch(cluster, MUTATING_WEBHOOKS, field_selector=f"metadata.name={settings.name}")
        manager.add_controller(ca_bundle)
        manager.add_runnable(certificates.renew_forever, needs_leader=False)
    else:
        cert_file = settings.webhook_cert_dir / "tls.crt"
        key_file = settings.webhook_cert_dir / "tls.key"
    serve = WebhookProcess if settings.webhook_process else WebhookServer
    webhook = serve(settings.webhook_host, settings.webhook_port, cert_file, key_file, manifest_key)
    if certificates is not None:
        certificates.on_reload(webhook.reload_certificate)
    manager.add_runnable(webhook.serve, needs_leader=False)
    malloc = heap.glibc_heap()
    if malloc is not None:
        # The heap freed by a burst of requests, or of pods cached then deleted, given back.
        trim = functools.partial(heap.trim_after_bursts, malloc.trim, malloc.in_use)
        manager.add_runnable(trim, needs_leader=False)
    manager.add_readiness_check(
        lambda: None if webhook.started else "the webhook is not serving yet"
    )
    return certificates.ca if certificates is not None else None


def main(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
    except ValidationError as e:
        problems = "; ".join(
            f"--{'-'.join(map(str, err['loc'])).replace('_', '-')}: {err['msg']}"
            for err in e.errors()
        )
        print(f"error: {problems}", file=sys.stderr, flush=True)
        return 2
    logging.basicConfig(
        level=settings.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    smaller_tls_buffers(TLS_READ_SIZE)
    try:
        asyncio.run(run(settings))
    except ConfigError as e:
        log.error("cannot connect: %s", e)
        return 1
    except ManifestKeyError as e:
        log.error("no manifest key: %s", e)
        return 1
    return 0
