"""Ingresses that follow global Services: which ones do, what their copies hold, when a copy is
out of date and how it is updated without touching what the target added; and which Ingresses
an event of a Service concerns. Pure: no cluster."""

from __future__ import annotations

import copy

import orjson
from hypothesis import given
from hypothesis import strategies as st

from multicluster import Cluster, ClusterConfig
from multicluster.informer import ADDED, DELETED, MODIFIED
from multicluster.testing import merge_patch
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.copies import LAST_APPLIED, MANAGED_KEYS, finalizer_patch
from multicluster_scheduler.api.ingresses import (
    MARKS,
    ClassPolicy,
    IngressPolicy,
    backend_services,
    copy_differs,
    copy_update,
    desired_copy,
    follows,
)
from multicluster_scheduler.api.parents import is_copy_of
from multicluster_scheduler.services.ingresses import BACKEND_INDEX, IngressSync, global_changed
from multicluster_scheduler.targets.registry import TargetRegistry

CLUSTER = "cluster1-uid"


def path(service: str, number: int = 80) -> dict:
    return {
        "path": "/",
        "pathType": "Prefix",
        "backend": {"service": {"name": service, "port": {"number": number}}},
    }


def ingress(*services: str, name: str = "web", **annotations: str) -> dict:
    """An Ingress as the source's API server returns it, one rule per Service named."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": "i1",
            "resourceVersion": "9",
            "generation": 1,
            "labels": {"app": "web"},
            "annotations": dict(annotations),
        },
        "spec": {
            "ingressClassName": "made-up",
            "rules": [{"host": f"{s}.example.com", "http": {"paths": [path(s)]}} for s in services],
        },
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}},
    }


def svc(name: str, *, global_: str | None = "true", copy_of_another: bool = False) -> dict:
    annotations = {} if global_ is None else {keys.GLOBAL: global_}
    if copy_of_another:
        annotations[keys.IS_DELEGATE] = ""
    return {"metadata": {"name": name, "namespace": "ns", "annotations": annotations}}


def lookup(*services: dict):
    by_name = {s["metadata"]["name"]: s for s in services}
    return by_name.get


def as_created_in_target(body: dict) -> dict:
    made = copy.deepcopy(body)
    made["metadata"] |= {"uid": "t1", "resourceVersion": "100", "generation": 1}
    return made


# -- which Ingresses follow ---------------------------------------------------------------------


def test_the_services_named_by_http_paths_are_the_backends():
    made = ingress("nginx", "api")
    made["spec"]["defaultBackend"] = {"service": {"name": "fallback", "port": {"number": 80}}}
    made["spec"]["rules"].append({"host": "assets.example.com"})  # no http: names nothing
    made["spec"]["rules"].append(
        {
            "http": {
                "paths": [
                    {
                        "path": "/static",
                        "pathType": "Prefix",
                        "backend": {"resource": {"kind": "StorageBucket", "name": "assets"}},
                    }
                ]
            }
        }
    )
    assert backend_services(made) == {"nginx", "api"}


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=3),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(
                st.sampled_from(["rules", "http", "paths", "backend", "service", "name", "x"]),
                inner,
                max_size=3,
            )
        ),
        max_leaves=12,
    )
)
def test_any_spec_gives_a_set_of_names_and_never_raises(spec):
    """Upstream dereferences ``http`` of every rule and crashes on a rule with a host only;
    whatever the spec holds, here the answer is a set of names."""
    names = backend_services({"metadata": {"name": "x", "namespace": "ns"}, "spec": spec})
    assert all(isinstance(n, str) and n for n in names)


def test_an_ingress_follows_when_one_backend_service_is_global():
    web = ingress("nginx", "api")
    assert follows(web, lookup(svc("nginx"), svc("api", global_=None)))
    assert follows(web, lookup(svc("api")))
    assert not follows(web, lookup(svc("nginx", global_=None), svc("api", global_="false")))
    assert not follows(web, lookup()), "Services not there (yet)"
    assert not follows(ingress(), lookup(svc("nginx"))), "no rule"


def test_a_service_copied_in_from_another_source_does_not_make_an_ingress_follow():
    """Upstream follows it; here nobody of this cluster opted in: a tenant of another cluster
    would otherwise make this cluster's Ingresses follow, with our finalizer."""
    assert not follows(ingress("nginx"), lookup(svc("nginx", copy_of_another=True)))


def test_copies_never_follow():
    copied = ingress("nginx", **{keys.IS_DELEGATE: ""})
    assert not follows(copied, lookup(svc("nginx")))


def test_the_default_backend_alone_never_follows():
    made = ingress()
    made["spec"]["defaultBackend"] = {"service": {"name": "nginx", "port": {"number": 80}}}
    assert not follows(made, lookup(svc("nginx")))


# -- the original's finalizer and mark ----------------------------------------------------------


def test_the_finalizer_comes_with_global_and_both_go_together():
    web = ingress("nginx")
    web["metadata"]["finalizers"] = ["someone.else/keep"]
    marked = merge_patch(web, finalizer_patch(web, present=True, marks=MARKS))
    meta = marked["metadata"]
    assert meta["finalizers"] == ["someone.else/keep", keys.FINALIZER]
    assert meta["labels"][keys.HAS_FINALIZER] == "true"
    assert meta["annotations"][keys.GLOBAL] == "true"
    assert finalizer_patch(marked, present=True, marks=MARKS) is None
    released = merge_patch(marked, finalizer_patch(marked, present=False, marks=MARKS))
    assert released["metadata"]["finalizers"] == ["someone.else/keep"]
    assert keys.HAS_FINALIZER not in released["metadata"]["labels"]
    assert keys.GLOBAL not in released["metadata"]["annotations"]
    assert finalizer_patch(released, present=False, marks=MARKS) is None


def test_an_ingress_never_marked_keeps_what_its_user_wrote():
    by_hand = ingress("nginx", **{keys.GLOBAL: "true"})
    assert finalizer_patch(by_hand, present=False, marks=MARKS) is None


# -- copies -------------------------------------------------------------------------------------


def test_the_copy_of_an_ingress():
    web = ingress("nginx", **{LAST_APPLIED: "{}", "example.com/team": "a"})
    web["metadata"]["labels"][keys.HAS_FINALIZER] = "true"
    body = desired_copy(web, CLUSTER)
    meta = body["metadata"]
    assert (body["apiVersion"], body["kind"]) == ("networking.k8s.io/v1", "Ingress")
    assert (meta["name"], meta["namespace"]) == ("web", "ns")
    assert meta["labels"] == {"app": "web", keys.PARENT_UID: "i1"}
    assert {k: v for k, v in meta["annotations"].items() if k != MANAGED_KEYS} == {
        "example.com/team": "a",
        keys.IS_DELEGATE: "",
        keys.GLOBAL: "true",
        keys.PARENT_NAME: "web",
        keys.PARENT_NAMESPACE: "ns",
        keys.PARENT_CLUSTER_NAME: CLUSTER,
    }
    assert orjson.loads(meta["annotations"][MANAGED_KEYS]) == {
        "annotations": sorted(k for k in meta["annotations"] if k != MANAGED_KEYS),
        "labels": ["app", keys.PARENT_UID],
        "spec": ["ingressClassName", "rules"],
    }
    assert body["spec"] == web["spec"], "backends keep the Service's name"
    assert "status" not in body
    assert is_copy_of(body, "ns", "web", CLUSTER)
    body["spec"]["rules"].clear()
    assert web["spec"]["rules"], "the original is not modified"


def test_a_copy_as_the_target_made_it_is_current():
    body = desired_copy(ingress("nginx"), CLUSTER)
    assert not copy_differs(body, as_created_in_target(body))


def test_changes_of_the_original_make_the_copy_out_of_date():
    made = as_created_in_target(desired_copy(ingress("nginx"), CLUSTER))
    assert copy_differs(desired_copy(ingress("nginx", "api"), CLUSTER), made), "a rule added"
    annotated = desired_copy(ingress("nginx", foo="bar"), CLUSTER)
    assert copy_differs(annotated, made), "an annotation added"
    classless = ingress("nginx")
    del classless["spec"]["ingressClassName"]
    assert copy_differs(desired_copy(classless, CLUSTER), made), "a spec field removed"
    drifted = copy.deepcopy(made)
    drifted["spec"]["rules"][0]["host"] = "elsewhere.example.com"
    assert copy_differs(desired_copy(ingress("nginx"), CLUSTER), drifted), "edited in the target"


def touched_in_target(made: dict) -> dict:
    """What a target's admission, controllers and users add to a copy."""
    touched = copy.deepcopy(made)
    meta = touched["metadata"]
    meta["labels"]["team.example.com/owner"] = "ops"
    meta["annotations"]["ingress.kubernetes.io/backends"] = '{"k8s1-x":"HEALTHY"}'
    meta["annotations"]["cert-manager.io/issuer"] = "letsencrypt"
    meta["finalizers"] = ["example.com/hold"]
    touched["spec"]["tls"] = [{"hosts": ["nginx.example.com"], "secretName": "their-cert"}]
    touched["status"] = {"loadBalancer": {"ingress": [{"ip": "198.51.100.7"}]}}
    return touched


def test_what_the_target_adds_never_makes_a_copy_out_of_date():
    body = desired_copy(ingress("nginx"), CLUSTER)
    assert not copy_differs(body, touched_in_target(as_created_in_target(body)))


def test_a_default_ingress_class_of_the_target_is_kept():
    """The target's DefaultIngressClass admission sets ``ingressClassName`` on a copy created
    without one: the target's, not a difference (upstream puts the whole spec back)."""
    classless = ingress("nginx")
    del classless["spec"]["ingressClassName"]
    body = desired_copy(classless, CLUSTER)
    made = as_created_in_target(body)
    made["spec"]["ingressClassName"] = "targets-default"
    assert not copy_differs(body, made)
    classless["spec"]["rules"].append({"host": "api.example.com", "http": {"paths": [path("api")]}})
    body = copy_update(desired_copy(classless, CLUSTER), made)
    assert body["spec"]["ingressClassName"] == "targets-default"
    assert len(body["spec"]["rules"]) == 2


def test_updates_write_only_what_is_ours_and_keep_the_rest():
    old_original = ingress("nginx", foo="bar", gone="soon")
    made = touched_in_target(as_created_in_target(desired_copy(old_original, CLUSTER)))
    new_original = ingress("nginx", "api", foo="baz")
    new_original["metadata"]["labels"] = {"tier": "front"}
    body = copy_update(desired_copy(new_original, CLUSTER), made)
    meta = body["metadata"]
    assert meta["resourceVersion"] == "100"
    assert meta["finalizers"] == ["example.com/hold"]
    assert meta["labels"] == {
        "tier": "front",
        keys.PARENT_UID: "i1",
        "team.example.com/owner": "ops",
    }, "app was ours and is gone from the original; the target's own label stays"
    annotations = meta["annotations"]
    assert annotations["foo"] == "baz"
    assert "gone" not in annotations, "removed from the original: removed (upstream keeps it)"
    assert annotations["cert-manager.io/issuer"] == "letsencrypt"
    assert annotations["ingress.kubernetes.io/backends"] == '{"k8s1-x":"HEALTHY"}'
    assert body["spec"]["rules"] == new_original["spec"]["rules"]
    assert body["spec"]["tls"] == made["spec"]["tls"], "a spec field the target added"
    assert body["status"] == made["status"], "never the original's"
    assert not copy_differs(desired_copy(new_original, CLUSTER), body)


def test_the_source_clusters_load_balancer_annotations_are_not_copied():
    gke = ingress("nginx", **{"ingress.kubernetes.io/url-map": "k8s2-um-source"})
    assert (
        "ingress.kubernetes.io/url-map" not in desired_copy(gke, CLUSTER)["metadata"]["annotations"]
    )


def test_copies_made_without_a_record_are_taken_as_ours_once():
    body = desired_copy(ingress("nginx"), CLUSTER)
    made = as_created_in_target(body)
    del made["metadata"]["annotations"][MANAGED_KEYS]
    made["metadata"]["annotations"]["added"] = "there"
    assert copy_differs(body, made)
    updated = copy_update(body, made)
    assert "added" not in updated["metadata"]["annotations"]
    assert not copy_differs(body, updated)


@given(
    st.lists(st.sampled_from(["nginx", "api", "db"]), max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.text("xy", max_size=2), max_size=3),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.text("xy", max_size=2), max_size=3),
)
def test_an_updated_copy_is_current_and_keeps_what_the_target_added(services, before, after):
    old = touched_in_target(
        as_created_in_target(desired_copy(ingress(*services, **before), CLUSTER))
    )
    desired = desired_copy(ingress(*reversed(services), **after), CLUSTER)
    body = copy_update(desired, old)
    assert not copy_differs(desired, body)
    assert body["metadata"]["annotations"]["cert-manager.io/issuer"] == "letsencrypt"
    assert body["spec"]["tls"] == old["spec"]["tls"]
    for key in set(before) - set(after):
        assert key not in body["metadata"]["annotations"]


# -- which Ingresses an event concerns ----------------------------------------------------------


def sync(policy: IngressPolicy | None = None) -> IngressSync:
    local = Cluster("local", ClusterConfig("https://127.0.0.1:1", None))
    return IngressSync(local, TargetRegistry(), cluster_name=CLUSTER, policy=policy)


async def test_a_service_event_concerns_the_ingresses_that_name_it():
    made = sync()
    store = made.ingresses.store
    store.put("ns/web", ingress("nginx", "api", name="web"))
    store.put("ns/api-only", ingress("api", name="api-only"))
    store.put("ns/other", ingress("other", name="other"))
    other_ns = ingress("nginx", name="elsewhere")
    other_ns["metadata"]["namespace"] = "ns2"
    store.put("ns2/elsewhere", other_ns)
    named = made._ingresses_naming("local", svc("nginx"))
    assert [(r.namespace, r.name) for r in named] == [("ns", "web")]
    assert sorted(r.name for r in made._ingresses_naming("local", svc("api"))) == [
        "api-only",
        "web",
    ]
    store.put("ns/web", ingress("api", name="web"))  # the rule to nginx removed
    assert made._ingresses_naming("local", svc("nginx")) == []
    assert made.ingresses.by_index(BACKEND_INDEX, "ns/api")


async def test_an_ingress_the_policy_refuses_does_not_follow():
    made = sync(IngressPolicy(allowed_hosts=("*.example.com",)))
    made.services.store.put("ns/nginx", svc("nginx"))
    classless = ingress("nginx")
    del classless["spec"]["ingressClassName"]
    assert made._follows(classless)
    assert made._routes_to_global(ingress("nginx"))
    assert not made._follows(ingress("nginx")), "a class, refused by default"
    raw = copy.deepcopy(classless)
    raw["metadata"]["annotations"]["nginx.ingress.kubernetes.io/auth-snippet"] = "x"
    assert made._routes_to_global(raw)
    assert not made._follows(raw)


async def test_the_copies_of_a_policy_that_rewrites_the_class_carry_it():
    policy = IngressPolicy(
        class_policy=ClassPolicy.REWRITE, ingress_class="public", allowed_hosts=("*",)
    )
    made = sync(policy)
    body = made.copies.kind.rules.desired_copy(ingress("nginx"), CLUSTER)
    assert body["spec"]["ingressClassName"] == "public"


def test_services_matter_when_they_become_or_stop_being_global():
    predicate = global_changed
    assert predicate(ADDED, svc("nginx"), None)
    assert not predicate(ADDED, svc("nginx", global_=None), None)
    assert predicate(DELETED, svc("nginx"), None)
    assert predicate(MODIFIED, svc("nginx"), svc("nginx", global_=None))
    assert predicate(MODIFIED, svc("nginx", global_="false"), svc("nginx"))
    assert not predicate(MODIFIED, svc("nginx"), svc("nginx"))


async def test_excluded_namespaces_and_copies_are_never_looked_at():
    made = sync()
    system = ingress("nginx")
    system["metadata"]["namespace"] = "kube-system"
    assert not made._eligible(ADDED, system, None)
    assert (
        made._ingresses_naming("local", {"metadata": {"name": "x", "namespace": "kube-system"}})
        == []
    )
    assert not made._eligible(ADDED, ingress("nginx", **{keys.IS_DELEGATE: ""}), None)
    assert made._eligible(ADDED, ingress("nginx"), None)
