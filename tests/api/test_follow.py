"""Config maps and secrets that follow delegates (docs/follow.md): which ones a pod uses, what a
copy looks like, and when a copy is current — without a cluster."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.follow import (
    CONFIG_MAP,
    SECRET,
    content_hash,
    desired_copy,
    is_copy_of,
    is_followed,
    reference_keys,
    references,
    slim_followed,
)
from multicluster_scheduler.api.proxy import delegate_pod, slim_delegate

EVERY_PLACE = {
    "volumes": [
        {"name": "a", "configMap": {"name": "cm-volume"}},
        {"name": "b", "secret": {"secretName": "s-volume"}},
        {
            "name": "c",
            "projected": {
                "sources": [
                    {"configMap": {"name": "cm-projected"}},
                    {"secret": {"name": "s-projected"}},
                    {"downwardAPI": {"items": []}},
                ]
            },
        },
        {"name": "d", "emptyDir": {}},
    ],
    "initContainers": [
        {
            "name": "init",
            "envFrom": [{"configMapRef": {"name": "cm-init-envfrom"}}],
        }
    ],
    "containers": [
        {
            "name": "main",
            "env": [
                {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "x"}}},
                {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "s-key", "key": "y"}}},
                {"name": "Z", "value": "plain"},
                {"name": "F", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            ],
            "envFrom": [{"secretRef": {"name": "s-envfrom"}}, {"prefix": "P_"}],
        }
    ],
    "imagePullSecrets": [{"name": "registry"}],
}


def test_every_place_a_pod_names_a_config_map_or_secret():
    found = references(EVERY_PLACE)
    assert found[CONFIG_MAP] == {"cm-volume", "cm-projected", "cm-init-envfrom", "cm-key"}
    assert found[SECRET] == {"s-volume", "s-projected", "s-key", "s-envfrom", "registry"}


def test_reference_keys_name_kind_namespace_and_name():
    assert reference_keys(
        "ns", {"containers": [{"envFrom": [{"configMapRef": {"name": "a"}}]}]}
    ) == ["ConfigMap:ns/a"]
    assert reference_keys("ns", {"containers": [{"name": "c"}]}) == []


def test_the_service_account_token_volume_is_not_followed():
    """The API server adds a projected volume with kube-root-ca.crt to every pod; delegates drop
    it, the target adds its own, and nothing is copied for it."""
    manifest = {
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "volumeMounts": [
                        {
                            "name": "kube-api-access-abcde",
                            "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        }
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "kube-api-access-abcde",
                    "projected": {"sources": [{"configMap": {"name": "kube-root-ca.crt"}}]},
                }
            ],
        },
    }
    proxy = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}
    delegate = delegate_pod(proxy, manifest, "c1")
    assert references(delegate["spec"]) == {CONFIG_MAP: set(), SECRET: set()}
    # The target's admission adds its own token volume to the stored delegate: every namespace
    # has its kube-root-ca.crt, which is never copied.
    assert references(manifest["spec"]) == {CONFIG_MAP: set(), SECRET: set()}
    assert "references" not in slim_delegate({**delegate, "spec": manifest["spec"]})


def test_slim_delegates_keep_what_they_use():
    delegate = {
        "metadata": {"name": "d", "namespace": "ns", "uid": "u"},
        "spec": EVERY_PLACE,
        "status": {"phase": "Running"},
    }
    slim = slim_delegate(delegate)
    assert "ConfigMap:ns/cm-key" in slim["references"]
    assert "Secret:ns/registry" in slim["references"]
    assert "volumes" not in slim["spec"]


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "volumes",
                    "containers",
                    "initContainers",
                    "env",
                    "envFrom",
                    "configMap",
                    "secret",
                    "name",
                    "secretName",
                    "projected",
                    "sources",
                    "valueFrom",
                    "configMapKeyRef",
                    "secretKeyRef",
                    "configMapRef",
                    "secretRef",
                    "imagePullSecrets",
                ]
            ),
            children,
            max_size=4,
        )
    ),
    max_leaves=25,
)


@given(JSON)
def test_malformed_specs_never_raise(spec):
    found = references(spec)
    assert set(found) == {CONFIG_MAP, SECRET}
    assert all(isinstance(n, str) and n for names in found.values() for n in names)


def config_map(**changes) -> dict:
    obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "settings",
            "namespace": "ns",
            "uid": "source-uid",
            "resourceVersion": "42",
            "labels": {"app": "demo"},
            "annotations": {
                "team": "blue",
                "kubectl.kubernetes.io/last-applied-configuration": "{...}",
            },
        },
        "data": {"GREETING": "hello"},
    }
    obj.update(changes)
    return obj


def test_a_copy_carries_data_user_metadata_and_parent_references():
    copy = desired_copy(config_map(), "cluster-a")
    assert copy["kind"] == "ConfigMap"
    assert copy["data"] == {"GREETING": "hello"}
    meta = copy["metadata"]
    assert (meta["name"], meta["namespace"]) == ("settings", "ns")
    assert meta["labels"] == {"app": "demo", keys.PARENT_UID: "source-uid"}
    assert meta["annotations"] == {
        "team": "blue",
        keys.PARENT_NAME: "settings",
        keys.PARENT_NAMESPACE: "ns",
        keys.PARENT_CLUSTER_NAME: "cluster-a",
    }
    assert "resourceVersion" not in meta
    assert "uid" not in meta
    assert is_copy_of(copy, "ns", "settings", "cluster-a")
    assert not is_copy_of(copy, "ns", "settings", "cluster-b")
    assert not is_copy_of(copy, "ns", "other", "cluster-a")
    assert not is_copy_of(config_map(), "ns", "settings", "cluster-a")


def test_secrets_keep_their_type_and_binary_data():
    secret = {
        "kind": "Secret",
        "metadata": {"name": "s", "namespace": "ns", "uid": "u"},
        "type": "kubernetes.io/dockerconfigjson",
        "data": {".dockerconfigjson": "e30="},
        "immutable": True,
    }
    copy = desired_copy(secret, "c")
    assert copy["kind"] == "Secret"
    assert copy["type"] == "kubernetes.io/dockerconfigjson"
    assert copy["immutable"] is True
    assert is_followed(secret)
    assert not is_followed({**secret, "type": "kubernetes.io/service-account-token"})


def test_a_copy_is_current_exactly_when_its_content_matches():
    source = config_map()
    copy = desired_copy(source, "cluster-a")
    # What the API server adds, and what we add to the source, does not count.
    copy["metadata"].update(uid="copy-uid", resourceVersion="7")
    source["metadata"]["labels"][keys.HAS_FINALIZER] = "true"
    source["metadata"]["finalizers"] = [keys.FINALIZER]
    assert content_hash(copy) == content_hash(source)
    assert slim_followed(copy)["hash"] == slim_followed(source)["hash"]
    for change in (
        {"data": {"GREETING": "bonjour"}},
        {"data": {"GREETING": "hello", "MORE": "x"}},
        {"binaryData": {"b": "AA=="}},
        {"immutable": True},
    ):
        assert content_hash(config_map(**change)) != content_hash(copy), change
    relabelled = config_map()
    relabelled["metadata"]["labels"]["tier"] = "web"
    assert content_hash(relabelled) != content_hash(copy)


def test_the_cache_keeps_a_digest_not_the_data():
    slim = slim_followed(config_map())
    assert "data" not in slim
    assert b"hello" not in orjson.dumps(slim)
    assert slim["metadata"]["uid"] == "source-uid"
    copy = slim_followed(desired_copy(config_map(), "cluster-a"))
    assert copy["metadata"]["annotations"][keys.PARENT_CLUSTER_NAME] == "cluster-a"
