"""The product's cross-cluster keys are the runtime's (written out in ``api/keys.py`` so that
the webhook's process need not load the runtime)."""

from multicluster.gc import ParentReferences
from multicluster_scheduler.api import keys


def test_parent_references_and_finalizer_are_the_runtimes():
    refs = ParentReferences(keys.PREFIX)
    assert (refs.uid_key, refs.name_key, refs.namespace_key, refs.cluster_key, refs.finalizer) == (
        keys.PARENT_UID,
        keys.PARENT_NAME,
        keys.PARENT_NAMESPACE,
        keys.PARENT_CLUSTER_NAME,
        keys.FINALIZER,
    )
