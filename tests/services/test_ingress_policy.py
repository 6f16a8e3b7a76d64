"""What an Ingress may carry into targets: annotation keys of an allow list whose values name
nothing outside its namespace, a class kept, refused or rewritten, hosts of an allow list; and
what the Warnings say when it may not. Pure: no cluster."""

from __future__ import annotations

import string

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.copies import LAST_APPLIED
from multicluster_scheduler.api.ingresses import (
    ANNOTATION_REFUSED,
    BLOCKED,
    CLASS,
    CLASS_ANNOTATION,
    CLASS_REFUSED,
    HOST_REFUSED,
    HOSTS,
    NOT_ALLOWED,
    OUTSIDE,
    UPSTREAM_POLICY,
    ClassPolicy,
    IngressCopyRules,
    IngressPolicy,
    Refusal,
    annotation_pattern,
    desired_copy,
    host_pattern,
    ingress_hosts,
    outside_references,
    refusal_messages,
    refusals,
)

CLUSTER = "cluster1-uid"
NS = "team"
ANYWHERE = IngressPolicy(allowed_hosts=("*",))  # hosts aside, the default policy


def ingress(
    *hosts: str | None,
    ingress_class: str | None = None,
    tls: list | None = None,
    **annotations: str,
) -> dict:
    """An Ingress of namespace ``team`` routing ``hosts`` (None: a rule without a host) to the
    Service ``web``."""
    backend = {"service": {"name": "web", "port": {"number": 80}}}
    rules = []
    for host in hosts or ("web.apps.example.com",):
        rule: dict = {"http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]}}
        if host is not None:
            rule["host"] = host
        rules.append(rule)
    spec: dict = {"rules": rules}
    if ingress_class is not None:
        spec["ingressClassName"] = ingress_class
    if tls is not None:
        spec["tls"] = tls
    return {
        "metadata": {
            "name": "web",
            "namespace": NS,
            "uid": "i1",
            "resourceVersion": "9",
            "annotations": dict(annotations),
        },
        "spec": spec,
    }


def refused(made: dict, policy: IngressPolicy) -> set[tuple[str, str]]:
    return {(r.rule, r.subject) for r in refusals(made, policy)}


# -- annotations ---------------------------------------------------------------------------------


def test_by_default_only_the_products_own_keys_go_along():
    """Nothing to allow: the product's own keys, kubectl's record (never copied) and the class
    annotation (the class policy's) refuse nothing; every other key refuses the Ingress."""
    plain = ingress(
        **{
            keys.GLOBAL: "true",
            keys.PREFIX + "anything": "x",
            LAST_APPLIED: "{}",
            "ingress.kubernetes.io/url-map": "k8s2-um",
        }
    )
    assert refusals(plain, ANYWHERE) == []
    attacker = ingress(
        **{
            "nginx.ingress.kubernetes.io/custom-headers": "kube-system/kubeadm-config",
            "nginx.ingress.kubernetes.io/auth-proxy-set-headers": "team-b/headers",
            "traefik.ingress.kubernetes.io/router.middlewares": "kube-system-admin@kubernetescrd",
            "nginx.ingress.kubernetes.io/server-alias": "bank.example.org",
            "nginx.ingress.kubernetes.io/proxy-redirect-to": "http://169.254.169.254/",
            "nginx.ingress.kubernetes.io/upstream-vhost": "api.kube-system.svc",
            "example.com/team": "a",
        }
    )
    assert refused(attacker, ANYWHERE) == {
        (NOT_ALLOWED, key) for key in attacker["metadata"]["annotations"]
    }


NGINX = "nginx.ingress.kubernetes.io/"


@pytest.mark.parametrize(
    ("patterns", "key", "allowed"),
    [
        ((NGINX + "rewrite-target",), NGINX + "rewrite-target", True),
        ((NGINX + "rewrite-target",), NGINX + "rewrite-targets", False),
        ((NGINX + "proxy-*",), NGINX + "proxy-body-size", True),
        ((NGINX + "proxy-*",), NGINX + "proxy_body-size", False),
        ((NGINX + "proxy-*",), "x." + NGINX + "proxy-a", False),
        ((NGINX + "*",), NGINX + "ssl-redirect", True),
        ((NGINX + "*",), "nginxXingress.kubernetes.io/ssl-redirect", False),
        (("a", "b.example.com/*"), "b.example.com/c", True),
        (("*",), "anything.example/at-all", True),
    ],
)
def test_allowed_keys_are_whole_keys_with_star_for_any_run(patterns, key, allowed):
    """``*`` is the only special character: a dot is a dot, and a pattern matches the whole key
    (``…/proxy-*`` allows no key that merely contains it)."""
    policy = IngressPolicy(allowed_annotations=patterns, refused_annotations=None)
    assert policy.annotation_allowed(key) is allowed


@pytest.mark.parametrize(
    "key",
    [
        # ingress-nginx's configuration injections disclosed in March 2025 (IngressNightmare):
        # each annotation was written into the controller's configuration unchecked, which let
        # whoever wrote an Ingress run code in the controller, which reads every Secret.
        "nginx.ingress.kubernetes.io/auth-tls-match-cn",  # CVE-2025-1097
        "nginx.ingress.kubernetes.io/mirror-target",  # CVE-2025-1098
        "nginx.ingress.kubernetes.io/mirror-host",  # CVE-2025-1098
        "nginx.ingress.kubernetes.io/auth-url",  # CVE-2025-24514
    ],
)
def test_by_default_a_whole_prefix_allowed_refuses_keys_that_injected_configuration(key):
    policy = IngressPolicy(allowed_annotations=("nginx.ingress.kubernetes.io/*",))
    assert policy.annotation_blocked(key)


def test_the_refused_pattern_still_refuses_what_a_whole_prefix_allows():
    policy = IngressPolicy(
        allowed_annotations=("nginx.ingress.kubernetes.io/*",), allowed_hosts=("*",)
    )
    raw = ingress(
        **{
            "nginx.ingress.kubernetes.io/configuration-snippet": "return 200;",
            "nginx.ingress.kubernetes.io/Auth-URL": "http://auth.team.svc/",
            "nginx.ingress.kubernetes.io/rewrite-target": "/",
        }
    )
    assert refused(raw, policy) == {
        (BLOCKED, "nginx.ingress.kubernetes.io/configuration-snippet"),
        (BLOCKED, "nginx.ingress.kubernetes.io/Auth-URL"),
    }
    unblocked = IngressPolicy(
        allowed_annotations=("nginx.ingress.kubernetes.io/*",),
        refused_annotations=None,
        allowed_hosts=("*",),
    )
    assert refusals(raw, unblocked) == []


@pytest.mark.parametrize(
    "pattern",
    ["nginx\\.ingress.*", "(?i)snippet", "a/b/c", "", "a b", "nginx.ingress.kubernetes.io/[a-z]*"],
)
def test_patterns_that_are_not_keys_are_refused(pattern):
    """An operator who pastes a regular expression is told, not left with a list that allows
    something else."""
    with pytest.raises(ValueError, match="not an annotation key"):
        annotation_pattern(pattern)
    with pytest.raises(ValueError, match="not an annotation key"):
        IngressPolicy(allowed_annotations=(pattern,))


def test_an_allowed_key_whose_value_names_another_namespace_is_refused():
    policy = IngressPolicy(
        allowed_annotations=(
            "nginx.ingress.kubernetes.io/*",
            "traefik.ingress.kubernetes.io/*",
        ),
        allowed_hosts=("*",),
    )
    theirs = ingress(
        **{
            "nginx.ingress.kubernetes.io/custom-headers": "kube-system/kubeadm-config",
            "nginx.ingress.kubernetes.io/auth-tls-secret": "team/ca",  # its own: fine
            "nginx.ingress.kubernetes.io/auth-secret": "basic",  # its own: fine
            "traefik.ingress.kubernetes.io/router.middlewares": "team-strip@kubernetescrd,"
            "kube-system-admin@kubernetescrd",
        }
    )
    assert [(r.rule, r.subject) for r in refusals(theirs, policy)] == [
        (OUTSIDE, "nginx.ingress.kubernetes.io/custom-headers names namespace kube-system"),
        (
            OUTSIDE,
            "traefik.ingress.kubernetes.io/router.middlewares names a Traefik object of another "
            "namespace (kube-system-admin@kubernetescrd)",
        ),
    ]


# -- references outside the namespace ------------------------------------------------------------

labels = st.from_regex(r"[a-z]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
names = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,12}[a-z0-9])?", fullmatch=True)
padding = st.sampled_from(["", " ", "\t", "\n"])


@given(labels, labels, names, padding, padding, st.booleans())
def test_a_namespace_slash_name_of_another_namespace_is_found(
    namespace, other, name, before, after, upper
):
    """``<namespace>/<name>``, alone, padded or in a comma-separated list, in any case."""
    assume(other != namespace)
    written = other.upper() if upper else other
    value = f"{before}{written}/{name}{after}"
    assert outside_references(value, namespace) == [f"namespace {other}"]
    assert outside_references(f"{namespace}/ok,{value}", namespace) == [f"namespace {other}"]
    assert outside_references(f"{before}{namespace}/{name}{after}", namespace) == []


@given(labels, labels, names)
def test_a_traefik_reference_is_this_namespaces_only_when_it_cannot_be_anothers(
    namespace, other, name
):
    """Traefik names a Middleware of its CRD provider ``<namespace>-<name>``: whatever the
    namespace and name of another namespace's object, its reference is refused; this
    namespace's is accepted only when no other namespace can be read in it."""
    assume(other != namespace)
    assert outside_references(f"{other}-{name}@kubernetescrd", namespace)
    assert outside_references(f"{other}-{name}@KubernetesCRD", namespace)
    own = outside_references(f"{namespace}-{name}@kubernetescrd", namespace)
    assert (own == []) is ("-" not in namespace and "-" not in name)


@pytest.mark.parametrize("provider", ["file", "internal", "kubernetesgateway", "docker"])
def test_traefik_configuration_of_other_providers_is_refused(provider):
    assert outside_references(f"auth@{provider}", NS) == [
        f"Traefik configuration of provider {provider} (auth@{provider})"
    ]


@given(labels, labels, labels, st.sampled_from(["", ".cluster.local", ".cluster.local."]))
def test_cluster_dns_names_of_another_namespace_are_found_alone_and_in_urls(
    namespace, other, service, domain
):
    assume(other != namespace)
    host = f"{service}.{other}.svc{domain}"
    for value in (host, f"http://{host}:8080/auth?x=1", f"https://user@{host}/", f"{host}:80"):
        assert outside_references(value, namespace) == [
            f"namespace {other} ({host.removesuffix('.')})"
        ]
    assert outside_references(f"http://{service}.{namespace}.svc{domain}/", namespace) == []


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data",
        # Clouds' metadata services that are not link-local, and their names.
        "http://[fd00:ec2::254]/latest/meta-data",
        "http://100.100.100.200/latest/meta-data",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://metadata/computeMetadata/v1/",
        "metadata.google.internal",
        "http://instance-data/latest/meta-data",
        "https://Metadata.Google.Internal./",
        "http://127.0.0.1:10250/pods",
        "http://localhost/",
        "http://[::ffff:169.254.169.254]/",
        "http://0.0.0.0/",
        # Written short, as C's inet_aton reads them (and ingress controllers' resolvers).
        "http://127.1/",
        "http://2130706433/",
        "http://0x7f000001:10250/pods",
        "http://0x7f.0.0.1/",
        "http://169.254.43518/latest/meta-data",
        "http://0/",
        "127.1:10250",
    ],
)
def test_the_targets_own_node_and_metadata_service_are_found(url):
    found = outside_references(url, NS)
    assert len(found) == 1
    assert "the target's own node" in found[0]


@pytest.mark.parametrize(
    "value",
    [
        "/",
        "/$2",
        "https://www.example.com/login",
        "true",
        "10m",
        "10.0.0.0/8, 192.168.0.0/16",
        "Content-Type text/html",
        "team/headers",
        "web.team.svc.cluster.local",
        "team-strip@kubernetescrd",
        "me@example.com",
        "0",  # a bare number is no address
        "2130706433",
        "1.5",
        "metadata",  # a word, not a URL
        "[fd00:ec2::1]:8080",
    ],
)
def test_values_that_stay_in_the_namespace_name_nothing_outside(value):
    assert outside_references(value, NS) == []


@given(st.text(string.printable + "@/:.-,ü\x00\x9b", max_size=60), labels)
def test_any_value_gives_a_list_and_never_raises(value, namespace):
    found = outside_references(value, namespace)
    assert all(isinstance(f, str) and f for f in found)


# -- class ---------------------------------------------------------------------------------------


def test_by_default_an_ingress_with_a_class_is_refused_and_one_without_goes():
    """Without a class, a copy gets the target's default IngressClass: the target owner's
    choice. A class chosen in the source (an internal or privileged controller of the target,
    say) is refused, in the field or in the older annotation."""
    assert refusals(ingress(), ANYWHERE) == []
    assert refused(ingress(ingress_class="nginx-internal"), ANYWHERE) == {
        (CLASS, "nginx-internal (spec.ingressClassName)")
    }
    annotated = ingress(**{CLASS_ANNOTATION: "nginx-internal"})
    assert refused(annotated, ANYWHERE) == {
        (CLASS, f"nginx-internal (annotation {CLASS_ANNOTATION})")
    }


def test_refuse_with_a_class_allows_that_class_only():
    policy = IngressPolicy(ingress_class="public", allowed_hosts=("*",))
    assert refusals(ingress(ingress_class="public"), policy) == []
    assert refusals(ingress(**{CLASS_ANNOTATION: "public"}), policy) == []
    assert refusals(ingress(), policy) == []
    assert refused(ingress(ingress_class="internal"), policy) == {
        (CLASS, "internal (spec.ingressClassName)")
    }


def test_keep_copies_the_class_and_rewrite_writes_the_operators():
    keep = IngressPolicy(class_policy=ClassPolicy.KEEP, allowed_hosts=("*",))
    made = ingress(ingress_class="internal")
    assert refusals(made, keep) == []
    assert IngressCopyRules(keep).desired_copy(made, CLUSTER)["spec"]["ingressClassName"] == (
        "internal"
    )
    rewrite = IngressPolicy(
        class_policy=ClassPolicy.REWRITE, ingress_class="public", allowed_hosts=("*",)
    )
    for original in (made, ingress(), ingress(**{CLASS_ANNOTATION: "internal"})):
        assert refusals(original, rewrite) == []
        copy = IngressCopyRules(rewrite).desired_copy(original, CLUSTER)
        assert copy["spec"]["ingressClassName"] == "public"
        assert CLASS_ANNOTATION not in copy["metadata"]["annotations"], "never both"
    assert made["spec"]["ingressClassName"] == "internal", "the original is not modified"


def test_rewrite_needs_a_class():
    with pytest.raises(ValueError, match="rewrite needs the class"):
        IngressPolicy(class_policy=ClassPolicy.REWRITE)
    with pytest.raises(ValueError, match="IngressClass"):
        IngressPolicy(ingress_class="Not_A_Class")


# -- hosts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("web.apps.example.com", True),
        ("a.b.apps.example.com", True),  # any depth
        ("*.apps.example.com", True),  # a wildcard rule under the domain
        ("WEB.Apps.Example.com.", True),  # TLS hosts are not validated: case, final dot
        ("apps.example.com", False),  # the domain itself: list it
        ("evilapps.example.com", False),
        ("web.apps.example.com.evil.org", False),
        ("api.example.com", True),
        ("www.api.example.com", False),
        ("web .apps.example.com", False),  # not a host name
        ("*", False),
        (None, False),  # every host
    ],
)
def test_hosts_are_allowed_by_name_or_domain(host, allowed):
    policy = IngressPolicy(allowed_hosts=("*.apps.example.com", "api.example.com"))
    assert policy.host_allowed(host) is allowed


def test_by_default_no_host_is_allowed_and_star_allows_every_one():
    """Upstream copies any host: a tenant of the source would route another tenant's host in a
    target's shared ingress controller (paths merged into theirs), or every host with a rule
    that names none. The operator says which hosts its tenants may serve there."""
    for made in (ingress("web.apps.example.com"), ingress(None)):
        assert {r.reason for r in refusals(made, IngressPolicy())} == {HOST_REFUSED}
        assert refusals(made, ANYWHERE) == []


def test_every_host_an_ingress_routes_is_checked():
    made = ingress(
        "web.apps.example.com",
        None,
        tls=[
            {"hosts": ["web.apps.example.com", "bank.example.org"], "secretName": "c"},
            {"secretName": "everything"},
        ],
    )
    made["spec"]["defaultBackend"] = {"service": {"name": "web", "port": {"number": 80}}}
    assert ingress_hosts(made) == [
        "web.apps.example.com",
        None,
        "web.apps.example.com",
        "bank.example.org",
        None,
        None,
    ]
    policy = IngressPolicy(allowed_hosts=("*.apps.example.com",))
    assert refused(made, policy) == {(HOSTS, "(none: every host)"), (HOSTS, "bank.example.org")}


def test_hosts_an_allowed_annotation_adds_must_be_allowed_hosts():
    """Where ``nginx.ingress.kubernetes.io/*`` is allowed, ``server-alias`` made a copy answer
    for hosts outside ``allowedHosts`` (another tenant's, say)."""
    policy = IngressPolicy(
        allowed_annotations=("nginx.ingress.kubernetes.io/*",),
        allowed_hosts=("*.apps.example.com",),
    )
    key = "nginx.ingress.kubernetes.io/server-alias"
    aliased = ingress(**{key: "shop.apps.example.com, bank.example.org,~^.*$"})
    assert refused(aliased, policy) == {
        (HOSTS, "bank.example.org"),
        (HOSTS, "(not shown: not a name)"),
    }
    assert refused(ingress(**{key: "shop.apps.example.com"}), policy) == set()


@pytest.mark.parametrize("pattern", ["*.", "*example.com", "Example.com", "a..b", "**", "a/b"])
def test_host_patterns_that_are_not_names_are_refused(pattern):
    with pytest.raises(ValueError, match="not a lowercase host name"):
        host_pattern(pattern)


# -- upstream, and what users are told -----------------------------------------------------------


def test_upstreams_behaviour_is_one_policy_away_but_for_other_namespaces():
    made = ingress(
        None,
        ingress_class="anything",
        **{"example.com/any": "x", "nginx.ingress.kubernetes.io/server-snippet": "y"},
    )
    assert refusals(made, UPSTREAM_POLICY) == []
    body = desired_copy(made, CLUSTER)
    assert body["spec"] == made["spec"]
    outside = ingress(**{"nginx.ingress.kubernetes.io/auth-tls-secret": "kube-system/ca"})
    assert [r.rule for r in refusals(outside, UPSTREAM_POLICY)] == [OUTSIDE]


def test_each_rule_that_refused_says_what_and_which_value_would_allow_it():
    policy = IngressPolicy(allowed_annotations=("example.com/*",), ingress_class="public")
    made = ingress(
        "bank.example.org",
        ingress_class="internal",
        **{
            "example.com/ref": "kube-system/x",
            "other.example/a": "1",
            "other.example/b": "2",
            "nginx.ingress.kubernetes.io/server-snippet": "x",
        },
    )
    messages = refusal_messages(refusals(made, policy), policy)
    assert [reason for reason, _ in messages] == [
        ANNOTATION_REFUSED,
        ANNOTATION_REFUSED,
        ANNOTATION_REFUSED,
        HOST_REFUSED,
        CLASS_REFUSED,
    ]
    said = dict(
        zip(
            ("allowed", "outside", "refused", "host", "class"),
            (m for _, m in messages),
            strict=True,
        )
    )
    assert (
        "other.example/a, other.example/b: not in chart value ingresses.allowedAnnotations"
        in said["allowed"]
    )
    assert "server-snippet: refused by chart value ingresses.refusedAnnotations" in said["refused"]
    assert "example.com/ref names namespace kube-system" in said["outside"]
    assert "no chart value allows" in said["outside"]
    assert "bank.example.org: not in chart value ingresses.allowedHosts" in said["host"]
    assert "internal (spec.ingressClassName): only class public or none" in said["class"]
    assert all(m.startswith("not copied to targets: ") for _, m in messages)


def test_what_a_tenant_wrote_is_quoted_only_when_it_is_a_name():
    made = ingress(tls=[{"hosts": ["\x1b]52;c;evil\x07.example.com"], "secretName": "c"}])
    assert refusals(made, IngressPolicy(allowed_hosts=("*.apps.example.com",))) == [
        Refusal(HOST_REFUSED, HOSTS, "(not shown: not a name)")
    ]
