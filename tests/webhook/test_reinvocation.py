"""A pod that arrives with a saved manifest is the webhook's own reinvocation only if the MAC was
made for this namespace, this user, moments ago, and the manifest is this pod's; any other is
refused with what to do, whoever makes the pod (a tenant, or a ReplicaSet whose template holds a
copy)."""

from __future__ import annotations

import base64
import copy

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.manifest_mac import ManifestKey
from multicluster_scheduler.webhook.app import answer_review
from multicluster_scheduler.webhook.mutation import mutation_patch
from multicluster_scheduler.webhook.reinvocation import (
    REINVOCATION_WINDOW,
    carries_saved_manifest,
    foreign_manifest,
)
from tests.webhook.json_patch import apply_patch
from tests.webhook.sealing import KEY, NAMESPACE, USER, sealer

NOW = 1_800_000_000
REFUSED = "annotation multicluster-scheduler did not write for you in this namespace"
RS_CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"


def pod(name: str | None = "web", owner: str | None = None, **annotations: str) -> dict:
    meta: dict = {"namespace": NAMESPACE, "annotations": {keys.ELECT: "", **annotations}}
    if name is None:
        meta["generateName"] = "web-7d9f-"
    else:
        meta["name"] = name
    if owner is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": owner,
             "controller": True}
        ]  # fmt: skip
    return {"metadata": meta, "spec": {"containers": [{"name": "c", "image": "busybox"}]}}


def review(obj: dict, username: str = USER, namespace: str = NAMESPACE) -> bytes:
    request = {
        "uid": "u",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": namespace,
        "userInfo": {"username": username},
        "object": obj,
    }
    return orjson.dumps({"apiVersion": "admission.k8s.io/v1", "request": request})


def admitted(obj: dict, username: str = USER, now: int = NOW) -> dict:
    """The pod as the webhook's first answer makes it."""
    result, answer = answer_review(review(obj, username), KEY, now)
    assert result == "patched", answer
    return apply_patch(obj, orjson.loads(base64.b64decode(answer["response"]["patch"])))


def saved_of(proxy: dict) -> dict[str, str]:
    annotations = proxy["metadata"]["annotations"]
    return {k: annotations[k] for k in (keys.SOURCEPOD_MANIFEST, keys.SOURCEPOD_MANIFEST_MAC)}


def refusal(obj: dict, username: str = USER, now: int = NOW) -> str:
    result, answer = answer_review(review(obj, username), KEY, now)
    assert result == "refused", answer
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 400
    return answer["response"]["status"]["message"]


# -- reinvocations ---------------------------------------------------------------------------------


def test_the_webhooks_own_answer_comes_back_unchanged():
    proxy = admitted(pod())
    assert answer_review(review(proxy), KEY, NOW + 2) == (
        "allowed",
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "response": {"uid": "u", "allowed": True},
        },
    )


def test_a_pod_of_a_replicaset_comes_back_unchanged_too():
    proxy = admitted(pod(None, owner="rs-1"), RS_CONTROLLER)
    assert answer_review(review(proxy, RS_CONTROLLER), KEY, NOW)[0] == "allowed"


# -- what a tenant or a template brings ------------------------------------------------------------


def test_a_hand_written_manifest_is_refused_with_what_to_do():
    forged = orjson.dumps({"metadata": {"name": "web"}, "spec": {"hostPID": True}}).decode()
    message = refusal(pod(**{keys.SOURCEPOD_MANIFEST: forged}))
    assert message == (
        f"the pod carries a {keys.SOURCEPOD_MANIFEST} {REFUSED} (no "
        f"{keys.SOURCEPOD_MANIFEST_MAC}): remove it, and {keys.SOURCEPOD_MANIFEST_MAC}, from the "
        "pod or from its template"
    )


def copied(source: dict, onto: dict) -> dict:
    target = copy.deepcopy(onto)
    target["metadata"]["annotations"].update(saved_of(source))
    return target


@pytest.mark.parametrize(
    ("make", "why"),
    [
        pytest.param(
            lambda: copied(admitted(pod("admin-debug")), pod("web")),
            "it was saved for another pod: its name differs",
            id="another-pod-of-the-user",
        ),
        pytest.param(
            lambda: copied(admitted(pod("web"), "bob"), pod("web")),
            "it was saved for a pod another user made",
            id="another-users-pod",
        ),
        pytest.param(
            lambda: copied(admitted(pod("web"), now=NOW - REINVOCATION_WINDOW - 1), pod("web")),
            f"it was saved {REINVOCATION_WINDOW + 1} s ago, for another request",
            id="the-same-pod-made-again-later",
        ),
        pytest.param(
            lambda: pod(**{keys.SOURCEPOD_MANIFEST_MAC: "v1.1.x.y"}),
            f"{keys.SOURCEPOD_MANIFEST_MAC} without a manifest",
            id="a-mac-alone",
        ),
        pytest.param(
            lambda: (
                copied(admitted(pod("web")), pod("web"))
                | {"spec": {"containers": [], "hostPID": True}}
            ),
            None,
            id="the-same-manifest-on-another-spec-is-fine",
        ),
    ],
)
def test_a_manifest_brought_from_elsewhere_is_refused(make, why):
    obj = make()
    if why is None:  # what runs is the manifest, which admission saw for this very pod
        assert answer_review(review(obj), KEY, NOW)[0] == "patched"
        return
    assert f"({why})" in refusal(obj)


def test_a_manifest_of_another_namespace_is_refused():
    other = sealer(namespace="team-b", issued=NOW)
    obj = pod("web")
    obj["metadata"]["namespace"] = "team-b"
    proxy = apply_patch(obj, mutation_patch(obj, other))
    message = refusal(copied(proxy, pod("web")))
    assert "(its MAC: it does not verify for this manifest in this namespace)" in message


def test_a_replicaset_whose_template_holds_a_copy_is_refused():
    """The copy comes from a pod of ReplicaSet rs-1; the ReplicaSet controller creates rs-2's
    pods from a template that holds it: its FailedCreate event says what to do."""
    first = admitted(pod(None, owner="rs-1"), RS_CONTROLLER)
    second = copied(first, pod(None, owner="rs-2"))
    message = refusal(second, RS_CONTROLLER)
    assert "(it was saved for another pod: its ownerReferences differs)" in message
    assert message.endswith("from the pod or from its template")


def test_a_pod_that_is_not_elected_but_carries_a_manifest_is_checked_too():
    """A pod made with ``schedulerName: admiralty-proxy``, a manifest and our finalizer, without
    the elect annotation the webhook would mutate."""
    forged = orjson.dumps({"metadata": {"name": "web"}, "spec": {"hostNetwork": True}}).decode()
    obj = pod(**{keys.SOURCEPOD_MANIFEST: forged})
    del obj["metadata"]["annotations"][keys.ELECT]
    obj["spec"]["schedulerName"] = keys.PROXY_SCHEDULER_NAME
    obj["metadata"]["finalizers"] = [keys.FINALIZER]
    assert REFUSED in refusal(obj)
    assert answer_review(review(pod()), KEY, NOW)[0] == "patched", "an elected pod is mutated"
    plain = pod()
    del plain["metadata"]["annotations"][keys.ELECT]
    assert answer_review(review(plain), KEY, NOW)[0] == "allowed", "others are left alone"


def test_a_request_without_a_user_is_refused():
    body = orjson.loads(review(pod()))
    del body["request"]["userInfo"]
    result, answer = answer_review(orjson.dumps(body), KEY, NOW)
    assert result == "refused"
    assert answer["response"]["status"]["message"] == "the request names no namespace or no user"


# -- properties ------------------------------------------------------------------------------------

users = st.sampled_from([USER, "bob", RS_CONTROLLER, "system:serviceaccount:team-a:ci"])
names = st.none() | st.sampled_from(["web", "db", "admin-debug"])
owners = st.none() | st.sampled_from(["rs-1", "rs-2"])
SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(names, owners, users, st.integers(0, REINVOCATION_WINDOW))
def test_a_reinvocation_is_always_taken_for_one(name, owner, user, later):
    proxy = admitted(pod(name, owner), user)
    assert answer_review(review(proxy, user), KEY, NOW + later)[0] == "allowed"
    assert foreign_manifest(proxy, KEY, namespace=NAMESPACE, username=user, now=NOW) is None


@SETTINGS
@given(names, owners, users, names, owners, users, st.integers(-1000, 1000))
def test_a_saved_manifest_is_taken_only_by_the_same_pod_of_the_same_user(
    name, owner, user, other_name, other_owner, other_user, later
):
    """Copied onto any pod: accepted only where nothing of what it is checked against differs
    (then the pod's delegate runs what admission saw for a pod of that name and owner, made by
    that user, moments before)."""
    source = admitted(pod(name, owner), user)
    onto = copied(source, pod(other_name, other_owner))
    same = (name, owner, user) == (other_name, other_owner, other_user)
    result, _ = answer_review(review(onto, other_user), KEY, NOW + later)
    taken = same and abs(later) <= REINVOCATION_WINDOW
    assert (result != "refused") == taken, result


@SETTINGS
@given(st.text(max_size=40), st.text(max_size=40) | st.none())
def test_no_manifest_or_mac_a_user_writes_is_taken(manifest, mac):
    annotations = {keys.SOURCEPOD_MANIFEST: manifest}
    if mac is not None:
        annotations[keys.SOURCEPOD_MANIFEST_MAC] = mac
    obj = pod(**annotations)
    assert carries_saved_manifest(obj)
    assert REFUSED in refusal(obj)


def test_another_key_makes_every_mac_foreign():
    proxy = admitted(pod())
    other = ManifestKey.new()
    assert foreign_manifest(proxy, other, namespace=NAMESPACE, username=USER, now=NOW)
