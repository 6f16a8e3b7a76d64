"""Clusters connected from the command line: ``multicluster-scheduler export`` piped into kubectl,
and ``multicluster-scheduler join`` in one command (namespaced, to itself, cluster-scoped),
idempotent, and failing with messages that say what to fix."""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

import pytest
import yaml

from e2e.scenarios import (
    cli,
    delegates,
    disconnect,
    grant_source,
    join,
    nginx,
    nothing_left,
    proxies,
    running_and_ready,
)
from testbed import TestBed, wait_for
from testbed.bed import free_ports
from testbed.install import NAMESPACE as RELEASE_NAMESPACE
from testbed.install import Installation
from testbed.kubectl import Kubectl

SOURCE, TARGET = "cluster1", "cluster2"
ROOT = Path(__file__).resolve().parents[1]


def ready_condition(kubectl: Kubectl, name: str, namespace: str) -> dict:
    target = kubectl.json(SOURCE, "get", "target", name, "-n", namespace)
    return next(c for c in target["status"]["conditions"] if c["type"] == "Ready")


def ready(kubectl: Kubectl, kind: str, name: str, namespace: str | None = None) -> str | None:
    where = ("-n", namespace) if namespace else ()
    proc = kubectl.run(SOURCE, "get", kind, name, *where, "-o", "json", check=False)
    if proc.returncode != 0:
        return None
    for condition in json.loads(proc.stdout).get("status", {}).get("conditions") or ():
        if condition["type"] == "Ready":
            return f"{condition['status']}/{condition['reason']}"
    return None


def kubeconfig_in(kubectl: Kubectl, name: str, namespace: str) -> dict:
    secret = kubectl.json(SOURCE, "get", "secret", name, "-n", namespace)
    return yaml.safe_load(base64.b64decode(secret["data"]["config"]))


def versions(kubectl: Kubectl, objects: list[tuple[str, str, str, str | None]]) -> dict:
    """resourceVersion of each (context, kind, name, namespace)."""
    found = {}
    for context, kind, name, namespace in objects:
        where = ("-n", namespace) if namespace else ()
        obj = kubectl.json(context, "get", kind, name, *where)
        found[(context, kind, name)] = obj["metadata"]["resourceVersion"]
    return found


@pytest.fixture
def hand_made_account(installation: Installation, kubectl: Kubectl, namespace: str):
    """The guide's service account c1 and its bindings in cluster2, made by hand."""
    grant_source(kubectl, namespace)
    yield namespace
    disconnect(kubectl, namespace)


def test_export_of_a_hand_made_account_makes_a_ready_target(
    hand_made_account: str, testbed: TestBed, kubectl: Kubectl
):
    namespace = hand_made_account
    exported = cli(
        testbed.kubeconfig, "export", "--context", TARGET, "-n", namespace, "c1", "--as", "c2"
    )
    assert exported.returncode == 0, exported.stderr
    assert "namespace" not in yaml.safe_load(exported.stdout)["metadata"]
    assert "created" in kubectl(SOURCE, "-n", namespace, "apply", "-f", "-", stdin=exported.stdout)

    config = kubeconfig_in(kubectl, "c2", namespace)
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == testbed[TARGET].server
    assert base64.b64decode(cluster["certificate-authority-data"]) == testbed[TARGET].ca.cert_pem
    token_secret = kubectl.json(TARGET, "get", "secret", "c1-token", "-n", namespace)
    assert token_secret["type"] == "kubernetes.io/service-account-token"
    assert token_secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == "c1"
    assert (
        config["users"][0]["user"]["token"]
        == base64.b64decode(token_secret["data"]["token"]).decode()
    )

    started = time.monotonic()
    kubectl.apply(
        SOURCE,
        {
            "apiVersion": "multicluster.admiralty.io/v1alpha1",
            "kind": "Target",
            "metadata": {"name": "c2", "namespace": namespace},
            "spec": {"kubeconfigSecret": {"name": "c2"}},
        },
    )
    wait_for(lambda: ready(kubectl, "target", "c2", namespace) == "True/Ready", 30, what="c2 Ready")
    print(f"Target Ready {time.monotonic() - started:.1f}s after it was applied")

    again = cli(
        testbed.kubeconfig, "export", "--context", TARGET, "-n", namespace, "c1", "--as", "c2"
    )
    assert again.stdout == exported.stdout  # the same token Secret, reused
    tokens = kubectl.json(
        TARGET,
        "get",
        "secrets",
        "-n",
        namespace,
        "--field-selector",
        "type=kubernetes.io/service-account-token",
    )["items"]
    assert [s["metadata"]["name"] for s in tokens] == ["c1-token"]


def test_export_overrides_land_in_the_kubeconfig_and_work(
    hand_made_account: str, testbed: TestBed, kubectl: Kubectl, tmp_path: Path
):
    """An address as the source's agent sees it (here localhost, in the server certificate) and
    the CA as a file: the kind/minikube/k3d case."""
    namespace = hand_made_account
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(testbed[TARGET].ca.cert_pem)
    server = testbed[TARGET].server.replace("127.0.0.1", "localhost")
    exported = cli(
        testbed.kubeconfig,
        "export",
        "--context",
        TARGET,
        "-n",
        namespace,
        "c1",
        "--as",
        "c2",
        "--server",
        server,
        "--ca-file",
        str(ca_file),
        "--key",
        "kubeconfig",
    )
    assert exported.returncode == 0, exported.stderr
    kubectl(SOURCE, "-n", namespace, "apply", "-f", "-", stdin=exported.stdout)
    secret = kubectl.json(SOURCE, "get", "secret", "c2", "-n", namespace)
    config = yaml.safe_load(base64.b64decode(secret["data"]["kubeconfig"]))
    cluster = config["clusters"][0]["cluster"]
    assert cluster["server"] == server
    assert base64.b64decode(cluster["certificate-authority-data"]) == ca_file.read_bytes()
    kubectl.apply(
        SOURCE,
        {
            "apiVersion": "multicluster.admiralty.io/v1alpha1",
            "kind": "Target",
            "metadata": {"name": "c2", "namespace": namespace},
            "spec": {"kubeconfigSecret": {"name": "c2", "key": "kubeconfig"}},
        },
    )
    wait_for(lambda: ready(kubectl, "target", "c2", namespace) == "True/Ready", 30, what="c2 Ready")

    # A CA that did not sign the server's certificate is really used: the target is unreachable.
    wrong = tmp_path / "wrong.crt"
    wrong.write_bytes(testbed[SOURCE].ca.cert_pem)
    exported = cli(
        testbed.kubeconfig,
        "export",
        "--context",
        TARGET,
        "-n",
        namespace,
        "c1",
        "--as",
        "c2",
        "--ca-file",
        str(wrong),
        "--key",
        "kubeconfig",
    )
    kubectl(SOURCE, "-n", namespace, "apply", "-f", "-", stdin=exported.stdout)
    wait_for(
        lambda: ready(kubectl, "target", "c2", namespace) == "False/Unreachable",
        30,
        what="c2 Unreachable with the wrong CA",
    )


def test_export_of_a_missing_service_account_says_what_to_do(
    installation: Installation, testbed: TestBed, namespace: str
):
    proc = cli(
        testbed.kubeconfig, "export", "--context", TARGET, "-n", namespace, "ghost", "--as", "c2"
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        f"error: service account {namespace}/ghost not found in context {TARGET}: create a "
        f"Source for it (the agent makes it) or create it yourself\n"
    )


def test_join_connects_cluster1_to_cluster2_in_one_command(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    started = time.monotonic()
    proc = join(testbed, "-n", namespace)
    took = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr
    node = f"admiralty-namespace-{namespace}-{TARGET}"
    assert proc.stdout.splitlines() == [
        f"Source {namespace}/{SOURCE} created in {TARGET}",
        f"Secret {namespace}/{SOURCE}-token created in {TARGET} (the token for "
        f"{namespace}/{SOURCE})",
        f"Secret {namespace}/{TARGET} created in {SOURCE} (kubeconfig of {namespace}/{SOURCE})",
        f"Target {namespace}/{TARGET} created in {SOURCE}",
        f"Target {namespace}/{TARGET} Ready: virtual node {node}",
    ]
    assert f"waiting for Target {namespace}/{TARGET} to be Ready" in proc.stderr
    print(f"join took {took:.1f}s")

    source = kubectl.json(TARGET, "get", "source", SOURCE, "-n", namespace)
    assert source["spec"] == {"serviceAccountName": SOURCE}
    kubectl(TARGET, "get", "serviceaccount", SOURCE, "-n", namespace)
    target = kubectl.json(SOURCE, "get", "target", TARGET, "-n", namespace)
    assert target["spec"] == {"kubeconfigSecret": {"name": TARGET, "key": "config"}}
    assert ready(kubectl, "target", TARGET, namespace) == "True/Ready"
    assert kubectl.json(SOURCE, "get", "node", node)["metadata"]["name"] == node

    objects = [
        (TARGET, "source", SOURCE, namespace),
        (SOURCE, "secret", TARGET, namespace),
        (SOURCE, "target", TARGET, namespace),
    ]
    before = versions(kubectl, objects)
    again = join(testbed, "-n", namespace)
    assert again.returncode == 0, again.stderr
    assert [line.split(" in ")[0].rsplit(" ", 1)[1] for line in again.stdout.splitlines()[:3]] == [
        "unchanged"
    ] * 3
    assert versions(kubectl, objects) == before

    # Another address for the same target (its certificate is valid for localhost too): only
    # the Secret changes, and join says Ready only once the agent has reconnected with it.
    ready_since = ready_condition(kubectl, TARGET, namespace)["lastTransitionTime"]
    server = testbed[TARGET].server.replace("127.0.0.1", "localhost")
    moved = join(testbed, "-n", namespace, "--server", server)
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.splitlines() == [
        f"Source {namespace}/{SOURCE} unchanged in {TARGET}",
        f"Secret {namespace}/{TARGET} configured in {SOURCE} (kubeconfig of {namespace}/{SOURCE})",
        f"Target {namespace}/{TARGET} unchanged in {SOURCE}",
        f"Target {namespace}/{TARGET} Ready: virtual node {node}",
    ]
    assert kubeconfig_in(kubectl, TARGET, namespace)["clusters"][0]["cluster"]["server"] == server
    condition = ready_condition(kubectl, TARGET, namespace)
    assert condition["status"] == "True"
    assert condition["lastTransitionTime"] != ready_since  # reconnected: Connecting, then Ready

    # The guide's Deployment: every replica runs in cluster2.
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    kubectl.apply(SOURCE, nginx(), "-n", namespace)
    try:

        def all_delegated() -> bool:
            found = proxies(kubectl, namespace)
            remote = delegates(kubectl, TARGET, namespace)
            return (
                len(found) == 10
                and all(running_and_ready(p) for p in found)
                and len(remote) == 10
                and all(d["status"].get("phase") == "Running" for d in remote)
            )

        started = time.monotonic()
        wait_for(all_delegated, 90, what="10 proxies Running, delegates Running in cluster2")
        print(f"10 delegates Running in cluster2 {time.monotonic() - started:.1f}s after apply")
        assert {p["spec"]["nodeName"] for p in proxies(kubectl, namespace)} == {node}
    finally:
        kubectl(SOURCE, "delete", "deployment", "nginx", "-n", namespace, "--wait=false")
        wait_for(lambda: nothing_left(kubectl, namespace), 60, what="proxies and delegates gone")


def test_join_of_a_context_to_itself_makes_a_self_target(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    proc = cli(
        testbed.kubeconfig,
        "join",
        "--source-context",
        SOURCE,
        "--target-context",
        SOURCE,
        "-n",
        namespace,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        f"Target {namespace}/{SOURCE} created in {SOURCE}",
        f"Target {namespace}/{SOURCE} Ready: virtual node admiralty-namespace-{namespace}-{SOURCE}",
    ]
    assert kubectl.json(SOURCE, "get", "target", SOURCE, "-n", namespace)["spec"] == {"self": True}


def test_join_of_two_contexts_of_one_cluster_makes_a_self_target(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
):
    config = json.loads(testbed.kubeconfig.read_text())
    context = next(c for c in config["contexts"] if c["name"] == SOURCE)["context"]
    config["contexts"].append({"name": "alias", "context": {**context, "namespace": namespace}})
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    proc = cli(
        path, "join", "--source-context", SOURCE, "--target-context", "alias", "-n", namespace
    )
    assert proc.returncode == 0, proc.stderr
    uid = kubectl.json(SOURCE, "get", "namespace", "kube-system")["metadata"]["uid"]
    assert proc.stdout.splitlines() == [
        f"contexts {SOURCE} and alias reach the same cluster (kube-system namespace uid {uid}): "
        f"making a self Target",
        f"Target {namespace}/alias created in {SOURCE}",
        f"Target {namespace}/alias Ready: virtual node admiralty-namespace-{namespace}-alias",
    ]
    assert kubectl.json(SOURCE, "get", "target", "alias", "-n", namespace)["spec"] == {"self": True}
    # Nothing exchanged: no Source, no kubeconfig Secret.
    assert kubectl.json(SOURCE, "get", "sources", "-n", namespace)["items"] == []
    secrets = kubectl.json(SOURCE, "get", "secrets", "-n", namespace)["items"]
    assert [s["metadata"]["name"] for s in secrets if s["type"] == "Opaque"] == []


def test_join_does_not_overwrite_an_unrelated_secret(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    kubectl(
        SOURCE, "create", "secret", "generic", TARGET, "-n", namespace, "--from-literal=password=x"
    )
    before = kubectl.json(SOURCE, "get", "secret", TARGET, "-n", namespace)
    proc = join(testbed, "-n", namespace)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        f"error: Secret {namespace}/{TARGET} already exists in context {SOURCE} and was not "
        f"written by join or export (it holds password); join would overwrite it: name the "
        f"Target and its Secret otherwise with --target-name, or delete that Secret if it is a "
        f"leftover\n"
    )
    assert kubectl.json(SOURCE, "get", "secret", TARGET, "-n", namespace) == before
    assert kubectl.json(TARGET, "get", "sources", "-n", namespace)["items"] == []


def test_cluster_scoped_join(installation: Installation, testbed: TestBed, kubectl: Kubectl):
    proc = join(testbed, "--cluster-scoped", "--name", "c1", "--target-name", "c2")
    try:
        assert proc.returncode == 0, proc.stderr
        assert (
            proc.stdout.splitlines()[-1]
            == "ClusterTarget c2 Ready: virtual node admiralty-cluster-c2"
        )
        source = kubectl.json(TARGET, "get", "clustersource", "c1")
        assert source["spec"] == {"serviceAccount": {"name": "c1", "namespace": RELEASE_NAMESPACE}}
        target = kubectl.json(SOURCE, "get", "clustertarget", "c2")
        assert target["spec"] == {
            "kubeconfigSecret": {"name": "c2", "namespace": RELEASE_NAMESPACE, "key": "config"}
        }
        assert (
            kubeconfig_in(kubectl, "c2", RELEASE_NAMESPACE)["contexts"][0]["context"]["user"]
            == f"{RELEASE_NAMESPACE}/c1"
        )
        again = join(testbed, "--cluster-scoped", "--name", "c1", "--target-name", "c2")
        assert again.returncode == 0, again.stderr
        assert "created" not in again.stdout
        assert "configured" not in again.stdout
    finally:
        kubectl(SOURCE, "delete", "clustertarget", "c2", "--ignore-not-found", "--wait=false")
        kubectl(SOURCE, "delete", "secret", "c2", "-n", RELEASE_NAMESPACE, "--ignore-not-found")
        kubectl(TARGET, "delete", "clustersource", "c1", "--ignore-not-found", "--wait=false")
        kubectl(
            TARGET, "delete", "secret", "c1-token", "-n", RELEASE_NAMESPACE, "--ignore-not-found"
        )


@pytest.fixture
def restricted_kubeconfig(testbed: TestBed, kubectl: Kubectl, namespace: str, tmp_path: Path):
    """The test bed's kubeconfig plus ``nobody@cluster2`` (a service account without rights)
    and ``down`` (an address where nothing listens)."""
    kubectl(TARGET, "create", "serviceaccount", "nobody", "-n", namespace)
    token = kubectl(TARGET, "create", "token", "nobody", "-n", namespace).strip()
    config = json.loads(testbed.kubeconfig.read_text())
    cluster2 = next(c for c in config["clusters"] if c["name"] == TARGET)
    config["clusters"].append(
        {
            "name": "down",
            "cluster": {**cluster2["cluster"], "server": f"https://127.0.0.1:{free_ports(1)[0]}"},
        }
    )
    config["users"].append({"name": "nobody", "user": {"token": token}})
    config["contexts"] += [
        {"name": "nobody@cluster2", "context": {"cluster": TARGET, "user": "nobody"}},
        {"name": "down", "context": {"cluster": "down", "user": TARGET}},
    ]
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return path


def test_join_without_permission_explains_the_403(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    restricted_kubeconfig: Path,
):
    proc = cli(
        restricted_kubeconfig,
        "join",
        "--source-context",
        SOURCE,
        "--target-context",
        "nobody@cluster2",
        "--target-name",
        "c2",
        "-n",
        namespace,
    )
    assert proc.returncode == 1
    error = proc.stderr
    assert error.startswith(
        f"error: cannot read Source {namespace}/{SOURCE}: context nobody@cluster2"
    )
    assert "does not allow it (403 Forbidden)" in error
    assert f'User "system:serviceaccount:{namespace}:nobody" cannot get resource "sources"' in error
    assert "ask an admin of that cluster" in error
    # Nothing was written in the source.
    assert (
        kubectl.json(
            SOURCE,
            "get",
            "targets,secrets",
            "-n",
            namespace,
            "--field-selector",
            "metadata.name=c2",
        )["items"]
        == []
    )

    proc = cli(
        restricted_kubeconfig,
        "join",
        "--source-context",
        SOURCE,
        "--target-context",
        "down",
        "-n",
        namespace,
    )
    assert proc.returncode == 1
    server = next(
        c["cluster"]["server"]
        for c in json.loads(restricted_kubeconfig.read_text())["clusters"]
        if c["name"] == "down"
    )
    assert f"the API server of context down ({server}) does not answer" in proc.stderr


def test_export_of_a_missing_namespace_names_it(installation: Installation, testbed: TestBed):
    proc = cli(
        testbed.kubeconfig, "export", "--context", TARGET, "-n", "nosuchns", "c1", "--as", "c2"
    )
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: namespace nosuchns not found in context {TARGET}")


def joined_objects(kubectl: Kubectl, namespace: str) -> dict[str, list[str]]:
    """What join makes, where it is still found."""

    def names(context: str, kind: str, *selector: str) -> list[str]:
        listed = kubectl.json(context, "get", kind, "-n", namespace, *selector)["items"]
        return sorted(o["metadata"]["name"] for o in listed)

    return {
        "targets": names(SOURCE, "targets"),
        "kubeconfig secrets": names(SOURCE, "secrets", "--field-selector", "type=Opaque"),
        "sources": names(TARGET, "sources"),
        "token secrets": names(
            TARGET, "secrets", "--field-selector", "type=kubernetes.io/service-account-token"
        ),
    }


NOTHING_JOINED = {"targets": [], "kubeconfig secrets": [], "sources": [], "token secrets": []}


def test_join_to_an_address_nobody_answers_fails_early_and_leaves_nothing(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    started = time.monotonic()
    closed = f"https://127.0.0.1:{free_ports(1)[0]}"
    proc = join(testbed, "-n", namespace, "--server", closed, "--timeout", "90")
    took = time.monotonic() - started
    assert proc.returncode == 1
    print(f"join failed after {took:.1f}s (timeout 90s)")
    assert took < 45, "given up on once the Target kept saying Unreachable, not at the timeout"
    assert f"Target {namespace}/{TARGET}: Unreachable (" in proc.stderr  # progress, as it came
    assert proc.stderr.splitlines()[-1].startswith(
        f"error: Target {namespace}/{TARGET} in context {SOURCE} not Ready after "
    )
    assert "Unreachable" in proc.stderr.splitlines()[-1]
    assert proc.stdout.splitlines()[-4:] == [
        f"Target {namespace}/{TARGET} deleted in {SOURCE} (rolled back)",
        f"Secret {namespace}/{TARGET} deleted in {SOURCE} (rolled back)",
        f"Secret {namespace}/{SOURCE}-token deleted in {TARGET} (rolled back)",
        f"Source {namespace}/{SOURCE} deleted in {TARGET} (rolled back)",
    ]
    assert joined_objects(kubectl, namespace) == NOTHING_JOINED


def test_join_in_a_namespace_the_source_lacks_writes_nothing(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    missing = f"{namespace}x"  # in neither cluster
    proc = join(testbed, "-n", missing)
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert proc.stderr == (
        f"error: namespace {missing} not found in context {SOURCE}: create it first (kubectl "
        f"--context {SOURCE} create namespace {missing}) or name another one; nothing was "
        f"written\n"
    )
    assert kubectl.json(TARGET, "get", "sources", "-n", missing)["items"] == []


def unjoin(testbed: TestBed, *args: str):
    return cli(
        testbed.kubeconfig,
        "unjoin",
        "--source-context",
        SOURCE,
        "--target-context",
        TARGET,
        *args,
    )


def test_unjoin_removes_what_join_made_and_its_delegates(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    assert join(testbed, "-n", namespace).returncode == 0
    node = f"admiralty-namespace-{namespace}-{TARGET}"
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    kubectl.apply(SOURCE, nginx(replicas=3), "-n", namespace)
    try:
        wait_for(
            lambda: len(delegates(kubectl, TARGET, namespace)) == 3,
            90,
            what="3 delegates in cluster2",
        )
        joined = joined_objects(kubectl, namespace)
        assert joined == {
            "targets": [TARGET],
            "kubeconfig secrets": [TARGET],
            "sources": [SOURCE],
            "token secrets": [f"{SOURCE}-token"],
        }

        dry = unjoin(testbed, "-n", namespace, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        running = (
            f"3 pods run in target {TARGET} (bound to virtual node {node}): their delegates there "
            "{} deleted with the Target, and their owners make new pods, which go to another "
            "target or wait Pending"
        )
        assert dry.stdout.splitlines() == [
            running.format("would be"),
            f"Target {namespace}/{TARGET} would be deleted in {SOURCE}",
            f"Secret {namespace}/{TARGET} would be deleted in {SOURCE}",
            f"Source {namespace}/{SOURCE} would be deleted in {TARGET} (its service account and "
            f"bindings go with it)",
            f"Secret {namespace}/{SOURCE}-token would be deleted in {TARGET} (the token export "
            f"made for {namespace}/{SOURCE})",
        ]
        assert joined_objects(kubectl, namespace) == joined
        assert len(delegates(kubectl, TARGET, namespace)) == 3

        started = time.monotonic()
        proc = unjoin(testbed, "-n", namespace)
        print(f"unjoin took {time.monotonic() - started:.1f}s")
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.splitlines() == [
            running.format("are"),
            f"Target {namespace}/{TARGET} deleted in {SOURCE}",
            f"virtual node {node} deleted by the agent, with its delegates and copies",
            f"Secret {namespace}/{TARGET} deleted in {SOURCE}",
            f"Source {namespace}/{SOURCE} deleted in {TARGET} (its service account and "
            f"bindings go with it)",
            f"Secret {namespace}/{SOURCE}-token deleted in {TARGET} (the token export made for "
            f"{namespace}/{SOURCE})",
        ]
        # The agent deleted the delegates before its credentials went.
        assert delegates(kubectl, TARGET, namespace) == []
        assert kubectl.run(SOURCE, "get", "node", node, check=False).returncode != 0
        wait_for(
            lambda: joined_objects(kubectl, namespace) == NOTHING_JOINED,
            30,
            what="nothing join made left",
        )
        wait_for(
            lambda: (
                kubectl.run(
                    TARGET, "get", "serviceaccount", SOURCE, "-n", namespace, check=False
                ).returncode
                != 0
            ),
            30,
            what="the Source's service account gone with it",
        )

        again = unjoin(testbed, "-n", namespace)
        assert again.returncode == 1
        assert again.stdout.splitlines() == [
            f"Target {namespace}/{TARGET} not found in {SOURCE}",
            f"Secret {namespace}/{TARGET} not found in {SOURCE}",
            f"Source {namespace}/{SOURCE} not found in {TARGET}",
        ]
        assert again.stderr == (
            f"error: nothing to unjoin: Target {namespace}/{TARGET} not found, and no Target is "
            f"in namespace {namespace} of {SOURCE} (unjoined already?)\n"
        )
    finally:
        kubectl(SOURCE, "delete", "deployment", "nginx", "-n", namespace, "--wait=false")
        wait_for(lambda: nothing_left(kubectl, namespace), 60, what="proxies and delegates gone")


def test_unjoin_with_other_names_than_joins_names_the_targets_and_deletes_nothing(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    joined = join(testbed, "-n", namespace, "--name", "c1", "--target-name", "c2", "--no-wait")
    assert joined.returncode == 0, joined.stderr
    before = joined_objects(kubectl, namespace)
    proc = unjoin(testbed, "-n", namespace)  # the names derived from the contexts
    assert proc.returncode == 1
    assert proc.stderr == (
        f"error: nothing to unjoin: Target {namespace}/{TARGET} not found in {SOURCE}; the Target "
        f"in namespace {namespace} of {SOURCE}: c2. Give the names join was given: --target-name "
        "for the Target (and --name for its Source in the target, if join had one)\n"
    )
    assert joined_objects(kubectl, namespace) == before
    done = unjoin(testbed, "-n", namespace, "--name", "c1", "--target-name", "c2")
    assert done.returncode == 0, done.stderr


def test_unjoin_keeps_a_secret_join_did_not_write(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    grant = join(testbed, "-n", namespace, "--no-wait")
    assert grant.returncode == 0, grant.stderr
    # The Target now uses a Secret of the user's, which unjoin must leave alone.
    kubectl(
        SOURCE, "create", "secret", "generic", "mine", "-n", namespace, "--from-literal=password=x"
    )
    kubectl(
        SOURCE,
        "patch",
        "target",
        TARGET,
        "-n",
        namespace,
        "--type=merge",
        "-p",
        '{"spec": {"kubeconfigSecret": {"name": "mine"}}}',
    )
    proc = unjoin(testbed, "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"Secret {namespace}/mine kept in {SOURCE}: join or export did not write it (it holds "
        f"password)"
    ) in proc.stdout.splitlines()
    kubectl(SOURCE, "get", "secret", "mine", "-n", namespace)
    assert kubectl.json(TARGET, "get", "sources", "-n", namespace)["items"] == []
