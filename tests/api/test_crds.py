"""The committed CRDs are what the models generate, and the models read the guide's manifests."""

from __future__ import annotations

import pytest
import yaml

from multicluster_scheduler.api import crds
from multicluster_scheduler.api.v1alpha1 import ClusterSource, ClusterTarget, Source, Target
from testbed import guide


def test_committed_crds_match_the_models():
    assert crds.stale() == [], "run: python -m multicluster_scheduler.api.crds"


def test_every_crd_is_structural_enough():
    for name, text in crds.rendered().items():
        crd = yaml.safe_load(text.split("\n", 1)[1])
        version = crd["spec"]["versions"][0]
        schema = version["schema"]["openAPIV3Schema"]
        assert "$ref" not in text, name
        assert "type: null" not in text, name
        assert schema["type"] == "object"
        assert crd["spec"]["names"]["shortNames"], name
        assert any(c["name"] == "Age" for c in version["additionalPrinterColumns"])


def test_target_crd_carries_the_self_xor_secret_rule():
    target = yaml.safe_load(crds.render(Target).split("\n", 1)[1])
    spec = target["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["x-kubernetes-validations"][0]["rule"] == (
        "(has(self.self) && self.self) != has(self.kubeconfigSecret)"
    )
    assert spec["properties"]["kubeconfigSecret"]["properties"]["key"]["default"] == "config"


@pytest.mark.parametrize(
    ("model", "text"),
    [
        (Source, guide.source("default")),
        (ClusterSource, guide.CLUSTER_SOURCE),
        *[(Target, doc) for doc in guide.targets("default").split("---\n")],
        *[(ClusterTarget, doc) for doc in guide.CLUSTER_TARGETS.split("---\n")],
    ],
)
def test_models_read_the_guide_manifests(model, text):
    parsed = model.model_validate(yaml.safe_load(text))
    assert parsed.kind == model.kind_name


def test_target_model_fields():
    self_target, secret_target = (
        Target.model_validate(yaml.safe_load(d))
        for d in reversed(guide.targets("ns").split("---\n"))
    )
    assert self_target.spec.self_ is True
    assert secret_target.spec.kubeconfigSecret.key == "config"
    cluster = ClusterTarget.model_validate(yaml.safe_load(guide.CLUSTER_TARGETS.split("---\n")[0]))
    assert cluster.spec.kubeconfigSecret.namespace == "admiralty"
