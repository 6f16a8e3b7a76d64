"""Elected pods that cannot work as proxy pods are refused with the reason, at admission: one
too large for its manifest to fit in its annotations (the API server's own refusal would blame
annotations the user kept small), one bound to a node already (it would run here, never
placed, and keep our finalizer forever). Labels the delegate would merge are admitted with a
warning. Reviews of another version or kind are not answered as if they were ours."""

from __future__ import annotations

import re
import time

import orjson
import pytest
import yaml

from multicluster_scheduler.api import constraints, keys
from multicluster_scheduler.api.constraints import MAX_DEPTH, MAX_FRAGMENT
from multicluster_scheduler.webhook.app import answer_review
from multicluster_scheduler.webhook.mutation import (
    ANNOTATIONS_LIMIT,
    label_warnings,
    mutation_patch,
)
from tests.webhook.json_patch import apply_patch
from tests.webhook.sealing import KEY, NAMESPACE, SEAL, USER_INFO


def pod(annotations: dict | None = None, labels: dict | None = None, **spec) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web",
            "namespace": NAMESPACE,
            "annotations": {keys.ELECT: "", **(annotations or {})},
            "labels": labels or {},
        },
        "spec": {"containers": [{"name": "main", "image": "busybox"}], **spec},
    }


def review(obj: object, **top) -> bytes:
    request = {
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": NAMESPACE,
        "userInfo": USER_INFO,
        "object": obj,
    }
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", **top, "request": request})


def annotation_bytes(annotations: dict[str, str]) -> int:
    return sum(len(k.encode()) + len(v.encode()) for k, v in annotations.items())


def mutated_annotations(p: dict) -> dict[str, str]:
    return apply_patch(p, mutation_patch(p, SEAL))["metadata"]["annotations"]


class TestSize:
    def test_the_limit_is_exact(self):
        base = annotation_bytes(mutated_annotations(pod({"example.com/blob": ""})))
        pad = (ANNOTATIONS_LIMIT - base) // 2  # the padding counts twice: as is, and saved
        fits = pod({"example.com/blob": "x" * pad})
        assert annotation_bytes(mutated_annotations(fits)) >= ANNOTATIONS_LIMIT - 1
        assert annotation_bytes(mutated_annotations(fits)) <= ANNOTATIONS_LIMIT
        with pytest.raises(ValueError, match="too large"):
            mutation_patch(pod({"example.com/blob": "x" * (pad + 1)}), SEAL)

    def test_a_refusal_gives_the_sizes(self):
        p = pod({"example.com/blob": "x" * (ANNOTATIONS_LIMIT // 2)})
        with pytest.raises(ValueError, match="too large") as refused:
            mutation_patch(p, SEAL)
        message = str(refused.value)
        assert keys.SOURCEPOD_MANIFEST in message
        assert str(ANNOTATIONS_LIMIT) in message
        own = annotation_bytes(p["metadata"]["annotations"])
        assert f"{own} of its own" in message

    def test_multibyte_characters_count_as_their_utf8_bytes(self):
        p = pod({"example.com/blob": "é" * (ANNOTATIONS_LIMIT // 4)})  # 2 bytes each
        with pytest.raises(ValueError, match="too large"):
            mutation_patch(p, SEAL)

    def test_a_huge_spec_counts_too(self):
        env = [{"name": f"V{i}", "value": "x" * 1000} for i in range(300)]
        p = pod(containers=[{"name": "main", "image": "busybox", "env": env}])
        with pytest.raises(ValueError, match="too large"):
            mutation_patch(p, SEAL)

    def test_an_existing_manifest_is_not_measured_again(self):
        p = pod({keys.SOURCEPOD_MANIFEST: "{}", "example.com/blob": "x" * 200_000})
        assert not [op for op in mutation_patch(p, SEAL) if "annotations" in op["path"]]

    def test_the_review_refuses_it_with_code_400(self):
        body = review(pod({"example.com/blob": "x" * 200_000}))
        result, answer = answer_review(body, KEY)
        assert result == "refused"
        assert answer["response"]["status"]["code"] == 400
        assert "too large" in answer["response"]["status"]["message"]


class TestNodeName:
    def test_a_pod_bound_to_a_node_is_refused(self):
        with pytest.raises(ValueError, match=re.escape("spec.nodeName is set ('node-1')")):
            mutation_patch(pod(nodeName="node-1"), SEAL)

    @pytest.mark.parametrize("node", [None, ""])
    def test_an_unset_node_name_is_fine(self, node):
        assert mutation_patch(pod(nodeName=node), SEAL)

    def test_an_unelected_pod_bound_to_a_node_is_admitted_unchanged(self):
        p = pod(nodeName="node-1")
        del p["metadata"]["annotations"][keys.ELECT]
        assert answer_review(review(p), KEY) == (
            "allowed",
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {"uid": "u", "allowed": True},
            },
        )


class TestLabelWarnings:
    def test_labels_with_the_same_last_segment_are_warned_about(self):
        labels = {"b.example.com/app": "y", "a.example.com/app": "x", "tier": "web"}
        assert label_warnings(pod(labels=labels)) == [
            "labels a.example.com/app, b.example.com/app all become "
            "multicluster.admiralty.io/app on the delegate: b.example.com/app wins"
        ]

    def test_a_label_that_would_forge_the_parent_uid_is_warned_about(self):
        (warning,) = label_warnings(pod(labels={"example.com/parent-uid": "x"}))
        assert "multicluster.admiralty.io/parent-uid" in warning
        assert "its own value" in warning

    @pytest.mark.parametrize(
        "labels", [{}, None, {"app": "x", "example.com/tier": "y"}, ["app"], "app=x"]
    )
    def test_distinct_or_malformed_labels_give_none(self, labels):
        p = pod()
        p["metadata"]["labels"] = labels
        assert label_warnings(p) == []

    def test_the_review_carries_them_next_to_the_patch(self):
        p = pod(labels={"a/app": "x", "b/app": "y"})
        result, answer = answer_review(review(p), KEY)
        assert result == "patched"
        assert answer["response"]["warnings"] == label_warnings(p)

    def test_they_are_given_once_when_the_manifest_is_saved(self):
        p = pod(labels={"a/app": "x", "b/app": "y"})
        proxy = apply_patch(p, mutation_patch(p, SEAL))
        result, answer = answer_review(review(proxy), KEY)
        assert result == "allowed"
        assert "warnings" not in answer["response"]
        p["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST] = "{}"  # the delegate's labels
        assert label_warnings(p) == []

    def test_no_warnings_no_field(self):
        _, answer = answer_review(review(pod(labels={"app": "x"})), KEY)
        assert "warnings" not in answer["response"]


@pytest.mark.parametrize(
    ("top", "reason"),
    [
        ({"apiVersion": "admission.k8s.io/v1beta1"}, "apiVersion is 'admission.k8s.io/v1beta1'"),
        ({"apiVersion": None}, "apiVersion is None"),
        ({"kind": "Pod"}, "kind is 'Pod'"),
        ({"kind": ["AdmissionReview"]}, "kind is \\['AdmissionReview'\\]"),
    ],
)
def test_a_review_of_another_version_or_kind_is_not_an_admission_review(top, reason):
    with pytest.raises(ValueError, match=reason):
        answer_review(review(pod(), **top), KEY)


def test_a_review_without_version_and_kind_is_still_answered():
    body = orjson.dumps({"request": orjson.loads(review(pod()))["request"]})
    assert answer_review(body, KEY)[0] == "patched"


class TestConstraintsCostLittle:
    """``proxy-pod-scheduling-constraints`` is YAML a tenant writes, read on the path of every pod
    creation in enabled namespaces: before, 120 KB of ``[`` cost the webhook three minutes of
    CPU (PyYAML's scanner is quadratic in nesting, then the composer overflowed the stack), and
    every other pod creation in every enabled namespace timed out meanwhile."""

    CONSTRAINTS = keys.PROXY_POD_SCHEDULING_CONSTRAINTS
    BOMBS = (
        "[" * 120_000,  # over the size read
        "[" * (MAX_FRAGMENT - 1),  # within it, nested too deep
        '["]",' * (MAX_FRAGMENT // 6),  # quoted closers do not hide the nesting
        "".join(" " * i + "a:\n" for i in range(MAX_DEPTH + 1)),  # block nesting
        "{" * (MAX_FRAGMENT // 2) + "}" * (MAX_FRAGMENT // 2),
    )

    @pytest.mark.parametrize("loader", ["libyaml", "python"])
    @pytest.mark.parametrize("text", BOMBS, ids=["size", "flow", "quoted", "block", "braces"])
    def test_a_bomb_is_refused_at_once_with_the_reason(self, text, loader, monkeypatch):
        if loader == "python":  # where PyYAML was built without libyaml
            monkeypatch.setattr(constraints, "_LOADER", yaml.SafeLoader)
        started = time.process_time()
        result, answer = answer_review(review(pod({self.CONSTRAINTS: text})), KEY)
        took = time.process_time() - started
        assert result == "refused"
        message = answer["response"]["status"]["message"]
        assert re.search(r"bytes: a PodSpec fragment|nested more than|not YAML or JSON", message)
        assert took < 2.0, f"{took:.1f} s of CPU for one pod"

    @pytest.mark.parametrize("loader", ["libyaml", "python"])
    def test_the_largest_fragment_read_costs_little(self, loader, monkeypatch):
        if loader == "python":
            monkeypatch.setattr(constraints, "_LOADER", yaml.SafeLoader)
        toleration = "{key: a, operator: Exists}"
        count = (MAX_FRAGMENT - 20) // (len(toleration) + 1)
        text = "tolerations: [" + ",".join([toleration] * count) + "]"
        assert len(text) <= MAX_FRAGMENT
        started = time.process_time()
        result, answer = answer_review(review(pod({self.CONSTRAINTS: text})), KEY)
        assert result == "patched", answer
        assert time.process_time() - started < 2.0

    def test_the_bounds_leave_room_for_real_fragments(self):
        deepest = (
            "affinity:\n nodeAffinity:\n  requiredDuringSchedulingIgnoredDuringExecution:\n"
            "   nodeSelectorTerms:\n   - matchExpressions:\n     - key: region\n"
            "       operator: In\n       values: [eu, us]\n"
        )
        result, _ = answer_review(review(pod({self.CONSTRAINTS: deepest})), KEY)
        assert result == "patched"
