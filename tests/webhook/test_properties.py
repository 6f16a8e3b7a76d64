"""The webhook as the API server meets it, the ASGI application of ``webhook/app.py``, called
directly with generated requests: whatever arrives (any method, path, body, split into any
chunks), the answer is never a 5xx and always JSON; an AdmissionReview of a pod is always
answered for its uid; an elected pod is refused with a reason or admitted with a patch that is
valid RFC 6902, applies cleanly, makes the proxy pod docs/scheduling.md describes, and is not
patched again when the API server reinvokes the webhook, even after another webhook changed the pod.

``test_mutation.py`` checks ``mutation_patch`` itself on arbitrary pod-like objects; here the
pods look like those users create (labels that collide once prefixed, existing finalizers,
tolerations, affinity, a manifest already saved), and everything goes through HTTP."""

from __future__ import annotations

import asyncio
import base64
import copy

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.naming import prefixed_label_key
from multicluster_scheduler.webhook.app import MAX_BODY, RESULTS, create_app
from tests.webhook.json_patch import apply_patch
from tests.webhook.sealing import KEY, NAMESPACE, USER_INFO

PROXY_TOLERATIONS = [
    {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "admiralty"},
    {"key": "node.kubernetes.io/network-unavailable", "operator": "Exists"},
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
]
OURS = (keys.SOURCEPOD_MANIFEST, keys.SOURCEPOD_MANIFEST_MAC, keys.HAS_FINALIZER)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Answer:
    def __init__(self, status: int, headers: dict[bytes, bytes], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body
        self.json = orjson.loads(body)


def call(
    body: bytes, *, method: str = "POST", path: str = "/mutate", chunks: int = 1
) -> tuple[Answer, list[str]]:
    """One request through the ASGI application; the answer and what it counted."""
    counted: list[str] = []
    app = create_app(counted.append, KEY, lambda: 1_800_000_000.0)  # the same MAC each time
    size = max(1, -(-len(body) // chunks))
    parts = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    messages = [
        {"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
        for i, part in enumerate(parts)
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(b"content-type", b"application/json")],
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    start, *bodies = sent
    assert start["type"] == "http.response.start"
    payload = b"".join(m["body"] for m in bodies)
    headers = dict(start["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert int(headers[b"content-length"]) == len(payload)
    return Answer(start["status"], headers, payload), counted


def review(obj: object, *, operation: object = "CREATE", kind: object = "Pod", uid="u-1") -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": kind},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": operation,
            "userInfo": USER_INFO,
            "namespace": NAMESPACE,
            "object": obj,
        },
    }


def answered(obj: object, **kwargs) -> tuple[dict, list[str]]:
    """The response of a review, checked as the API server checks it."""
    answer, counted = call(orjson.dumps(review(obj, **kwargs)))
    assert answer.status == 200, answer.json
    assert answer.json["apiVersion"] == "admission.k8s.io/v1"
    assert answer.json["kind"] == "AdmissionReview"
    response = answer.json["response"]
    assert response["uid"] == kwargs.get("uid", "u-1")
    assert isinstance(response["allowed"], bool)
    assert len(counted) == 1
    return response, counted


def patch_of(response: dict) -> list[dict] | None:
    if "patch" not in response:
        assert "patchType" not in response
        return None
    assert response["patchType"] == "JSONPatch"
    ops = orjson.loads(base64.b64decode(response["patch"], validate=True))
    assert isinstance(ops, list)
    assert ops, "an empty patch is sent as no patch"
    for op in ops:
        assert op["op"] in ("add", "remove", "replace", "move", "copy", "test")
        assert isinstance(op["path"], str)
        assert op["path"].startswith("/")
        assert ("value" in op) == (op["op"] in ("add", "replace", "test"))
    return ops


# -- pods as users write them --------------------------------------------------------------

dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
label_names = st.sampled_from(["app", "tier", "parent-uid", "has-finalizer", "name"]) | dns_label
label_prefixes = st.sampled_from(
    ["", "a.example.com/", "b.example.com/", "app.kubernetes.io/", keys.PREFIX]
)
label_keys = st.builds(str.__add__, label_prefixes, label_names)
strings = st.text(max_size=12)
containers = st.lists(
    st.fixed_dictionaries(
        {"name": dns_label, "image": st.sampled_from(["nginx", "busybox:1.36"])},
        optional={
            "resources": st.fixed_dictionaries(
                {"requests": st.fixed_dictionaries({"cpu": st.sampled_from(["100m", "1"])})}
            ),
            "env": st.lists(
                st.fixed_dictionaries({"name": st.sampled_from(["A", "B"]), "value": strings}),
                max_size=2,
            ),
            "volumeMounts": st.just(
                [{"name": "token", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]
            ),
        },
    ),
    min_size=1,
    max_size=3,
)
tolerations = st.lists(
    st.sampled_from(
        [
            {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
            PROXY_TOLERATIONS[0],
            {"operator": "Exists"},
        ]
    ),
    max_size=3,
)
affinity = st.just(
    {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        }
    }
)
specs = st.fixed_dictionaries(
    {"containers": containers},
    optional={
        "initContainers": containers,
        "volumes": st.just([{"name": "token", "projected": {"sources": []}}]),
        "tolerations": tolerations | st.just(PROXY_TOLERATIONS),
        "nodeSelector": st.dictionaries(label_keys, dns_label, max_size=2)
        | st.just({keys.PROVIDER_KEY: keys.PROVIDER}),
        "affinity": affinity,
        "topologySpreadConstraints": st.just(
            [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]
        ),
        "schedulerName": st.sampled_from(["default-scheduler", keys.PROXY_SCHEDULER_NAME]),
        "terminationGracePeriodSeconds": st.sampled_from([0, 30]),
        "priority": st.integers(0, 1000),
        "priorityClassName": st.just("high"),
        "nodeName": st.sampled_from(["", "node-1"]),
        "serviceAccountName": dns_label,
    },
)
metadatas = st.fixed_dictionaries(
    {
        "annotations": st.dictionaries(label_keys, strings, max_size=3).map(
            lambda a: {**a, keys.ELECT: ""}
        )
    },
    optional={
        "name": dns_label,
        "generateName": st.just("web-"),
        "namespace": st.just("default"),
        "labels": st.dictionaries(label_keys, dns_label, max_size=4),
        "finalizers": st.lists(
            st.sampled_from(["example.com/keep", keys.FINALIZER]), max_size=2, unique=True
        ),
        "ownerReferences": st.just(
            [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-1"}]
        ),
    },
)
pods = st.fixed_dictionaries(
    {"apiVersion": st.just("v1"), "kind": st.just("Pod"), "metadata": metadatas, "spec": specs}
)


def assert_proxy(proxy: dict, pod: dict) -> None:
    """docs/scheduling.md, "From pod to proxy pod (the webhook)"."""
    meta, spec = proxy["metadata"], proxy["spec"]
    before_meta, before_spec = pod["metadata"], pod["spec"]
    saved = before_meta["annotations"].get(keys.SOURCEPOD_MANIFEST)
    if saved is None:
        assert orjson.loads(meta["annotations"][keys.SOURCEPOD_MANIFEST]) == pod
    else:
        assert meta["annotations"][keys.SOURCEPOD_MANIFEST] == saved
    assert spec["tolerations"] == PROXY_TOLERATIONS
    assert spec["schedulerName"] == keys.PROXY_SCHEDULER_NAME
    assert spec["nodeSelector"] == {keys.PROVIDER_KEY: keys.PROVIDER}
    assert "affinity" not in spec
    assert "topologySpreadConstraints" not in spec
    assert spec["terminationGracePeriodSeconds"] == 0
    assert meta["finalizers"].count(keys.FINALIZER) == 1
    assert [f for f in meta["finalizers"] if f != keys.FINALIZER] == [
        f for f in before_meta.get("finalizers") or () if f != keys.FINALIZER
    ]
    assert meta["labels"][keys.HAS_FINALIZER] == "true"
    # Labels, annotations, containers, volumes and env stay: the follow controllers read them.
    for field in ("labels", "annotations"):
        kept = {k: v for k, v in (meta.get(field) or {}).items() if k not in OURS}
        assert kept == {k: v for k, v in (before_meta.get(field) or {}).items() if k not in OURS}
    changed = {"tolerations", "schedulerName", "nodeSelector", "terminationGracePeriodSeconds"}
    changed |= {"affinity", "topologySpreadConstraints"}
    assert {k: v for k, v in spec.items() if k not in changed} == {
        k: v for k, v in before_spec.items() if k not in changed
    }
    for field in ("name", "generateName", "namespace", "ownerReferences"):
        assert meta.get(field) == before_meta.get(field)


def expected_warnings(pod: dict) -> set[str]:
    """The prefixed labels that several user labels (or one forging ours) become."""
    groups: dict[str, list[str]] = {}
    for key in pod["metadata"].get("labels") or {}:
        groups.setdefault(prefixed_label_key(key), []).append(key)
    return {
        prefixed
        for prefixed, found in groups.items()
        if len(found) > 1 or prefixed == keys.PARENT_UID
    }


@SETTINGS
@given(pods)
def test_an_elected_pod_becomes_a_proxy_pod_or_is_refused_with_the_reason(pod):
    received = copy.deepcopy(pod)
    response, counted = answered(pod)
    if pod["spec"].get("nodeName"):
        assert counted == ["refused"]
        assert response["allowed"] is False
        assert response["status"]["code"] == 400
        assert "spec.nodeName is set" in response["status"]["message"]
        assert "patch" not in response
        return
    assert response["allowed"] is True
    ops = patch_of(response)
    proxy = apply_patch(pod, ops or [])
    assert pod == received
    assert counted == ["patched" if ops else "allowed"]
    assert_proxy(proxy, pod)
    warned = response.get("warnings") or []
    assert {w.split(" on the delegate")[0].rsplit(" ", 1)[-1] for w in warned} == (
        set()
        if keys.SOURCEPOD_MANIFEST in pod["metadata"]["annotations"]
        else expected_warnings(pod)
    )

    # Reinvocation: the API server calls again with the patched pod; nothing more to do.
    again, counted = answered(proxy)
    assert again["allowed"] is True
    assert patch_of(again) is None
    assert counted == ["allowed"]
    assert "warnings" not in again  # given with the first answer, about the saved manifest


other_webhooks = st.sampled_from(
    [
        lambda p: p["metadata"]["labels"].update({"sidecar.example.com/injected": "true"}),
        lambda p: p["metadata"]["annotations"].update({"example.com/seen": "yes"}),
        lambda p: p["spec"]["tolerations"].append({"key": "x", "operator": "Exists"}),
        lambda p: p["spec"].update(schedulerName="default-scheduler"),
        lambda p: p["spec"].update(affinity={"nodeAffinity": {}}),
        lambda p: p["spec"]["containers"].append({"name": "sidecar", "image": "envoy"}),
        lambda p: p["metadata"]["finalizers"].pop(),
        lambda p: p["metadata"]["labels"].pop(keys.HAS_FINALIZER, None),
    ]
)


@SETTINGS
@given(
    pods.filter(lambda p: not p["spec"].get("nodeName")),
    st.lists(other_webhooks, max_size=3, unique=True),
)
def test_reinvocation_after_other_webhooks_keeps_the_first_manifest(pod, changes):
    response, _ = answered(pod)
    proxy = apply_patch(pod, patch_of(response) or [])
    manifest = proxy["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST]
    changed = copy.deepcopy(proxy)
    for change in changes:
        change(changed)
    again, _ = answered(changed)
    final = apply_patch(changed, patch_of(again) or [])
    assert final["metadata"]["annotations"][keys.SOURCEPOD_MANIFEST] == manifest
    assert_proxy(final, changed)
    assert patch_of(answered(final)[0]) is None


# -- anything at all -----------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
review_like = st.fixed_dictionaries(
    {},
    optional={
        "apiVersion": st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1"])
        | json_values,
        "kind": st.sampled_from(["AdmissionReview"]) | json_values,
        "request": st.fixed_dictionaries(
            {},
            optional={
                "uid": st.text(max_size=8) | json_values,
                "kind": st.fixed_dictionaries({"kind": st.sampled_from(["Pod", "Service"])})
                | json_values,
                "operation": st.sampled_from(["CREATE", "UPDATE", "DELETE"]) | json_values,
                "object": pods | json_values,
            },
        )
        | json_values,
    },
)
bodies = (
    st.binary(max_size=64)
    | json_values.map(orjson.dumps)
    | review_like.map(orjson.dumps)
    | st.sampled_from([b"", b"{", b"null", b"[]", b'{"request": null}', b"\xff\xfe"])
)


@SETTINGS
@given(
    body=bodies,
    method=st.sampled_from(["POST", "GET", "PUT", "DELETE", "PATCH", "OPTIONS"]),
    path=st.sampled_from(["/mutate", "/", "/mutate/", "/validate", "/mutate?x=1"]),
    chunks=st.integers(1, 5),
)
def test_any_request_gets_json_and_never_a_server_error(body, method, path, chunks):
    answer, counted = call(body, method=method, path=path, chunks=chunks)
    assert answer.status < 500
    assert isinstance(answer.json, dict)
    if path != "/mutate":
        assert (answer.status, counted) == (404, [])
        return
    if method != "POST":
        assert (answer.status, counted) == (405, [])
        assert answer.headers[b"allow"] == b"POST"
        return
    assert len(counted) == 1
    assert counted[0] in RESULTS
    if answer.status != 200:
        assert (answer.status, counted) == (400, ["malformed"])
        assert answer.json["error"].startswith("not an AdmissionReview: ")
        return
    sent = orjson.loads(body)
    response = answer.json["response"]
    assert response["uid"] == sent["request"]["uid"]
    assert counted[0] == (
        "refused" if not response["allowed"] else "patched" if "patch" in response else "allowed"
    )
    if not response["allowed"]:
        assert response["status"]["code"] == 400
        assert response["status"]["message"]
    ops = patch_of(response)
    if ops is not None:
        apply_patch(sent["request"]["object"], ops)


@settings(max_examples=50, deadline=None)
@given(pods, st.integers(1, 50))
def test_how_the_body_is_chunked_does_not_change_the_answer(pod, chunks):
    body = orjson.dumps(review(pod))
    whole, _ = call(body)
    split, _ = call(body, chunks=chunks)
    assert (split.status, split.json) == (whole.status, whole.json)


@settings(max_examples=10, deadline=None)
@given(st.integers(1, 8))
def test_a_body_over_the_limit_is_refused_however_it_is_chunked(chunks):
    answer, counted = call(b" " * (MAX_BODY + 1), chunks=chunks)
    assert (answer.status, counted) == (413, ["malformed"])
    assert "too large" in answer.json["error"]
