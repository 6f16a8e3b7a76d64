"""Informer store indexes, handlers, predicates and parent references (no cluster)."""

from __future__ import annotations

from multicluster import EnqueueObject, EnqueueOwner, EnqueueParent, ParentReferences, Request
from multicluster import predicate as p
from multicluster.errors import AlreadyExists, Conflict, Gone, NotFound, ServerError, error_for
from multicluster.informer import Store, index_by_label, index_by_owner_uid, object_key
from multicluster.resources import DEPLOYMENTS, NODES, PODS


def pod(name, ns="default", labels=None, owners=(), rv="1", **meta):
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels or {},
            "ownerReferences": list(owners),
            "resourceVersion": rv,
            **meta,
        }
    }


def test_store_indexes_follow_updates_and_deletes():
    store = Store()
    store.add_indexer("app", index_by_label("app"))
    store.put("default/a", pod("a", labels={"app": "web"}))
    store.put("other/b", pod("b", ns="other", labels={"app": "web"}))
    assert {o["metadata"]["name"] for o in store.by_index("app", "web")} == {"a", "b"}
    assert [o["metadata"]["name"] for o in store.list("other")] == ["b"]
    store.put("default/a", pod("a", labels={"app": "db"}))
    assert [o["metadata"]["name"] for o in store.by_index("app", "web")] == ["b"]
    store.delete("other/b")
    assert store.by_index("app", "web") == []
    assert store.list("other") == []
    store.add_indexer("owner", index_by_owner_uid)
    store.put("default/c", pod("c", owners=[{"uid": "u1", "kind": "ReplicaSet", "name": "rs"}]))
    assert [o["metadata"]["name"] for o in store.by_index("owner", "u1")] == ["c"]


def test_object_keys_and_paths():
    assert object_key(pod("a", ns="ns")) == "ns/a"
    assert object_key({"metadata": {"name": "node1"}}) == "node1"
    assert PODS.path("ns", "a", "binding") == "/api/v1/namespaces/ns/pods/a/binding"
    assert NODES.path(name="n") == "/api/v1/nodes/n"
    assert DEPLOYMENTS.path("ns") == "/apis/apps/v1/namespaces/ns/deployments"
    assert DEPLOYMENTS.api_version == "apps/v1"


def test_handlers_map_events_to_requests():
    obj = pod(
        "web-1",
        owners=[
            {"kind": "ReplicaSet", "name": "web", "apiVersion": "apps/v1", "controller": True},
            {"kind": "Other", "name": "x", "apiVersion": "v1"},
        ],
    )
    assert list(EnqueueObject().requests("c1", obj)) == [Request("c1", "default", "web-1")]
    assert list(EnqueueOwner("ReplicaSet", "apps").requests("c1", obj)) == [
        Request("c1", "default", "web")
    ]
    assert list(EnqueueOwner("ReplicaSet", "batch").requests("c1", obj)) == []
    refs = ParentReferences()
    parent = {"metadata": {"name": "p", "namespace": "ns", "uid": "u-1"}}
    child = refs.set_parent(pod("child", ns="elsewhere"), parent, "cluster1")
    assert list(EnqueueParent().requests("cluster2", child)) == [Request("cluster1", "ns", "p")]
    assert refs.is_child_of(child, parent)
    assert refs.selector(parent) == "multicluster.admiralty.io/parent-uid=u-1"
    assert list(EnqueueParent().requests("cluster2", pod("orphan"))) == []


def test_predicates():
    old = pod("a", labels={"app": "web"}, generation=1)
    new = pod("a", labels={"app": "web"}, generation=1, rv="2")
    assert not p.generation_changed()("MODIFIED", new, old)
    assert p.generation_changed()("MODIFIED", pod("a", generation=2), old)
    assert p.generation_changed()("ADDED", new, None)
    assert p.has_labels({"app": "web"})("ADDED", new, None)
    assert not p.has_labels({"app": "db"})("ADDED", new, None)
    assert p.in_namespaces("default")("ADDED", new, None)
    assert not p.has_annotation("x")("ADDED", new, None)
    assert p.labels_or_annotations_changed()("MODIFIED", pod("a", labels={"v": "2"}), old)


def test_errors_are_typed_by_status_and_reason():
    def status(**fields: str) -> dict:
        return {"kind": "Status", "apiVersion": "v1", **fields}

    assert isinstance(error_for(404, status(message="pods x not found"), "GET"), NotFound)
    assert isinstance(error_for(409, status(reason="AlreadyExists"), "POST"), AlreadyExists)
    conflict = error_for(409, status(reason="Conflict"), "PUT")
    assert isinstance(conflict, Conflict)
    assert not isinstance(conflict, AlreadyExists)
    assert isinstance(error_for(410, {}, "WATCH"), Gone)
    assert isinstance(error_for(503, "down", "GET"), ServerError)
    assert "pods x not found" in str(error_for(404, status(message="pods x not found"), "GET"))


def test_a_status_message_keeps_no_control_character():
    """A server's words reach a Target's status, events, logs and terminals: nothing in them
    may be obeyed, 8-bit controls (``\x9b`` is a CSI to terminals that take them) included."""
    hostile = "denied\x1b[2J\x9b2J\x9d0;owned\x07\r\nforged\x7f\x85line"
    body = {"kind": "Status", "apiVersion": "v1", "message": hostile}
    text = str(error_for(403, body, "GET"))
    assert text.endswith("denied [2J 2J 0;owned   forged  line")


def test_an_index_value_of_one_object_or_of_several_finds_them_all():
    store = Store()
    store.add_indexer("uid", lambda o: [o["metadata"]["uid"]])
    store.put("default/a", pod("a", uid="u1"))
    store.put("default/b", pod("b", uid="u1"))
    store.put("default/c", pod("c", uid="u2"))
    assert sorted(o["metadata"]["name"] for o in store.by_index("uid", "u1")) == ["a", "b"]
    assert [o["metadata"]["name"] for o in store.by_index("uid", "u2")] == ["c"]
    store.put("default/a", pod("a", uid="u1", rv="2"))  # unchanged values: nothing moves
    store.delete("default/b")
    assert [o["metadata"]["name"] for o in store.by_index("uid", "u1")] == ["a"]
    store.put("default/c", pod("c", uid="u1"))
    store.put("default/c", pod("c", uid="u1"))
    assert sorted(o["metadata"]["name"] for o in store.by_index("uid", "u1")) == ["a", "c"]
    assert store.by_index("uid", "u2") == []
    store.delete("default/a")
    store.delete("default/c")
    store.delete("default/c")
    assert store.by_index("uid", "u1") == []
    store.put("default/d", pod("d", uid="u3"))
    store.add_indexer("again", lambda o: [o["metadata"]["uid"]])
    assert [o["metadata"]["name"] for o in store.by_index("again", "u3")] == ["d"]
