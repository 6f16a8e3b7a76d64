"""multicluster: build Kubernetes controllers that watch and act on many clusters, in asyncio.

A :class:`Cluster` is a named connection with shared informers; a :class:`Controller` maps
events of any cluster to :class:`Request` s (cluster, namespace, name) that its reconciler
handles; a :class:`Manager` starts caches, waits for them, elects a leader and runs controllers.
"""

from .client import Client
from .cluster import Cluster
from .config import ClusterConfig, ConfigError
from .controller import Controller
from .errors import (
    AlreadyExists,
    ApiError,
    BadResponse,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    NamespaceTerminating,
    NotFound,
    ResponseTooLarge,
    Unauthorized,
    Unreachable,
)
from .gc import (
    ParentReferences,
    add_finalizer,
    delete_children,
    is_deleting,
    remove_finalizer,
)
from .handler import EnqueueMapped, EnqueueObject, EnqueueOwner, EnqueueParent, EventHandler
from .informer import (
    Informer,
    Registration,
    index_by_label,
    index_by_owner_uid,
    object_key,
    strip_managed_fields,
)
from .leaderelection import LeaderElectionConfig, LeaderElector
from .manager import LeadershipLost, Manager
from .readlimits import CacheBudget, CacheFull, ReadLimits
from .reconcile import Func, Reconciler, Request, Result, by_namespace
from .resources import Resource
from .sharing import SHARED, SharedValues
from .workqueue import WorkQueue

__all__ = [
    "SHARED",
    "AlreadyExists",
    "ApiError",
    "BadResponse",
    "CacheBudget",
    "CacheFull",
    "Client",
    "Cluster",
    "ClusterConfig",
    "ConfigError",
    "Conflict",
    "Controller",
    "EnqueueMapped",
    "EnqueueObject",
    "EnqueueOwner",
    "EnqueueParent",
    "EventHandler",
    "Forbidden",
    "Func",
    "Gone",
    "Informer",
    "Invalid",
    "LeaderElectionConfig",
    "LeaderElector",
    "LeadershipLost",
    "Manager",
    "NamespaceTerminating",
    "NotFound",
    "ParentReferences",
    "ReadLimits",
    "Reconciler",
    "Registration",
    "Request",
    "Resource",
    "ResponseTooLarge",
    "Result",
    "SharedValues",
    "Unauthorized",
    "Unreachable",
    "WorkQueue",
    "add_finalizer",
    "by_namespace",
    "delete_children",
    "index_by_label",
    "index_by_owner_uid",
    "is_deleting",
    "object_key",
    "remove_finalizer",
    "strip_managed_fields",
]
