"""The custom resources of ``multicluster.admiralty.io/v1alpha1`` as pydantic models.

The shapes are the original project's, so every manifest of its user guide applies unchanged;
what we add (status conditions, ClusterSummary node groups) is optional. The CRDs in
``crds/`` are generated from these models (``python -m multicluster_scheduler.api.crds``):
docstrings and field descriptions become what ``kubectl explain`` shows.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from .keys import API_VERSION

QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
Quantity = Annotated[
    int | str,
    WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "pattern": QUANTITY_PATTERN,
        }
    ),
]
ResourceList = dict[str, Quantity]
Name = Annotated[str, Field(min_length=1, max_length=253)]


class Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class Condition(Model):
    """The state of one aspect of the object, as in every Kubernetes status."""

    type: str = Field(description="Type of condition, e.g. Ready.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str | None = Field(None, description="A machine-readable CamelCase reason.")
    message: str | None = Field(None, description="A human-readable explanation.")
    lastTransitionTime: str | None = Field(
        None, description="When the status last changed.", json_schema_extra={"format": "date-time"}
    )
    observedGeneration: int | None = Field(
        None, description="The .metadata.generation the condition was set for."
    )


Conditions = Annotated[
    list[Condition],
    Field(
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]}
    ),
]


class Status(Model):
    """Observed state, written by the agent."""

    conditions: Conditions | None = Field(None, description="Ready and its reason.")


class Resource(Model):
    """Common envelope of the kinds. A kind names its CRD in its class line, as kubebuilder's
    resource marker does (``class Source(Resource, plural="sources", short_names=["src"],
    namespaced=True)``), and says its kind once, as the default of ``kind``; its printer
    columns, spec rules and top-level fields are class attributes."""

    kind_name: ClassVar[str]
    plural: ClassVar[str]
    short_names: ClassVar[list[str]]
    namespaced: ClassVar[bool]
    printer_columns: ClassVar[list[dict[str, Any]]] = []
    spec_rules: ClassVar[list[dict[str, str]]] = []
    top_level: ClassVar[tuple[str, ...]] = ("spec", "status")

    apiVersion: str = API_VERSION
    kind: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)

    def __init_subclass__(
        cls, *, plural: str, short_names: list[str], namespaced: bool, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        cls.plural, cls.short_names, cls.namespaced = plural, short_names, namespaced

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.kind_name = cls.model_fields["kind"].default


READY_COLUMNS = [
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {
        "name": "Reason",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
    },
]
AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}
USER_COLUMN = {"name": "User", "type": "string", "jsonPath": ".spec.userName", "priority": 1}
SELF_COLUMN = {"name": "Self", "type": "boolean", "jsonPath": ".spec.self"}
SECRET_COLUMN = {"name": "Secret", "type": "string", "jsonPath": ".spec.kubeconfigSecret.name"}
FAILOVER_COLUMN = {
    "name": "Failover",
    "type": "integer",
    "jsonPath": ".spec.failoverAfterSeconds",
    "priority": 1,
}


# -- sources (in target clusters) -------------------------------------------------------------


class SourceSpec(Model):
    """Who, in this namespace, may place delegate pods: a service account or a user."""

    serviceAccountName: str | None = Field(
        None,
        description="Service account (in the Source's namespace) that the source cluster uses; "
        "created if missing.",
    )
    userName: str | None = Field(None, description="User name that the source cluster uses.")


class Source(Resource, plural="sources", short_names=["src"], namespaced=True):
    """A source cluster allowed to schedule pods in this namespace."""

    printer_columns = [
        {"name": "Service Account", "type": "string", "jsonPath": ".spec.serviceAccountName"},
        USER_COLUMN,
        *READY_COLUMNS,
        AGE_COLUMN,
    ]

    kind: str = "Source"
    spec: SourceSpec = Field(default_factory=SourceSpec)
    status: Status | None = None


class ServiceAccountReference(Model):
    """A service account anywhere in the cluster."""

    name: Name = Field(description="Name of the service account.")
    namespace: Name = Field(description="Namespace of the service account.")


class ClusterSourceSpec(Model):
    """Who may place delegate pods in any namespace: a service account or a user."""

    serviceAccount: ServiceAccountReference | None = Field(
        None, description="Service account that the source cluster uses; created if missing."
    )
    userName: str | None = Field(None, description="User name that the source cluster uses.")


class ClusterSource(Resource, plural="clustersources", short_names=["csrc"], namespaced=False):
    """A source cluster allowed to schedule pods in every namespace."""

    printer_columns = [
        {"name": "Service Account", "type": "string", "jsonPath": ".spec.serviceAccount.name"},
        {
            "name": "SA Namespace",
            "type": "string",
            "jsonPath": ".spec.serviceAccount.namespace",
        },
        USER_COLUMN,
        *READY_COLUMNS,
        AGE_COLUMN,
    ]

    kind: str = "ClusterSource"
    spec: ClusterSourceSpec = Field(default_factory=ClusterSourceSpec)
    status: Status | None = None


# -- targets (in source clusters) -------------------------------------------------------------

SELF_XOR_SECRET = {
    "rule": "(has(self.self) && self.self) != has(self.kubeconfigSecret)",
    "message": "exactly one of spec.self (true) and spec.kubeconfigSecret must be set",
}


FailoverAfterSeconds = Annotated[
    int | None,
    Field(
        ge=1,
        description=(
            "Release the proxy pods bound to this target once it has been unreachable (not "
            "Ready) for this many seconds, so that their owners replace them elsewhere; their "
            "delegates there are deleted when it comes back. Unset (the default): proxy pods "
            "wait for the target, so that a partition never runs a workload twice."
        ),
    ),
]

ExcludedLabelsRegexp = Annotated[
    str | None,
    Field(
        max_length=1024,
        description=(
            "Labels the target's ClusterSummary offers the virtual node are left off it when "
            "this regular expression (RE2 syntax, as Go's) matches their key=value, anywhere "
            "unless anchored: e.g. ^kubernetes\\.azure\\.com/cluster= keeps DaemonSets that "
            "select that label off the virtual node. An invalid one excludes nothing and is "
            "reported in an event."
        ),
    ),
]


class KubeconfigSecretReference(Model):
    """A Secret in the Target's namespace holding a kubeconfig of the target cluster."""

    name: Name = Field(description="Name of the Secret.")
    key: str = Field("config", min_length=1, description="Key of the kubeconfig in the Secret.")
    context: str | None = Field(
        None, description="Kubeconfig context to use (default: its current context)."
    )


class ClusterKubeconfigSecretReference(KubeconfigSecretReference):
    """A Secret holding a kubeconfig of the target cluster."""

    namespace: Name = Field(description="Namespace of the Secret.")


class TargetSpec(Model):
    """The cluster to schedule to: this one (self: true) or one reached by a kubeconfig."""

    self_: bool | None = Field(
        None, alias="self", description="Target the local cluster with the agent's own identity."
    )
    kubeconfigSecret: KubeconfigSecretReference | None = Field(
        None, description="Kubeconfig Secret, in the Target's namespace, to reach the target."
    )
    failoverAfterSeconds: FailoverAfterSeconds = None
    excludedLabelsRegexp: ExcludedLabelsRegexp = None


class Target(Resource, plural="targets", short_names=["tg"], namespaced=True):
    """A cluster that pods of this namespace may be scheduled to."""

    spec_rules = [SELF_XOR_SECRET]
    printer_columns = [
        SELF_COLUMN,
        SECRET_COLUMN,
        FAILOVER_COLUMN,
        *READY_COLUMNS,
        AGE_COLUMN,
    ]

    kind: str = "Target"
    spec: TargetSpec
    status: Status | None = None


class ClusterTargetSpec(TargetSpec):
    """The cluster to schedule to: this one (self: true) or one reached by a kubeconfig."""

    kubeconfigSecret: ClusterKubeconfigSecretReference | None = Field(
        None, description="Kubeconfig Secret to reach the target."
    )


class ClusterTarget(Target, plural="clustertargets", short_names=["ctg"], namespaced=False):
    """A cluster that pods of every namespace may be scheduled to."""

    printer_columns = [
        SELF_COLUMN,
        SECRET_COLUMN,
        {
            "name": "Secret Namespace",
            "type": "string",
            "jsonPath": ".spec.kubeconfigSecret.namespace",
            "priority": 1,
        },
        FAILOVER_COLUMN,
        *READY_COLUMNS,
        AGE_COLUMN,
    ]

    kind: str = "ClusterTarget"
    spec: ClusterTargetSpec


# -- cluster summaries (in every cluster) -----------------------------------------------------


class Taint(Model):
    key: str
    value: str | None = None
    effect: str


class NodeGroup(Model):
    """Nodes that look alike to the scheduler: same labels (high-cardinality ones excluded) and
    taints. Lets sources filter targets by node selector, affinity and tolerations."""

    labels: dict[str, str] = Field(default_factory=dict, description="Labels the nodes share.")
    taints: list[Taint] = Field(default_factory=list, description="Taints the nodes share.")
    count: int = Field(0, ge=0, description="Number of nodes.")
    allocatable: ResourceList = Field(default_factory=dict, description="Sum over the nodes.")
    requested: ResourceList = Field(
        default_factory=dict, description="Sum of the requests of their non-terminal pods."
    )
    largestFree: ResourceList = Field(
        default_factory=dict, description="Most of each resource free on a single node."
    )


class ClusterSummary(Resource, plural="clustersummaries", short_names=["mcsum"], namespaced=False):
    """What a cluster offers: the totals of its nodes, and its node groups. The singleton is
    named singleton."""

    top_level = ("capacity", "allocatable", "nodeGroups")
    printer_columns = [
        {"name": "CPU", "type": "string", "jsonPath": ".allocatable.cpu"},
        {"name": "Memory", "type": "string", "jsonPath": ".allocatable.memory"},
        {"name": "Pods", "type": "string", "jsonPath": ".allocatable.pods"},
        AGE_COLUMN,
    ]

    kind: str = "ClusterSummary"
    capacity: ResourceList = Field(default_factory=dict, description="Total capacity of nodes.")
    allocatable: ResourceList = Field(
        default_factory=dict, description="Total allocatable resources of nodes."
    )
    nodeGroups: list[NodeGroup] | None = Field(None, description="Nodes grouped by look-alike.")


# -- source heartbeats (in target clusters) ---------------------------------------------------

MAX_HEARTBEAT_DELEGATES = 1000
DelegateUid = Annotated[str, Field(min_length=1, max_length=64)]


class SourceHeartbeatSpec(Model):
    """Who renews this heartbeat, when it last did, and the delegates it created here."""

    source: str = Field(
        min_length=1,
        max_length=253,
        description="Name of the source cluster (the uid of its kube-system namespace, unless "
        "its agent was given another); the heartbeat's name is derived from it.",
    )
    writer: str = Field(
        min_length=1,
        max_length=1024,
        description="User name of whoever wrote this heartbeat last: the identity the source "
        "cluster has here. The chart's admission policy refuses any other value.",
    )
    writerUID: str | None = Field(
        None,
        max_length=128,
        description="UID of whoever wrote this heartbeat last, as the API server authenticated "
        "them (for a service account, the uid of the account whose token wrote it; none when "
        "someone impersonated it). The chart's admission policy refuses any other value.",
    )
    renewTime: str = Field(
        description="When the source last renewed it (RFC 3339, microseconds).",
        json_schema_extra={"format": "date-time"},
    )
    delegates: dict[str, DelegateUid] | None = Field(
        None,
        max_length=MAX_HEARTBEAT_DELEGATES,
        description="Delegate pods the source created in this namespace, name to uid, as its "
        "create requests were answered; only these are recreated while the source is away, "
        f"once each. At most {MAX_HEARTBEAT_DELEGATES}: the source's later delegates are not "
        "kept alive.",
    )


class SourceHeartbeat(Resource, plural="sourceheartbeats", short_names=["shb"], namespaced=True):
    """A source cluster renews one in each namespace of a target where it places delegates, so
    that the target's agent can tell a source that is away (and recreate the delegates it lists
    when they are deleted) from one that is there."""

    top_level = ("spec",)
    printer_columns = [
        {"name": "Source", "type": "string", "jsonPath": ".spec.source"},
        {"name": "Writer", "type": "string", "jsonPath": ".spec.writer"},
        {"name": "Renewed", "type": "date", "jsonPath": ".spec.renewTime"},
        AGE_COLUMN,
    ]

    kind: str = "SourceHeartbeat"
    spec: SourceHeartbeatSpec


RESOURCES: list[type[Resource]] = [
    Source,
    ClusterSource,
    Target,
    ClusterTarget,
    ClusterSummary,
    SourceHeartbeat,
]
