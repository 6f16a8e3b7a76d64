"""An elected pod becomes a proxy pod: each step of the mutation, idempotence, and patches that
apply cleanly for any pod-like object; the review answer never fails but as a refusal."""

from __future__ import annotations

import base64
import contextlib
import copy

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from json_patch import apply_patch

from multicluster_scheduler.api import keys
from multicluster_scheduler.webhook.mutation import is_elected, mutation_patch
from multicluster_scheduler.webhook.server import answer_review
from tests.webhook.sealing import KEY, NAMESPACE, SEAL, USER_INFO

PROXY_TOLERATIONS = [
    {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "admiralty"},
    {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
]


def user_pod() -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "web-",
            "namespace": NAMESPACE,
            "labels": {"app": "web", "example.com/tier": "front"},
            "annotations": {keys.ELECT: "", "example.com/note": "kept"},
            "finalizers": ["example.com/keep"],
        },
        "spec": {
            "containers": [
                {
                    "name": "nginx",
                    "image": "nginx",
                    "env": [{"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg"}}}],
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                }
            ],
            "volumes": [{"name": "data", "secret": {"secretName": "s"}}],
            "schedulerName": "default-scheduler",
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "affinity": {"nodeAffinity": {}},
            "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone"}],
            "terminationGracePeriodSeconds": 30,
        },
    }


def mutate(pod: dict) -> dict:
    return apply_patch(pod, mutation_patch(pod, SEAL))


def assert_proxy(proxy: dict) -> None:
    metadata, spec = proxy["metadata"], proxy["spec"]
    assert keys.SOURCEPOD_MANIFEST in metadata["annotations"]
    assert metadata["labels"][keys.HAS_FINALIZER] == "true"
    assert keys.FINALIZER in metadata["finalizers"]
    assert spec["tolerations"] == PROXY_TOLERATIONS
    assert spec["schedulerName"] == "admiralty-proxy"
    assert spec["nodeSelector"] == {"virtual-kubelet.io/provider": "admiralty"}
    assert "affinity" not in spec
    assert "topologySpreadConstraints" not in spec
    assert spec["terminationGracePeriodSeconds"] == 0


class TestElection:
    @pytest.mark.parametrize("value", ["", "true", "false"])
    def test_the_annotation_elects_whatever_its_value(self, value):
        assert is_elected({"metadata": {"annotations": {keys.ELECT: value}}})

    @pytest.mark.parametrize(
        "pod",
        [{}, {"metadata": {}}, {"metadata": {"annotations": {"elect": ""}}}, {"metadata": None}],
    )
    def test_other_pods_are_not_elected(self, pod):
        assert not is_elected(pod)

    @pytest.mark.parametrize(
        "pod", ["pod", [], {"metadata": "x"}, {"metadata": {"annotations": [keys.ELECT]}}]
    )
    def test_non_objects_are_refused(self, pod):
        with pytest.raises(ValueError, match="not"):
            is_elected(pod)


class TestSteps:
    def test_the_manifest_is_the_pod_as_received(self):
        pod = user_pod()
        proxy = mutate(pod)
        manifest = proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST]
        assert manifest == orjson.dumps(pod).decode()
        assert orjson.loads(manifest) == user_pod()

    def test_an_existing_manifest_is_left_alone(self):
        """(Whether it is the webhook's own is checked before: ``reinvocation``.)"""
        pod = user_pod()
        pod["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST] = "{}"
        ops = mutation_patch(pod, SEAL)
        assert not [op for op in ops if op["path"].startswith("/metadata/annotations")]
        assert mutate(pod)["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST] == "{}"

    def test_the_manifest_is_saved_with_its_mac(self):
        pod = user_pod()
        annotations = mutate(pod)["metadata"]["annotations"]
        manifest = annotations[keys.SOURCEPOD_MANIFEST]
        assert annotations[keys.SOURCEPOD_MANIFEST_MAC] == SEAL(manifest)

    def test_a_pod_without_annotations_gets_both_in_one_operation(self):
        pod = user_pod()
        del pod["metadata"]["annotations"]
        ops = [op for op in mutation_patch(pod, SEAL) if "annotations" in op["path"]]
        assert [(op["op"], op["path"]) for op in ops] == [("add", "/metadata/annotations")]
        assert set(ops[0]["value"]) == {keys.SOURCEPOD_MANIFEST, keys.SOURCEPOD_MANIFEST_MAC}

    def test_tolerations_are_replaced(self):
        assert mutate(user_pod())["spec"]["tolerations"] == PROXY_TOLERATIONS

    def test_tolerations_carry_no_eviction_delay(self):
        for toleration in mutate(user_pod())["spec"]["tolerations"]:
            assert "tolerationSeconds" not in toleration

    def test_the_proxy_scheduler_schedules_it(self):
        assert mutate(user_pod())["spec"]["schedulerName"] == "admiralty-proxy"

    def test_only_virtual_nodes_fit(self):
        spec = mutate(user_pod())["spec"]
        assert spec["nodeSelector"] == {"virtual-kubelet.io/provider": "admiralty"}
        assert "affinity" not in spec
        assert "topologySpreadConstraints" not in spec

    def test_absent_affinity_is_not_removed(self):
        pod = user_pod()
        del pod["spec"]["affinity"], pod["spec"]["topologySpreadConstraints"]
        assert not [op for op in mutation_patch(pod, SEAL) if op["op"] == "remove"]

    def test_deletion_is_immediate_but_finalized(self):
        metadata = mutate(user_pod())["metadata"]
        assert metadata["finalizers"] == ["example.com/keep", keys.FINALIZER]
        assert metadata["labels"][keys.HAS_FINALIZER] == "true"
        assert mutate(user_pod())["spec"]["terminationGracePeriodSeconds"] == 0

    def test_a_wrong_has_finalizer_label_is_corrected(self):
        pod = user_pod()
        pod["metadata"]["labels"][keys.HAS_FINALIZER] = "false"
        ops = mutation_patch(pod, SEAL)
        label_path = "/metadata/labels/multicluster.admiralty.io~1has-finalizer"
        assert {"op": "replace", "path": label_path, "value": "true"} in ops

    @pytest.mark.parametrize("grace", [False, 0.0, None, "0"])
    def test_grace_period_is_strictly_the_integer_zero(self, grace):
        pod = user_pod()
        pod["spec"]["terminationGracePeriodSeconds"] = grace
        proxy = mutate(pod)
        assert type(proxy["spec"]["terminationGracePeriodSeconds"]) is int
        assert mutation_patch(proxy, SEAL) == []

    def test_what_follow_controllers_read_is_unchanged(self):
        pod, proxy = user_pod(), mutate(user_pod())
        assert proxy["metadata"]["labels"] == {
            **pod["metadata"]["labels"],
            keys.HAS_FINALIZER: "true",
        }
        annotations = dict(proxy["metadata"]["annotations"])
        del annotations[keys.SOURCEPOD_MANIFEST]
        del annotations[keys.SOURCEPOD_MANIFEST_MAC]
        assert annotations == pod["metadata"]["annotations"]
        assert proxy["spec"]["containers"] == pod["spec"]["containers"]
        assert proxy["spec"]["volumes"] == pod["spec"]["volumes"]
        assert {k: v for k, v in proxy.items() if k not in ("metadata", "spec")} == {
            k: v for k, v in pod.items() if k not in ("metadata", "spec")
        }

    def test_the_input_is_not_modified(self):
        pod = user_pod()
        mutation_patch(pod, SEAL)
        assert pod == user_pod()


class TestShapes:
    def test_missing_maps_and_lists_are_added_whole(self):
        pod = {"metadata": {"name": "p"}, "spec": {"containers": []}}
        ops = mutation_patch(pod, SEAL)
        assert {op["path"] for op in ops} == {
            "/metadata/annotations",
            "/metadata/labels",
            "/metadata/finalizers",
            "/spec/tolerations",
            "/spec/schedulerName",
            "/spec/nodeSelector",
            "/spec/terminationGracePeriodSeconds",
        }
        assert all(op["op"] == "add" for op in ops)
        assert_proxy(apply_patch(pod, ops))

    def test_null_maps_are_replaced_whole(self):
        pod = {"metadata": {"annotations": None, "labels": None, "finalizers": None}, "spec": {}}
        assert_proxy(mutate(pod))

    def test_missing_metadata_and_spec_are_added_whole(self):
        ops = mutation_patch({"kind": "Pod"}, SEAL)
        assert [(op["op"], op["path"]) for op in ops] == [("add", "/metadata"), ("add", "/spec")]
        proxy = mutate({"kind": "Pod"})
        assert_proxy(proxy)
        assert orjson.loads(proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST]) == {
            "kind": "Pod"
        }

    def test_our_keys_are_escaped_in_pointers(self):
        paths = {op["path"] for op in mutation_patch(user_pod(), SEAL)}
        assert "/metadata/annotations/multicluster.admiralty.io~1sourcepod-manifest" in paths
        assert "/metadata/labels/multicluster.admiralty.io~1has-finalizer" in paths

    def test_keys_that_need_escaping_survive(self):
        pod = user_pod()
        pod["metadata"]["annotations"].update({"a~1b": "1", "c/~d": "2", "~": "3"})
        proxy = mutate(pod)
        for key in ("a~1b", "c/~d", "~"):
            assert proxy["metadata"]["annotations"][key] == pod["metadata"]["annotations"][key]

    @pytest.mark.parametrize(
        ("pod", "reason"),
        [
            ("pod", "not a pod"),
            (None, "not a pod"),
            ({"metadata": []}, "metadata is not an object"),
            ({"spec": "x"}, "spec is not an object"),
            ({"metadata": {"annotations": {"a": 1}}}, "annotations is not a map of strings"),
            ({"metadata": {"annotations": "a"}}, "annotations is not an object"),
            ({"metadata": {"labels": {"a": None}}}, "labels is not a map of strings"),
            ({"metadata": {"finalizers": "f"}}, "finalizers is not a list of strings"),
            ({"metadata": {"finalizers": [1]}}, "finalizers is not a list of strings"),
        ],
    )
    def test_unusable_pods_are_refused_with_a_reason(self, pod, reason):
        with pytest.raises(ValueError, match=reason):
            mutation_patch(pod, SEAL)


class TestIdempotence:
    def test_a_proxy_pod_needs_no_patch(self):
        assert mutation_patch(mutate(user_pod()), SEAL) == []

    def test_reinvocation_keeps_the_first_manifest(self):
        once = mutate(user_pod())
        assert mutate(once) == once


# Pod-like objects: the fields the mutation reads, each absent, null, well typed or arbitrary.
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
keys_like = st.sampled_from(
    [keys.ELECT, keys.SOURCEPOD_MANIFEST, keys.HAS_FINALIZER, "a/b", "~0", "~1/", "-", "0", ""]
) | st.text(max_size=12)
string_maps = st.dictionaries(keys_like, st.text(max_size=8), max_size=5)
spec_values = {
    "tolerations": json_values | st.just(PROXY_TOLERATIONS),
    "schedulerName": json_values | st.just("admiralty-proxy"),
    "nodeSelector": json_values | st.just({"virtual-kubelet.io/provider": "admiralty"}),
    "affinity": json_values,
    "topologySpreadConstraints": json_values,
    "terminationGracePeriodSeconds": json_values | st.just(0),
    "containers": json_values,
}


def optional_fields(fields: dict) -> st.SearchStrategy[dict]:
    return st.fixed_dictionaries({}, optional=fields)


pods = optional_fields(
    {
        "metadata": st.none()
        | optional_fields(
            {
                "annotations": st.none() | string_maps,
                "labels": st.none() | string_maps,
                "finalizers": st.none()
                | st.lists(st.sampled_from([keys.FINALIZER, "x/y"]) | st.text(max_size=6)),
                "name": json_values,
            }
        ),
        "spec": st.none() | optional_fields(spec_values),
        "status": json_values,
        "kind": json_values,
    }
)


@settings(max_examples=300)
@given(pods)
def test_any_pod_like_object_becomes_a_proxy_pod(pod):
    received = copy.deepcopy(pod)
    ops = mutation_patch(pod, SEAL)
    assert pod == received
    for op in ops:
        assert op["op"] in ("add", "remove", "replace")
        assert op["path"].startswith("/")
        assert ("value" in op) == (op["op"] != "remove")
    proxy = apply_patch(pod, ops)
    assert_proxy(proxy)
    if keys.SOURCEPOD_MANIFEST not in ((pod.get("metadata") or {}).get("annotations") or {}):
        manifest = proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST]
        assert orjson.loads(manifest) == received
    assert mutation_patch(proxy, SEAL) == []


@given(json_values)
def test_anything_else_is_refused_or_mutated(value):
    try:
        ops = mutation_patch(value, SEAL)
    except ValueError:
        return
    assert_proxy(apply_patch(value, ops))


def review(obj: object, *, operation: object = "CREATE", kind: object = None) -> bytes:
    request = {
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"} if kind is None else kind,
        "operation": operation,
        "namespace": NAMESPACE,
        "userInfo": USER_INFO,
        "object": obj,
    }
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "request": request})


@given(st.binary(max_size=64) | json_values.map(orjson.dumps))
def test_any_body_is_answered_or_refused_as_not_a_review(body):
    with contextlib.suppress(ValueError):
        answer_review(body, KEY)


@settings(max_examples=300)
@given(
    obj=json_values | pods,
    operation=st.sampled_from(["CREATE", "UPDATE", "DELETE", None]) | json_values,
    kind=st.none() | json_values,
)
def test_any_review_is_answered(obj, operation, kind):
    result, answer = answer_review(review(obj, operation=operation, kind=kind), KEY)
    response = answer["response"]
    assert response["uid"] == "u"
    assert result in ("allowed", "patched", "refused")
    assert response["allowed"] == (result != "refused")
    if result == "refused":
        assert response["status"]["code"] == 400
        assert response["status"]["message"]
    assert ("patch" in response) == (result == "patched")


@settings(max_examples=200)
@given(pods)
def test_elected_pods_get_the_mutation_patch(pod):
    pod.setdefault("metadata", None)
    pod["metadata"] = {
        **(pod["metadata"] or {}),
        "annotations": {**((pod["metadata"] or {}).get("annotations") or {}), keys.ELECT: ""},
    }
    result, answer = answer_review(review(pod), KEY)
    if keys.SOURCEPOD_MANIFEST in pod["metadata"]["annotations"]:
        assert result == "refused", "a manifest the webhook did not write for this request"
        assert "did not write for you in this namespace" in answer["response"]["status"]["message"]
        return
    ops = mutation_patch(pod, SEAL)
    assert result == ("patched" if ops else "allowed")
    if ops:
        assert orjson.loads(base64.b64decode(answer["response"]["patch"])) == ops


# -- what a proxy pod asks of virtual nodes (upstream's annotations) ----------------------------

CONSTRAINTS = keys.PROXY_POD_SCHEDULING_CONSTRAINTS


def annotated(**annotations: str) -> dict:
    pod = user_pod()
    pod["metadata"]["annotations"].update(annotations)
    return pod


def test_the_constraints_annotation_is_what_the_proxy_pod_asks_of_virtual_nodes():
    fragment = """
nodeSelector:
  multicluster.admiralty.io/target-name: c2
tolerations:
- {key: maintenance, operator: Exists}
affinity:
  nodeAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      nodeSelectorTerms:
      - matchExpressions: [{key: region, operator: In, values: [eu]}]
"""
    pod = annotated(**{CONSTRAINTS: fragment})
    proxy = mutate(pod)
    spec = proxy["spec"]
    assert spec["nodeSelector"] == {
        "multicluster.admiralty.io/target-name": "c2",
        "virtual-kubelet.io/provider": "admiralty",
    }
    assert spec["tolerations"] == [*PROXY_TOLERATIONS, {"key": "maintenance", "operator": "Exists"}]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert "topologySpreadConstraints" not in spec
    manifest = orjson.loads(proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST])
    assert manifest["spec"] == pod["spec"], "the delegate keeps the pod's own constraints"
    assert mutation_patch(proxy, SEAL) == [], "a reinvocation changes nothing"


def test_use_constraints_from_spec_moves_the_pods_constraints_to_the_proxy():
    pod = annotated(**{keys.USE_CONSTRAINTS_FROM_SPEC: ""})
    proxy = mutate(pod)
    spec = proxy["spec"]
    assert spec["nodeSelector"] == {"disk": "ssd", "virtual-kubelet.io/provider": "admiralty"}
    assert spec["tolerations"] == [*PROXY_TOLERATIONS, *pod["spec"]["tolerations"]]
    assert spec["affinity"] == pod["spec"]["affinity"]
    assert spec["topologySpreadConstraints"] == pod["spec"]["topologySpreadConstraints"]
    assert mutation_patch(proxy, SEAL) == [], "a reinvocation reads the saved manifest"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[1, 2]", "not a PodSpec fragment"),
        ("containers: []", "only nodeSelector"),
        ("nodeSelector: [a]", "nodeSelector is not an object"),
        ("nodeSelector: {a: 1}", "not a map of strings"),
        ("tolerations: {a: b}", "tolerations is not a list"),
        ("a: &x [1]\nb: *x", "aliases"),
        ("{", "not YAML or JSON"),
    ],
)
def test_a_constraints_annotation_that_is_not_a_fragment_refuses_the_pod(text, says):
    with pytest.raises(ValueError, match=says):
        mutation_patch(annotated(**{CONSTRAINTS: text}), SEAL)


def test_an_invalid_no_prefix_label_regexp_refuses_the_pod_with_the_reason():
    pod = annotated(**{keys.NO_PREFIX_LABEL_REGEXP: "a(b"})
    with pytest.raises(ValueError, match=r"no-prefix-label-regexp is not a regular .*missing \)"):
        mutation_patch(pod, SEAL)
    assert mutation_patch(annotated(**{keys.NO_PREFIX_LABEL_REGEXP: "^app="}), SEAL)
