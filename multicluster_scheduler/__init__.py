"""multicluster-scheduler: schedule Kubernetes pods across clusters.

Elected pods become proxy pods on virtual nodes (one per target cluster); delegate pods with the
original spec run in the target chosen by the scheduler.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("multicluster-scheduler")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
