"""REST descriptors of our custom resources, for the runtime's client and informers."""

from __future__ import annotations

from multicluster import Resource

from .keys import GROUP, VERSION
from .v1alpha1 import (
    ClusterSource,
    ClusterSummary,
    ClusterTarget,
    Source,
    SourceHeartbeat,
    Target,
)
from .v1alpha1 import Resource as Model


def resource(model: type[Model]) -> Resource:
    return Resource(GROUP, VERSION, model.plural, model.kind_name, model.namespaced)


SOURCES = resource(Source)
CLUSTER_SOURCES = resource(ClusterSource)
TARGETS = resource(Target)
CLUSTER_TARGETS = resource(ClusterTarget)
CLUSTER_SUMMARIES = resource(ClusterSummary)
SOURCE_HEARTBEATS = resource(SourceHeartbeat)
