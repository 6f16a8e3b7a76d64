"""export and join without clusters: kubeconfigs, names, manifests, messages, and the token and
join steps against an in-memory API."""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from multicluster import ClusterConfig
from multicluster.errors import Forbidden, NotFound, Unauthorized, Unreachable, error_for
from multicluster.pki import CertificateAuthority
from multicluster_scheduler.cli import build_parser
from multicluster_scheduler.connect import export as export_module
from multicluster_scheduler.connect import join as join_module
from multicluster_scheduler.connect import manifests
from multicluster_scheduler.connect.export import (
    TOKEN_TYPE,
    export,
    missing_service_account,
    token_secret,
    token_secret_for,
)
from multicluster_scheduler.connect.join import (
    JoinPlan,
    foreign_secret,
    fresh_ready_condition,
    join,
    not_ready_message,
    plan_from,
    ready_condition,
    same_cluster,
)
from multicluster_scheduler.connect.kubeconfig import (
    ContextCluster,
    context_cluster,
    exported_cluster,
    load_kubeconfig,
    merge_kubeconfigs,
    read_ca_file,
    service_account_kubeconfig,
)
from multicluster_scheduler.connect.problems import ConnectError, explain
from multicluster_scheduler.connect.remote import Context, read_context
from multicluster_scheduler.connect.unjoin import unjoin
from testbed import guide

CA = CertificateAuthority.new("context-ca", path_length=None).cert_pem
OTHER_CA = CertificateAuthority.new("token-ca", path_length=None).cert_pem


def b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


# -- names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("context", "name"),
    [
        ("cluster1", "cluster1"),
        ("kind-c1", "kind-c1"),
        ("gke_my-project_europe-west1_prod", "gke-my-project-europe-west1-prod"),
        ("arn:aws:eks:eu-west-1:123456789012:cluster/Prod", "prod"),
        ("admin@Cluster..2", "admin-cluster-2"),
        ("x" * 80, "x" * 63),
    ],
)
def test_names_derived_from_contexts_are_dns_labels(context, name):
    assert manifests.name_from_context(context) == name


def test_a_context_without_letters_or_digits_asks_for_a_name():
    with pytest.raises(ConnectError, match="--name"):
        manifests.name_from_context("@@@")


@pytest.mark.parametrize("name", ["C1", "-c1", "c1-", "c_1", "", "a" * 64])
def test_bad_names_are_refused(name):
    with pytest.raises(ConnectError, match=r"--name .* not a DNS-1123 label"):
        manifests.check_dns_label(name, "--name")


# -- the local kubeconfig ---------------------------------------------------------------------


def local_config(**cluster) -> dict:
    return {
        "current-context": "c2",
        "clusters": [{"name": "k2", "cluster": {"server": "https://10.0.0.2:6443/", **cluster}}],
        "contexts": [
            {"name": "c2", "context": {"cluster": "k2", "user": "admin", "namespace": "team"}}
        ],
        "users": [{"name": "admin", "user": {"token": "admin-token"}}],
    }


def test_context_cluster_reads_server_ca_and_namespace():
    found = context_cluster(local_config(**{"certificate-authority-data": b64(CA)}))
    assert found == ContextCluster(
        context="c2", server="https://10.0.0.2:6443", ca_pem=CA, namespace="team"
    )


def test_relative_ca_files_are_relative_to_their_kubeconfig(tmp_path: Path):
    (tmp_path / "ca.crt").write_bytes(CA)
    config = local_config(**{"certificate-authority": "ca.crt"})
    merged = merge_kubeconfigs([(config, tmp_path / "config")])
    assert context_cluster(merged, "c2").ca_pem == CA


def test_merged_kubeconfigs_first_definition_and_current_context_win():
    first = {"clusters": [{"name": "k", "cluster": {"server": "https://first"}}]}
    second = {
        "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://second"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k"}}],
    }
    merged = merge_kubeconfigs([(first, Path("first")), (second, Path("second"))])
    assert merged["current-context"] == "c"
    assert context_cluster(merged).server == "https://first"


def test_unknown_context_names_the_known_ones():
    with pytest.raises(
        ConnectError, match=r"context 'nope' is not in the kubeconfig \(contexts: c2\)"
    ):
        context_cluster(local_config(), "nope")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"contexts": ["c2"]}, r"an entry of contexts is not a mapping: 'c2'"),
        ({"contexts": [{"name": "c2", "context": "k2"}]}, r"context 'c2' is not a mapping"),
        ({"clusters": [{"name": "k2", "cluster": ["x"]}]}, r"cluster 'k2' is not a mapping"),
        ({"clusters": {"name": "k2"}}, r"clusters is not a list"),
        ({"users": [{"name": ["u"]}]}, r"a user name is not a string"),
        ({"current-context": 3}, r"current-context is not a string"),
        ({"clusters": [{"name": "k2", "cluster": {"server": 1}}]}, r"server is not a string"),
        (
            {
                "clusters": [
                    {"name": "k2", "cluster": {"server": "https://x", "tls-server-name": 1}}
                ]
            },
            r"tls-server-name is not a string",
        ),
        (
            {"clusters": [{"name": "k2", "cluster": {"server": "x", "certificate-authority": 2}}]},
            r"certificate-authority is not a string",
        ),
        (
            {
                "clusters": [
                    {"name": "k2", "cluster": {"server": "x", "insecure-skip-tls-verify": "no"}}
                ]
            },
            r"insecure-skip-tls-verify is not true or false",
        ),
        (
            {"contexts": [{"name": "c2", "context": {"cluster": ["k2"]}}]},
            r"cluster is not a string",
        ),
        (
            {"contexts": [{"name": "c2", "context": {"user": "u"}}]},
            r"context 'c2' names no cluster",
        ),
    ],
)
def test_malformed_kubeconfigs_say_what_is_wrong(tmp_path: Path, document: dict, message: str):
    config = local_config()
    for key, value in document.items():
        config[key] = value
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConnectError, match=message):
        context_cluster(load_kubeconfig(str(path)), "c2")


@pytest.mark.parametrize(
    "text",
    [
        "2024-13-01",  # a date that does not exist: PyYAML raises ValueError
        "clusters: [{name: k, cluster: {server: 2024-02-30}}]",
        "[" * 2000,
        "a: !!binary '@@'",
        "{[1]: 2}",
        "\t- x",
    ],
)
def test_kubeconfigs_that_are_not_yaml_are_connect_errors(tmp_path: Path, text: str):
    path = tmp_path / "config"
    path.write_text(text)
    with pytest.raises(ConnectError, match="kubeconfig"):
        context_cluster(load_kubeconfig(str(path)), "c")


def test_a_kubeconfig_that_is_not_text_is_a_connect_error(tmp_path: Path):
    path = tmp_path / "config"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConnectError, match=r"cannot read kubeconfig"):
        load_kubeconfig(str(path))


def test_what_the_kubernetes_loader_lets_through_is_a_connect_error(tmp_path: Path, monkeypatch):
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(local_config()))

    def loader_bug(*_args, **_kwargs):
        raise AttributeError("'str' object has no attribute 'get'")

    monkeypatch.setattr(ClusterConfig, "from_kubeconfig", loader_bug)
    with pytest.raises(ConnectError, match=r"kubeconfig context c2: cannot use its user"):
        read_context(str(path), "c2")


def test_a_user_of_the_wrong_shape_is_a_connect_error(tmp_path: Path):
    config = local_config()
    config["users"] = [{"name": "admin", "user": {"username": 1, "password": 2}}]
    path = tmp_path / "config"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConnectError, match=r"kubeconfig context c2"):
        read_context(str(path), "c2")


# Random kubeconfig-like documents: every value may be of the wrong shape. No user entry ever
# has exec or auth-provider keys (the kubernetes loader would run a command).
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=6) | st.floats(allow_nan=False),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["name", "server", "x", "0"]), inner, max_size=3)
    ),
    max_leaves=8,
)


def maybe(strategy):
    """Mostly ``strategy``, sometimes anything: deep parts of the document get a chance too."""
    return st.sampled_from(range(12)).flatmap(lambda i: JUNK if i == 11 else strategy)


NAMES = st.sampled_from(["c", "k", "u", ""])
CLUSTER = st.fixed_dictionaries(
    {
        "server": maybe(st.sampled_from(["https://127.0.0.1:1", "https://x/", "", "http://y"])),
        "certificate-authority-data": maybe(st.sampled_from([None, b64(CA), "@@", b64("x")])),
        "certificate-authority": maybe(st.sampled_from([None, "ca.crt", "/nonexistent", "a\0b"])),
        "insecure-skip-tls-verify": maybe(st.sampled_from([None, True, False])),
        "tls-server-name": maybe(st.sampled_from([None, "k", ""])),
    },
)
CONTEXT = st.fixed_dictionaries(
    {
        "cluster": maybe(NAMES),
        "user": maybe(NAMES),
        "namespace": maybe(st.sampled_from([None, "team", ""])),
    },
)
USER = st.fixed_dictionaries(
    {},
    optional={
        "token": maybe(st.sampled_from(["t", ""])),
        "username": maybe(st.just("me")),
        "password": maybe(st.just("pw")),
        "client-certificate-data": maybe(st.sampled_from(["@@", b64("x")])),
        "client-key-data": maybe(st.sampled_from(["@@", b64("x")])),
        "client-certificate": maybe(st.sampled_from(["/nonexistent", ""])),
        "tokenFile": maybe(st.sampled_from(["/nonexistent", ""])),
    },
)


def entries(field: str, value):
    entry = st.fixed_dictionaries({"name": maybe(NAMES), field: maybe(value)})
    return maybe(st.lists(maybe(entry), min_size=1, max_size=3))


KUBECONFIGS = st.fixed_dictionaries(
    {
        "current-context": maybe(NAMES),
        "clusters": entries("cluster", CLUSTER),
        "contexts": entries("context", CONTEXT),
        "users": entries("user", USER),
    },
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=maybe(KUBECONFIGS), context=st.sampled_from(["c", None]))
def test_any_kubeconfig_is_usable_or_a_connect_error(tmp_path_factory, document, context):
    folder = tmp_path_factory.mktemp("kubeconfig")
    (folder / "ca.crt").write_bytes(CA)
    path = folder / "config"
    path.write_text(yaml.safe_dump(document))
    try:
        cluster, config = read_context(str(path), context)
    except ConnectError:
        return
    assert cluster.server == config.server


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="{}[]:-, \n\t!&*?|>'\"#%@`abc01", max_size=40))
def test_any_text_is_a_kubeconfig_or_a_connect_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("kubeconfig") / "config"
    path.write_text(text)
    with contextlib.suppress(ConnectError):
        context_cluster(load_kubeconfig(str(path)), "c")


def test_ca_file_must_be_pem(tmp_path: Path):
    path = tmp_path / "ca.txt"
    path.write_text("not a certificate")
    with pytest.raises(ConnectError, match="not a PEM certificate"):
        read_ca_file(path)
    with pytest.raises(ConnectError, match="cannot read CA certificate"):
        read_ca_file(tmp_path / "missing.crt")


# -- the exported kubeconfig ------------------------------------------------------------------

LOCAL = ContextCluster(context="c2", server="https://127.0.0.1:6443", ca_pem=CA)


def test_exported_cluster_defaults_to_the_token_ca_then_the_context_ca():
    assert exported_cluster(LOCAL) == {
        "server": "https://127.0.0.1:6443",
        "certificate-authority-data": b64(CA),
    }
    with_token_ca = exported_cluster(LOCAL, token_ca_pem=OTHER_CA)
    assert with_token_ca["certificate-authority-data"] == b64(OTHER_CA)


def test_server_and_ca_overrides_win():
    cluster = exported_cluster(
        LOCAL, server="https://172.18.0.2:6443/", ca_pem=OTHER_CA, token_ca_pem=CA
    )
    assert cluster == {
        "server": "https://172.18.0.2:6443",
        "certificate-authority-data": b64(OTHER_CA),
    }


def test_insecure_contexts_pass_the_skip_through_unless_a_ca_is_given():
    insecure = ContextCluster(context="c", server="https://x", insecure=True, tls_server_name="k")
    assert exported_cluster(insecure, token_ca_pem=CA) == {
        "server": "https://x",
        "insecure-skip-tls-verify": True,
        "tls-server-name": "k",
    }
    assert "insecure-skip-tls-verify" not in exported_cluster(insecure, ca_pem=CA)


def test_tls_server_name_is_kept_only_for_the_contexts_own_address():
    named = ContextCluster(
        context="c", server="https://10.0.0.2:6443", ca_pem=CA, tls_server_name="k"
    )
    assert exported_cluster(named)["tls-server-name"] == "k"
    assert exported_cluster(named, server="https://10.0.0.2:6443/")["tls-server-name"] == "k"
    # Another address: the name was meant for the context's, not for this one.
    assert "tls-server-name" not in exported_cluster(named, server="https://172.18.0.3:6443")
    # Unless given explicitly (--tls-server-name).
    explicit = exported_cluster(named, server="https://lb:443", tls_server_name="api.internal")
    assert explicit["tls-server-name"] == "api.internal"
    assert exported_cluster(LOCAL, tls_server_name="n")["tls-server-name"] == "n"


def test_exported_secret_is_a_kubeconfig_the_runtime_loads():
    kubeconfig = service_account_kubeconfig(
        "cluster2", exported_cluster(LOCAL), "sa-token", "team", "c1"
    )
    secret = manifests.kubeconfig_secret("c2", kubeconfig)
    # kubectl -n decides where it goes; the label tells join that it may overwrite it.
    assert secret["metadata"] == {
        "name": "c2",
        "labels": {"app.kubernetes.io/managed-by": "multicluster-scheduler"},
    }
    assert list(secret["data"]) == ["config"]
    loaded = ClusterConfig.from_secret(secret)
    assert loaded.server == "https://127.0.0.1:6443"
    assert loaded.authorization() == "Bearer sa-token"
    document = yaml.safe_load(base64.b64decode(secret["data"]["config"]))
    assert document["contexts"][0]["context"] == {
        "cluster": "cluster2",
        "user": "team/c1",
        "namespace": "team",
    }


# -- manifests --------------------------------------------------------------------------------


def test_sources_are_the_guides():
    assert manifests.source("c1", "ns", "c1") == yaml.safe_load(guide.source("ns"))
    assert manifests.cluster_source("c1", "c1", "admiralty") == yaml.safe_load(guide.CLUSTER_SOURCE)


def test_targets_are_the_guides_with_the_key_spelled_out():
    remote, local = yaml.safe_load_all(guide.targets("ns"))
    remote["spec"]["kubeconfigSecret"]["key"] = "config"
    assert manifests.target("c2", "ns", secret="c2") == remote
    assert manifests.target("c1", "ns", secret=None) == local
    remote, local = yaml.safe_load_all(guide.CLUSTER_TARGETS)
    remote["spec"]["kubeconfigSecret"]["key"] = "config"
    assert manifests.cluster_target("c2", secret="c2", secret_namespace="admiralty") == remote
    assert manifests.cluster_target("c1", secret=None, secret_namespace="admiralty") == local


# -- messages ---------------------------------------------------------------------------------


def status(code: int, message: str, details: dict | None = None) -> dict:
    body = {"kind": "Status", "code": code, "message": message}
    if details is not None:
        body["details"] = details
    return body


def test_forbidden_quotes_the_missing_permission():
    server_says = (
        'sources.multicluster.admiralty.io "c1" is forbidden: User "system:serviceaccount:t:nobody"'
        ' cannot patch resource "sources" in API group "multicluster.admiralty.io" in the'
        ' namespace "t"'
    )
    error = error_for(403, status(403, server_says), "PATCH /apis/...")
    assert isinstance(error, Forbidden)
    message = explain(error, doing="apply Source t/c1", context="b", server="https://b:6443")
    assert message.startswith("cannot apply Source t/c1: context b (https://b:6443) does not")
    assert "403 Forbidden" in message
    assert 'cannot patch resource "sources"' in message
    assert "ask an admin" in message


def unreachable(cause: Exception) -> Unreachable:
    error = Unreachable(f"GET /api/v1/... on b: {cause!r}")
    error.__cause__ = cause
    return error


def test_unreachable_names_the_address_and_the_network_error():
    error = unreachable(OSError("connection refused"))
    message = explain(error, doing="read ServiceAccount t/c1", context="b", server="https://b:1")
    assert message == (
        "cannot read ServiceAccount t/c1: the API server of context b (https://b:1) does not "
        "answer (connection refused); check that the cluster is up and that https://b:1 is the "
        "right address"
    )
    timed_out = explain(unreachable(TimeoutError()), doing="x", context="b", server="s")
    assert "does not answer (timed out)" in timed_out


def test_unauthorized_asks_for_fresh_credentials():
    error = Unauthorized("x", body=status(401, "Unauthorized"))
    assert "log in again" in explain(error, doing="x", context="b", server="s")


def test_missing_namespace_and_missing_kind_say_what_to_install_or_create():
    namespace = NotFound("x", body=status(404, "m", {"name": "team", "kind": "namespaces"}))
    assert "namespace team does not exist in context b" in explain(
        namespace, doing="apply Secret team/c2", context="b", server="s"
    )
    kind = NotFound("x", body=status(404, "the server could not find the requested resource"))
    assert "is multicluster-scheduler installed there" in explain(
        kind, doing="apply Source t/c1", context="b", server="s", installed_kind="Source"
    )


def test_not_ready_messages_carry_reason_and_hint():
    condition = {"type": "Ready", "status": "False", "reason": "Unreachable", "message": "refused"}
    message = not_ready_message("Target t/c2", "a", 60, condition)
    assert message.startswith("Target t/c2 in context a not Ready after 60s: Unreachable (refused)")
    assert "--server" in message
    assert "agent running in the source" in not_ready_message("Target t/c2", "a", 5, None)


def test_ready_condition_ignores_conditions_of_older_generations():
    target = {
        "metadata": {"generation": 2},
        "status": {"conditions": [{"type": "Ready", "status": "True", "observedGeneration": 1}]},
    }
    assert ready_condition(target) is None
    target["status"]["conditions"][0]["observedGeneration"] = 2
    assert ready_condition(target)["status"] == "True"


# -- plans ------------------------------------------------------------------------------------


def join_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["join", *argv])


def test_plan_names_the_source_after_the_source_and_the_target_after_the_target():
    plan = plan_from(join_args("--source-context", "cluster1", "--target-context", "cluster2"))
    assert (plan.source_name, plan.service_account, plan.target_name) == (
        "cluster1",
        "cluster1",
        "cluster2",
    )
    assert plan.namespace == plan.service_account_namespace == plan.secret_namespace == "default"
    assert plan.source_manifest()["metadata"] == {"name": "cluster1", "namespace": "default"}
    assert plan.target_manifest()["spec"]["kubeconfigSecret"]["name"] == "cluster2"
    assert plan.virtual_node == "admiralty-namespace-default-cluster2"


def test_plan_namespace_defaults_to_the_source_contexts():
    args = join_args("--source-context", "a", "--target-context", "b", "--name", "c1")
    assert plan_from(args, "team").namespace == "team"


def test_cluster_scoped_plan_uses_the_admiralty_namespace():
    plan = plan_from(
        join_args("--source-context", "a", "--target-context", "b", "--cluster-scoped")
    )
    assert plan.namespace is None
    assert plan.source_manifest()["spec"]["serviceAccount"] == {
        "name": "a",
        "namespace": "admiralty",
    }
    assert plan.target_manifest()["spec"]["kubeconfigSecret"] == {
        "name": "b",
        "namespace": "admiralty",
        "key": "config",
    }
    assert plan.virtual_node == "admiralty-cluster-b"


def test_namespace_and_cluster_scope_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        join_args("--source-context", "a", "--target-context", "b", "-n", "x", "--cluster-scoped")
    assert "not allowed with argument" in capsys.readouterr().err


def test_joining_a_context_to_itself_plans_a_self_target():
    plan = plan_from(join_args("--source-context", "a", "--target-context", "a"))
    assert plan.self_target
    assert plan.target_manifest()["spec"] == {"self": True}


# -- against an in-memory API -----------------------------------------------------------------


class FakeClient:
    """Enough of multicluster.Client for export and join: objects in a dict, resource versions
    that change only when content does, and a token controller that fills token Secrets after
    ``fill_after`` reads."""

    def __init__(self, fill_after: int | None = 0) -> None:
        self.objects: dict[tuple[str, str | None, str], dict] = {}
        self.version = 0
        self.fill_after = fill_after
        self.reads = 0
        self.deleted: list[tuple[str, str | None, str]] = []

    def put(self, plural: str, obj: dict) -> dict:
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if "generateName" in meta and "name" not in meta:
            meta["name"] = meta["generateName"] + "x1y2z"
        self.version += 1
        meta["resourceVersion"] = str(self.version)
        meta.setdefault("uid", f"uid-{meta['name']}")
        meta.setdefault("creationTimestamp", f"2024-01-01T00:00:{self.version:02d}Z")
        self.objects[(plural, meta.get("namespace"), meta["name"])] = obj
        return copy.deepcopy(obj)

    def _token_controller(self) -> None:
        self.reads += 1
        if self.fill_after is None or self.reads <= self.fill_after:
            return
        for (plural, _, _), obj in self.objects.items():
            if plural == "secrets" and obj.get("type") == TOKEN_TYPE and not obj.get("data"):
                obj["data"] = {"token": b64("filled-token"), "ca.crt": b64(OTHER_CA)}

    async def get(self, resource, name, namespace=None):
        self._token_controller()
        key = (resource.plural, namespace if resource.namespaced else None, name)
        if key not in self.objects:
            raise NotFound("not found", body=status(404, "nf", {"name": name}))
        return copy.deepcopy(self.objects[key])

    async def list(self, resource, namespace=None, *, field_selector=None, **_):
        self._token_controller()
        items = [
            copy.deepcopy(o)
            for (plural, ns, _), o in self.objects.items()
            if plural == resource.plural and ns == namespace
        ]
        if field_selector == f"type={TOKEN_TYPE}":
            items = [o for o in items if o.get("type") == TOKEN_TYPE]
        elif field_selector and field_selector.startswith("spec.nodeName="):
            node = field_selector.split("=", 1)[1]
            items = [o for o in items if (o.get("spec") or {}).get("nodeName") == node]
        return items, str(self.version)

    async def create(self, resource, body, namespace=None):
        return self.put(resource.plural, body)

    async def patch(self, resource, name, patch, namespace=None, **_):
        key = (resource.plural, namespace if resource.namespaced else None, name)
        current = self.objects.get(key)
        if current is not None:
            merged = {**copy.deepcopy(current), **copy.deepcopy(patch)}
            merged["metadata"] = current["metadata"]
            unchanged = {k: v for k, v in current.items() if k != "metadata"} == {
                k: v for k, v in merged.items() if k != "metadata"
            }
            if unchanged:
                return copy.deepcopy(current)
            patch = merged
        return self.put(resource.plural, patch)

    async def delete(self, resource, name, namespace=None, *, preconditions=None, **_):
        key = (resource.plural, namespace if resource.namespaced else None, name)
        if key not in self.objects:
            raise NotFound("not found", body=status(404, "nf", {"name": name}))
        uid = (preconditions or {}).get("uid")
        if uid and self.objects[key]["metadata"]["uid"] != uid:
            raise error_for(409, status(409, "Precondition failed: UID in precondition"), "fake")
        self.deleted.append(key)
        return self.objects.pop(key)

    async def close(self) -> None:
        pass


def fake_context(
    name: str = "cluster2", namespaces: tuple[str, ...] = ("t", "admiralty"), **options
) -> Context:
    cluster = ContextCluster(context=name, server=f"https://{name}:6443", ca_pem=CA)
    client = FakeClient(**options)
    for namespace in namespaces:
        client.put("namespaces", {"metadata": {"name": namespace}})
    return Context(name, cluster, client)  # type: ignore[arg-type]


ACCOUNT = {"metadata": {"name": "c1", "namespace": "t", "uid": "uid-sa"}}


def token(name: str, *, filled: bool = True, uid: str | None = "uid-sa", **meta) -> dict:
    annotations = {"kubernetes.io/service-account.name": "c1"}
    if uid:
        annotations["kubernetes.io/service-account.uid"] = uid
    secret = {
        "metadata": {"name": name, "namespace": "t", "annotations": annotations, **meta},
        "type": TOKEN_TYPE,
    }
    if filled:
        secret["data"] = {"token": b64(f"token-of-{name}")}
    return secret


def test_token_secrets_belong_to_one_live_account():
    assert token_secret_for(token("a"), ACCOUNT)
    assert token_secret_for(token("a", uid=None), ACCOUNT)
    assert not token_secret_for(token("a", uid="uid-of-a-deleted-account"), ACCOUNT)
    invalid = token("a", labels={"kubernetes.io/legacy-token-invalid-since": "2024-01-01"})
    assert not token_secret_for(invalid, ACCOUNT)
    assert not token_secret_for({**token("a"), "type": "Opaque"}, ACCOUNT)


async def test_a_filled_token_secret_is_reused_legacy_reference_first():
    ctx = fake_context()
    client = ctx.client
    client.put("secrets", token("older"))
    client.put("secrets", token("referenced"))
    client.put("serviceaccounts", {**ACCOUNT, "secrets": [{"name": "referenced"}]})
    found = await token_secret(ctx, "t", "c1")
    assert found["metadata"]["name"] == "referenced"
    assert len([k for k in client.objects if k[0] == "secrets"]) == 2


async def test_without_a_token_secret_one_is_created_and_waited_for():
    ctx = fake_context(fill_after=5)
    ctx.client.put("serviceaccounts", ACCOUNT)
    ctx.client.put(
        "secrets", {"metadata": {"name": "unrelated", "namespace": "t"}, "type": "Opaque"}
    )
    found = await token_secret(ctx, "t", "c1", timeout=5)
    assert found["metadata"]["name"] == "c1-token"
    assert found["metadata"]["annotations"] == {"kubernetes.io/service-account.name": "c1"}
    assert found["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "multicluster-scheduler"}
    assert export_module.token_of(found) == "filled-token"


async def test_a_name_taken_by_another_secret_gets_a_generated_one():
    ctx = fake_context()
    ctx.client.put("serviceaccounts", ACCOUNT)
    ctx.client.put(
        "secrets", {"metadata": {"name": "c1-token", "namespace": "t"}, "type": "Opaque"}
    )
    found = await token_secret(ctx, "t", "c1", timeout=5)
    assert found["metadata"]["name"].startswith("c1-token-")


async def test_a_token_never_filled_points_at_the_token_controller():
    ctx = fake_context(fill_after=None)
    ctx.client.put("serviceaccounts", ACCOUNT)
    with pytest.raises(ConnectError, match=r"not filled within 0\.3s: is kube-controller-manager"):
        await token_secret(ctx, "t", "c1", timeout=0.3)


async def test_a_missing_service_account_is_explained():
    with pytest.raises(ConnectError) as error:
        await token_secret(fake_context("b"), "t", "c1")
    assert str(error.value) == missing_service_account("t", "c1", "b")
    assert str(error.value) == (
        "service account t/c1 not found in context b: create a Source for it (the agent makes it)"
        " or create it yourself"
    )


async def test_exported_secret_uses_the_token_and_its_ca():
    ctx = fake_context()
    ctx.client.put("serviceaccounts", ACCOUNT)
    secret = await export(ctx, namespace="t", service_account="c1", secret_name="c2")
    config = yaml.safe_load(base64.b64decode(secret["data"]["config"]))
    assert config["clusters"][0]["cluster"] == {
        "server": "https://cluster2:6443",
        "certificate-authority-data": b64(OTHER_CA),
    }
    assert config["users"][0]["user"] == {"token": "filled-token"}
    again = await export(ctx, namespace="t", service_account="c1", secret_name="c2")
    assert again == secret


async def test_join_twice_changes_nothing_the_second_time():
    source, target = fake_context("cluster1"), fake_context("cluster2")

    def plan() -> JoinPlan:
        args = join_args("--source-context", "cluster1", "--target-context", "cluster2", "-n", "t")
        return plan_from(args)

    # What the target's Source controller makes.
    target.client.put("serviceaccounts", {"metadata": {"name": "cluster1", "namespace": "t"}})
    lines: list[str] = []
    await join(plan(), source, target, wait=False, report=lines.append)
    assert lines == [
        "Source t/cluster1 created in cluster2",
        "Secret t/cluster1-token created in cluster2 (the token for t/cluster1)",
        "Secret t/cluster2 created in cluster1 (kubeconfig of t/cluster1)",
        "Target t/cluster2 created in cluster1",
    ]
    stored = copy.deepcopy(source.client.objects)
    lines.clear()
    await join(plan(), source, target, wait=False, report=lines.append)
    assert lines == [
        "Source t/cluster1 unchanged in cluster2",
        "Secret t/cluster2 unchanged in cluster1 (kubeconfig of t/cluster1)",
        "Target t/cluster2 unchanged in cluster1",
    ]
    assert source.client.objects == stored
    secret = source.client.objects[("secrets", "t", "cluster2")]
    assert ClusterConfig.from_secret(secret).authorization() == "Bearer filled-token"


async def test_join_explains_a_source_controller_that_never_makes_the_account():
    args = join_args("--source-context", "a", "--target-context", "b", "-n", "t")
    with pytest.raises(ConnectError, match=r"did not appear in context b within 0\.2s: is "):
        await join(plan_from(args), fake_context("a"), fake_context("b"), timeout=0.2)


def test_export_and_join_are_subcommands():
    args = build_parser().parse_args(
        ["export", "c1", "--as", "c2", "-n", "t", "--server", "https://x"]
    )
    assert (args.command, args.service_account, args.secret_name, args.namespace, args.server) == (
        "export",
        "c1",
        "c2",
        "t",
        "https://x",
    )


async def test_join_quotes_a_source_that_is_not_ready():
    target = fake_context("b")
    target.client.put(
        "sources",
        {
            "metadata": {"name": "a", "namespace": "t"},
            "spec": {"serviceAccountName": "a"},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "Conflict", "message": "taken"}
                ]
            },
        },
    )
    args = join_args("--source-context", "a", "--target-context", "b", "-n", "t")
    with pytest.raises(ConnectError) as error:
        await join(plan_from(args), fake_context("a"), target, timeout=0.2)
    assert str(error.value).endswith("; Source t/a in context b is not Ready: Conflict (taken)")


def test_what_a_hostile_target_writes_reaches_the_terminal_as_text_only(monkeypatch, capsys):
    """join quotes the target's Source when it is not Ready (and unjoin the names of what the
    target lists): a hostile target's server chooses those words, and nothing in them may be
    obeyed by the terminal (clear the screen, retitle the window, write the clipboard)."""
    hostile = "taken\x1b[2J\x1b]52;c;ZXZpbA==\x07\x9b2J\r\nerror: fake\u202e"
    target = fake_context("b")
    target.client.put(
        "sources",
        {
            "metadata": {"name": "a", "namespace": "t"},
            "spec": {"serviceAccountName": "a"},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "Conflict", "message": hostile}
                ]
            },
        },
    )
    contexts = {"a": fake_context("a"), "b": target}

    @contextlib.asynccontextmanager
    async def opened(_kubeconfig, name):
        yield contexts[name]

    monkeypatch.setattr(join_module, "open_context", opened)
    args = join_args("--source-context", "a", "--target-context", "b", "-n", "t")
    args.timeout = 0.2
    assert join_module.main(args) == 1
    out, err = capsys.readouterr()
    for obeyed in ("\x1b", "\x07", "\x9b", "\r", "\u202e"):
        assert obeyed not in out + err
    assert [line for line in err.splitlines() if line.startswith("error: ")] == [
        err.splitlines()[-1]
    ], "one error line: no forged one under it"
    assert "Conflict (taken [2J ]52;c;ZXZpbA== 2J error: fake)" in err


def same_cluster_contexts(uid: str | None = "uid-ks") -> tuple[Context, Context]:
    """Two contexts of one cluster: one in-memory API, two names."""
    source = fake_context("cluster1")
    alias = Context("cluster1-admin", source.cluster, source.client)
    if uid:
        source.client.put("namespaces", {"metadata": {"name": "kube-system", "uid": uid}})
    return source, alias


async def test_two_contexts_of_one_cluster_make_a_self_target_and_say_so():
    source, alias = same_cluster_contexts()
    args = join_args(
        "--source-context", "cluster1", "--target-context", "cluster1-admin", "-n", "t"
    )
    lines: list[str] = []
    await join(plan_from(args), source, alias, wait=False, report=lines.append)
    assert lines == [
        "contexts cluster1 and cluster1-admin reach the same cluster (kube-system namespace uid "
        "uid-ks): making a self Target",
        "Target t/cluster1-admin created in cluster1",
    ]
    kinds = {plural for plural, _, _ in source.client.objects}
    assert kinds == {"namespaces", "targets"}  # no Source, no Secret
    assert source.client.objects[("targets", "t", "cluster1-admin")]["spec"] == {"self": True}


async def test_different_kube_system_uids_are_different_clusters_whatever_the_address():
    source, target = fake_context("cluster1"), fake_context("cluster2")
    target.cluster = source.cluster  # the same address, e.g. a tunnel to one port
    source.client.put("namespaces", {"metadata": {"name": "kube-system", "uid": "one"}})
    target.client.put("namespaces", {"metadata": {"name": "kube-system", "uid": "two"}})
    assert await same_cluster(source, target) is None


async def test_without_permission_to_read_kube_system_the_addresses_are_compared(monkeypatch):
    source, alias = same_cluster_contexts(uid="uid-ks")
    forbidden = Forbidden("x", body=status(403, 'namespaces "kube-system" is forbidden'))

    async def get(resource, name, namespace=None):
        raise forbidden

    monkeypatch.setattr(alias, "client", copy.copy(alias.client))
    monkeypatch.setattr(alias.client, "get", get)
    assert await same_cluster(source, alias) == "server https://cluster1:6443"
    other = fake_context("cluster2")
    assert await same_cluster(source, other) is None


SECRET = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque"}


def kubeconfig_data() -> str:
    return b64(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "clusters": []}))


@pytest.mark.parametrize(
    ("secret", "why"),
    [
        ({"data": {"password": b64("hunter2")}}, "it holds password"),
        ({"data": {"config": kubeconfig_data(), "ca.crt": b64(CA)}}, "it holds ca.crt"),
        ({"data": {"config": b64("log_level: debug\n")}}, "its config is not a kubeconfig"),
        ({"type": "kubernetes.io/tls", "data": {}}, "its type is kubernetes.io/tls"),
    ],
)
def test_secrets_join_did_not_write_are_foreign(secret, why):
    assert foreign_secret({**SECRET, "metadata": {"name": "c2"}, **secret}, "config") == why


@pytest.mark.parametrize(
    "metadata",
    [
        {"labels": {"app.kubernetes.io/managed-by": "multicluster-scheduler"}},
        {"managedFields": [{"manager": "multicluster-scheduler", "operation": "Apply"}]},
        {},  # nothing but a kubeconfig under the key (export | kubectl apply, or by hand)
    ],
)
def test_secrets_join_or_export_wrote_may_be_overwritten(metadata):
    data = {"config": kubeconfig_data()} if not metadata else {"other": b64("x")}
    secret = {**SECRET, "metadata": {"name": "c2", **metadata}, "data": data}
    assert foreign_secret(secret, "config") is None
    assert foreign_secret({**SECRET, "metadata": {"name": "c2"}}, "config") is None  # empty


async def test_join_refuses_to_overwrite_an_unrelated_secret_and_writes_nothing():
    source, target = fake_context("cluster1"), fake_context("cluster2")
    target.client.put("serviceaccounts", {"metadata": {"name": "cluster1", "namespace": "t"}})
    unrelated = {**SECRET, "metadata": {"name": "cluster2", "namespace": "t"}}
    unrelated["data"] = {"password": b64("hunter2")}
    source.client.put("secrets", unrelated)
    stored = copy.deepcopy(source.client.objects), copy.deepcopy(target.client.objects)
    args = join_args("--source-context", "cluster1", "--target-context", "cluster2", "-n", "t")
    with pytest.raises(ConnectError) as error:
        await join(plan_from(args), source, target, wait=False, report=lambda _: None)
    assert str(error.value) == (
        "Secret t/cluster2 already exists in context cluster1 and was not written by join or "
        "export (it holds password); join would overwrite it: name the Target and its Secret "
        "otherwise with --target-name, or delete that Secret if it is a leftover"
    )
    assert (source.client.objects, target.client.objects) == stored


def ready_target(transitioned: str) -> dict:
    return {
        "apiVersion": "multicluster.admiralty.io/v1alpha1",
        "kind": "Target",
        "metadata": {"name": "cluster2", "namespace": "t", "generation": 1},
        "spec": {"kubeconfigSecret": {"name": "cluster2", "key": "config"}},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "Ready",
                    "message": "the target's ClusterSummary is current",
                    "lastTransitionTime": transitioned,
                    "observedGeneration": 1,
                }
            ]
        },
    }


async def joined_and_ready() -> tuple[Context, Context]:
    """cluster1 joined to cluster2 in namespace t, its Target Ready since 10:00:00."""
    source, target = fake_context("cluster1"), fake_context("cluster2")
    target.client.put("serviceaccounts", {"metadata": {"name": "cluster1", "namespace": "t"}})
    await join(rejoin_plan(), source, target, wait=False, report=lambda _: None)
    source.client.put("targets", ready_target("2024-01-01T10:00:00Z"))
    return source, target


def rejoin_plan() -> JoinPlan:
    return plan_from(
        join_args("--source-context", "cluster1", "--target-context", "cluster2", "-n", "t")
    )


def test_no_kubeconfig_says_how_to_give_one(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ConnectError) as error:
        load_kubeconfig()
    assert str(error.value) == (
        f"no kubeconfig found (looked at {tmp_path}/.kube/config): give one with --kubeconfig "
        "FILE, or set KUBECONFIG=FILE (the demo's is .testbed/kubeconfig in the clone; its report "
        "ends with the export line)"
    )


def test_a_ready_condition_from_before_the_secret_changed_is_stale():
    stale = ready_target("2024-01-01T10:00:00Z")["status"]["conditions"][0]
    assert fresh_ready_condition(ready_target("2024-01-01T10:00:00Z"), stale) is None
    assert fresh_ready_condition(ready_target("2024-01-01T10:05:00Z"), stale)["status"] == "True"
    assert fresh_ready_condition(ready_target("2024-01-01T10:00:00Z"), None)["status"] == "True"


async def test_a_rejoin_that_changes_nothing_trusts_the_ready_target():
    source, target = await joined_and_ready()
    lines: list[str] = []
    await join(rejoin_plan(), source, target, timeout=1, report=lines.append)
    assert lines[-1] == "Target t/cluster2 Ready: virtual node admiralty-namespace-t-cluster2"


async def test_a_rejoin_that_changes_the_secret_waits_for_the_agent_to_reconnect():
    source, target = await joined_and_ready()
    # No agent: the Target keeps saying Ready about the old Secret.
    with pytest.raises(ConnectError) as error:
        await join(rejoin_plan(), source, target, server="https://elsewhere:6443", timeout=0.5)
    assert str(error.value) == (
        "Target t/cluster2 in context cluster1 not Ready after 0.5s: it still reports the "
        "connection made with the previous Secret, nobody reconnected with the new one: is the "
        "multicluster-scheduler agent running in the source?"
    )

    # An agent that reconnects after a while: Connecting, then Ready again.
    async def agent() -> None:
        await asyncio.sleep(0.3)
        source.client.put("targets", ready_target("2024-01-01T10:07:00Z"))

    lines: list[str] = []
    reconnected = asyncio.create_task(agent())
    await join(
        rejoin_plan(), source, target, server="https://again:6443", timeout=5, report=lines.append
    )
    await reconnected
    assert lines[1] == "Secret t/cluster2 configured in cluster1 (kubeconfig of t/cluster1)"
    assert lines[-1] == "Target t/cluster2 Ready: virtual node admiralty-namespace-t-cluster2"


def test_tls_server_name_is_a_connection_option():
    args = join_args("--source-context", "a", "--target-context", "b", "--tls-server-name", "n")
    assert args.tls_server_name == "n"


async def test_an_apply_is_unchanged_when_only_a_controller_wrote_meanwhile():
    """The agent writes a Target's status as join applies it: that is not a change join made."""
    from multicluster_scheduler.api.resources import TARGETS

    context = fake_context("cluster1")
    manifest = {
        "apiVersion": "multicluster.admiralty.io/v1alpha1",
        "kind": "Target",
        "metadata": {"name": "c2", "namespace": "t"},
        "spec": {"kubeconfigSecret": {"name": "c2", "key": "config"}},
    }
    _, outcome = await context.apply(TARGETS, manifest)
    assert outcome == "created"
    client = context.client
    real_patch = client.patch

    async def patch_after_a_status_write(resource, name, patch, namespace=None, **kw):
        current = client.objects[(resource.plural, namespace, name)]
        client.put(resource.plural, {**current, "status": {"conditions": [{"type": "Ready"}]}})
        return await real_patch(resource, name, patch, namespace, **kw)

    client.patch = patch_after_a_status_write
    _, outcome = await context.apply(TARGETS, manifest)
    assert outcome == "unchanged"
    changed = {**manifest, "spec": {"kubeconfigSecret": {"name": "other", "key": "config"}}}
    _, outcome = await context.apply(TARGETS, changed)
    assert outcome == "configured"


# -- all or nothing, progress, early failure ---------------------------------------------------


def failing_target(reason: str, message: str) -> dict:
    target = ready_target("2024-01-01T10:00:00Z")
    condition = target["status"]["conditions"][0]
    condition.update(status="False", reason=reason, message=message)
    return target


def joining() -> tuple[Context, Context, JoinPlan]:
    source, target = fake_context("cluster1"), fake_context("cluster2")
    target.client.put("serviceaccounts", {"metadata": {"name": "cluster1", "namespace": "t"}})
    return source, target, rejoin_plan()


async def test_a_target_that_keeps_failing_is_given_up_early_and_rolled_back():
    source, target, plan = joining()
    before = copy.deepcopy(target.client.objects), copy.deepcopy(source.client.objects)

    async def agent() -> None:  # what the targets controller says within a second
        while ("targets", "t", "cluster2") not in source.client.objects:
            await asyncio.sleep(0.01)
        source.client.put("targets", failing_target("Unreachable", "connection refused"))

    lines: list[str] = []
    progress: list[str] = []
    reporting = asyncio.create_task(agent())
    started = asyncio.get_running_loop().time()
    with pytest.raises(ConnectError) as error:
        await join(
            plan,
            source,
            target,
            timeout=30,
            give_up_after=0.5,
            report=lines.append,
            progress=progress.append,
        )
    took = asyncio.get_running_loop().time() - started
    await reporting
    assert took < 5  # not the 30 s timeout
    assert re.match(
        r"Target t/cluster2 in context cluster1 not Ready after \d+\.\ds: Unreachable "
        r"\(connection refused\); the address in the Secret must be reachable",
        str(error.value),
    )
    assert progress == [
        "waiting for Target t/cluster2 to be Ready (at most 30s)",
        "Target t/cluster2: Unreachable (connection refused)",
    ]
    assert lines == [
        "Source t/cluster1 created in cluster2",
        "Secret t/cluster1-token created in cluster2 (the token for t/cluster1)",
        "Secret t/cluster2 created in cluster1 (kubeconfig of t/cluster1)",
        "Target t/cluster2 created in cluster1",
        "Target t/cluster2 deleted in cluster1 (rolled back)",
        "Secret t/cluster2 deleted in cluster1 (rolled back)",
        "Secret t/cluster1-token deleted in cluster2 (rolled back)",
        "Source t/cluster1 deleted in cluster2 (rolled back)",
    ]
    assert (target.client.objects, source.client.objects) == before


async def test_connecting_is_waited_for_until_the_timeout():
    source, target, plan = joining()
    await join(plan, source, target, wait=False, report=lambda _: None)
    source.client.put("targets", failing_target("Connecting", "connecting to the target"))
    with pytest.raises(ConnectError, match=r"not Ready after 1s: Connecting"):
        await join(plan, source, target, timeout=1, give_up_after=0.1, report=lambda _: None)


async def test_a_failed_rejoin_keeps_what_existed_before():
    source, target = await joined_and_ready()
    stored = copy.deepcopy(source.client.objects), copy.deepcopy(target.client.objects)
    source.client.put("targets", failing_target("Unauthorized", "token rejected"))
    lines: list[str] = []
    with pytest.raises(ConnectError, match="Unauthorized"):
        await join(rejoin_plan(), source, target, timeout=5, give_up_after=0.2, report=lines.append)
    assert not any("rolled back" in line for line in lines)
    assert {k for k in source.client.objects} == {k for k in stored[0]}
    assert {k for k in target.client.objects} == {k for k in stored[1]}


async def test_no_rollback_keeps_what_was_made():
    source, target, plan = joining()
    with pytest.raises(ConnectError):
        await join(plan, source, target, timeout=0.2, rollback=False, report=lambda _: None)
    assert ("targets", "t", "cluster2") in source.client.objects
    assert ("sources", "t", "cluster1") in target.client.objects


async def test_a_namespace_missing_in_the_source_is_said_before_anything_is_written():
    source, target = fake_context("cluster1", namespaces=()), fake_context("cluster2")
    stored = copy.deepcopy(target.client.objects)
    with pytest.raises(ConnectError) as error:
        await join(rejoin_plan(), source, target, report=lambda _: None)
    assert str(error.value) == (
        "namespace t not found in context cluster1: create it first (kubectl --context "
        "cluster1 create namespace t) or name another one; nothing was written"
    )
    assert target.client.objects == stored


async def test_a_failure_after_the_source_was_made_deletes_it():
    source, target = fake_context("cluster1"), fake_context("cluster2")  # no agent in cluster2
    lines: list[str] = []
    with pytest.raises(ConnectError, match=r"did not appear in context cluster2 within 0\.2s"):
        await join(rejoin_plan(), source, target, timeout=0.2, report=lines.append)
    assert lines == [
        "Source t/cluster1 created in cluster2",
        "Source t/cluster1 deleted in cluster2 (rolled back)",
    ]
    assert ("sources", "t", "cluster1") not in target.client.objects


async def test_export_names_a_missing_namespace_rather_than_the_account():
    ctx = fake_context("cluster2", namespaces=())
    with pytest.raises(ConnectError) as error:
        await token_secret(ctx, "nosuchns", "c1")
    assert str(error.value).startswith("namespace nosuchns not found in context cluster2")


# -- unjoin -----------------------------------------------------------------------------------


async def unjoin_lines(source: Context, target: Context, **options) -> list[str]:
    lines: list[str] = []
    await unjoin(rejoin_plan(), source, target, timeout=0.3, report=lines.append, **options)
    return lines


async def test_unjoin_dry_run_lists_what_join_made_and_deletes_nothing():
    source, target, plan = joining()
    await join(plan, source, target, wait=False, report=lambda _: None)
    stored = copy.deepcopy(source.client.objects), copy.deepcopy(target.client.objects)
    assert await unjoin_lines(source, target, dry_run=True) == [
        "Target t/cluster2 would be deleted in cluster1",
        "Secret t/cluster2 would be deleted in cluster1",
        "Source t/cluster1 would be deleted in cluster2 (its service account and bindings go "
        "with it)",
        "Secret t/cluster1-token would be deleted in cluster2 (the token export made for "
        "t/cluster1)",
    ]
    assert (source.client.objects, target.client.objects) == stored


async def test_unjoin_deletes_the_target_first_and_waits_for_its_node():
    source, target, plan = joining()
    await join(plan, source, target, wait=False, report=lambda _: None)
    node = {"metadata": {"name": "admiralty-namespace-t-cluster2"}}
    source.client.put("nodes", node)
    with pytest.raises(ConnectError) as error:
        await unjoin_lines(source, target)
    assert str(error.value).startswith(
        "virtual node admiralty-namespace-t-cluster2 is still in context cluster1 0.3s after its "
        "Target t/cluster2 was deleted: is the multicluster-scheduler agent running in the "
        "source? Nothing else was deleted"
    )
    assert source.client.deleted == [("targets", "t", "cluster2")]

    async def agent() -> None:  # deletes the node once its Target is gone
        await asyncio.sleep(0.1)
        source.client.objects.pop(("nodes", None, node["metadata"]["name"]))

    source.client.put("targets", ready_target("2024-01-01T10:00:00Z"))
    source.client.put("nodes", node)
    deleting = asyncio.create_task(agent())
    lines: list[str] = []
    await unjoin(rejoin_plan(), source, target, timeout=5, report=lines.append)
    await deleting
    assert lines == [
        "Target t/cluster2 deleted in cluster1",
        "virtual node admiralty-namespace-t-cluster2 deleted by the agent, with its delegates "
        "and copies",
        "Secret t/cluster2 deleted in cluster1",
        "Source t/cluster1 deleted in cluster2 (its service account and bindings go with it)",
        "Secret t/cluster1-token deleted in cluster2 (the token export made for t/cluster1)",
    ]
    lines = []
    with pytest.raises(ConnectError) as again:
        await unjoin(rejoin_plan(), source, target, timeout=0.3, report=lines.append)
    assert lines == [
        "Target t/cluster2 not found in cluster1",
        "Secret t/cluster2 not found in cluster1",
        "Source t/cluster1 not found in cluster2",
    ]
    assert str(again.value) == (
        "nothing to unjoin: Target t/cluster2 not found, and no Target is in namespace t of "
        "cluster1 (unjoined already?)"
    )


async def test_unjoin_with_names_join_was_not_given_names_the_targets_there():
    source, target, plan = joining()
    await join(plan, source, target, wait=False, report=lambda _: None)
    stored = copy.deepcopy(source.client.objects), copy.deepcopy(target.client.objects)
    wrong = plan_from(
        join_args(
            "--source-context", "cluster1", "--target-context", "cluster2", "-n", "t",
            "--name", "c1", "--target-name", "c2",
        )
    )  # fmt: skip
    with pytest.raises(ConnectError) as error:
        await unjoin(wrong, source, target, timeout=0.3, report=lambda _: None)
    assert str(error.value) == (
        "nothing to unjoin: Target t/c2 not found in cluster1; the Target in namespace t of "
        "cluster1: cluster2. Give the names join was given: --target-name for the Target (and "
        "--name for its Source in the target, if join had one)"
    )
    assert (source.client.objects, target.client.objects) == stored


async def test_unjoin_says_how_many_running_pods_go_back_to_their_owners():
    source, target, plan = joining()
    await join(plan, source, target, wait=False, report=lambda _: None)
    node = "admiralty-namespace-t-cluster2"
    owner = [{"kind": "ReplicaSet", "name": "nginx-1", "controller": True}]
    for name, phase, owners in (("a", "Running", owner), ("b", "Pending", owner),
                                ("c", "Running", []), ("d", "Succeeded", owner)):  # fmt: skip
        source.client.put(
            "pods",
            {
                "metadata": {"name": name, "namespace": "t", "ownerReferences": owners},
                "spec": {"nodeName": node},
                "status": {"phase": phase},
            },
        )
    lines = await unjoin_lines(source, target, dry_run=True)
    assert lines[0] == (
        "3 pods run in target cluster2 (bound to virtual node admiralty-namespace-t-cluster2): "
        "their delegates there would be deleted with the Target, and their owners make new pods, "
        "which go to another target or wait Pending; 1 without an owner is deleted for good"
    )
    assert lines[1] == "Target t/cluster2 would be deleted in cluster1"


async def test_unjoin_leaves_secrets_it_did_not_write_or_that_another_target_uses():
    source, target, plan = joining()
    await join(plan, source, target, wait=False, report=lambda _: None)
    other = copy.deepcopy(source.client.objects[("targets", "t", "cluster2")])
    other["metadata"] = {"name": "again", "namespace": "t"}
    source.client.put("targets", other)
    lines = await unjoin_lines(source, target, dry_run=True)
    assert "Secret t/cluster2 kept in cluster1: Target again uses it too" in lines
    assert "Secret t/cluster2 would be deleted in cluster1" not in lines

    mine = {**SECRET, "metadata": {"name": "cluster2", "namespace": "t"}}
    mine["data"] = {"password": b64("hunter2")}
    source.client.put("secrets", mine)
    lines = await unjoin_lines(source, target, dry_run=True)
    assert (
        "Secret t/cluster2 kept in cluster1: join or export did not write it (it holds password)"
    ) in lines


async def test_unjoin_leaves_a_secret_that_a_target_of_the_other_kind_uses():
    """A ClusterTarget may name the Secret of a namespace's Target (and a namespace's Target the
    Secret a cluster-scoped join wrote there): it is still used, and kept."""
    source, target, plan = joining()
    await join(plan, source, target, wait=False, report=lambda _: None)
    cluster_target = {
        "metadata": {"name": "shared"},
        "spec": {"kubeconfigSecret": {"name": "cluster2", "namespace": "t"}},
    }
    source.client.put("clustertargets", cluster_target)
    lines = await unjoin_lines(source, target, dry_run=True)
    assert "Secret t/cluster2 kept in cluster1: ClusterTarget shared uses it too" in lines
    assert "Secret t/cluster2 would be deleted in cluster1" not in lines


async def test_unjoin_of_an_unreachable_target_still_disconnects_the_source():
    source, target, plan = joining()
    await join(plan, source, target, wait=False, report=lambda _: None)

    async def down(*_, **__):
        raise unreachable(ConnectionRefusedError("refused"))

    target.client.get = down  # type: ignore[method-assign]
    target.client.list = down  # type: ignore[method-assign]
    with pytest.raises(ConnectError) as error:
        await unjoin(rejoin_plan(), source, target, wait=False, report=lambda _: None)
    assert "does not answer" in str(error.value)
    assert str(error.value).endswith(
        "; the source side is disconnected, but the Source and token of t/cluster1 may be left "
        "in context cluster2: run unjoin again once it answers"
    )
    assert source.client.deleted == [("targets", "t", "cluster2"), ("secrets", "t", "cluster2")]
