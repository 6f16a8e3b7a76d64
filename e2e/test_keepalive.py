"""Delegates kept alive while their source is away, on the word of that source only.

Upstream's own scenario first (Admiralty v0.17's ``test/e2e/delete-delegate``: a pod scheduled,
the source's agents stopped at once, its delegate deleted in the target: it comes back; here,
deleted again while the source is still away, it does not). Then attacks, as someone would try
them who may edit one namespace of the target (``kubectl --as``, bound to Kubernetes' own
``edit`` role): a heartbeat of their own for a cluster that does not exist (a Lease, as the
previous release read them, and one of ours) and a privileged pod shaped like its delegate, kept
alive after they lost their access; a pod shaped like the delegate of a real, connected source
whose heartbeat is there; a real delegate whose Source the target's admin deleted. Last, the
upgrade: the previous release's heartbeat Lease is deleted by a source of this one.

A source's agents are stopped as a lost node stops them (SIGKILL, kept down); a deletion is
given :data:`AWAY` seconds plus the keeper's period and a margin to be undone.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.scenarios import SOURCE, TARGET, join, kubeconfig_for
from multicluster_scheduler.api.keepalive import (
    AWAY,
    LEGACY_HEARTBEAT_LABEL,
    RECREATED,
    heartbeat_name,
)
from multicluster_scheduler.api.keys import PREFIX
from multicluster_scheduler.api.proxy import delegate_name
from multicluster_scheduler.targets.keeper import LOOK_EVERY
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

GROUP = "multicluster.admiralty.io/v1alpha1"
ENABLED = "multicluster-scheduler=enabled"
UNDONE_WITHIN = AWAY + 3 * LOOK_EVERY + 15  # a deletion the keeper would undo is undone by then
BACK_WITHIN = 150  # upstream's test allows 120 s


# -- the clusters ---------------------------------------------------------------------------------


@pytest.fixture
def joined(installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str):
    """cluster1 joined to cluster2 in ``namespace`` (a Source there, made by ``join``; Target
    cluster2, the only one), enabled for elected pods."""
    proc = join(testbed, "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    kubectl(SOURCE, "label", "namespace", namespace, ENABLED)
    yield namespace
    kubectl(SOURCE, "delete", "pods,deployments", "--all", "-n", namespace, "--wait=false")


class Agents:
    """cluster1's agents: stopped as a lost node stops them (killed, kept down), and back."""

    def __init__(self, installation: Installation) -> None:
        self.installation = installation
        self.held: list = []

    def away(self) -> None:
        for agent in self.installation.agents[SOURCE]:
            self.installation.hold(agent)
            self.held.append(agent)

    def back(self) -> None:
        while self.held:
            self.installation.release(self.held.pop())


@pytest.fixture
def source(installation: Installation) -> Iterator[Agents]:
    agents = Agents(installation)
    yield agents
    agents.back()


def cluster_name(kubectl: Kubectl, context: str = SOURCE) -> str:
    return kubectl.json(context, "get", "namespace", "kube-system")["metadata"]["uid"]


def elected(name: str) -> dict:
    """Upstream's delete-delegate pod (``restartPolicy`` Always, as every bare pod)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app": "delete-delegate"},
            "annotations": {PREFIX + "elect": ""},
        },
        "spec": {"containers": [{"name": "pause", "image": "gcr.io/google_containers/pause"}]},
    }


def scheduled(kubectl: Kubectl, namespace: str, name: str) -> None:
    kubectl(
        SOURCE, "wait", "pod", name, "-n", namespace, "--for=condition=PodScheduled",
        "--timeout=60s",
    )  # fmt: skip


def delegate_of(kubectl: Kubectl, namespace: str, proxy: str) -> dict:
    uid = kubectl.json(SOURCE, "get", "pod", proxy, "-n", namespace)["metadata"]["uid"]
    (found,) = kubectl.json(
        TARGET, "get", "pods", "-n", namespace, "-l", f"{PREFIX}parent-uid={uid}"
    )["items"]
    return found


def pod(kubectl: Kubectl, namespace: str, name: str) -> dict | None:
    found = kubectl(TARGET, "get", "pod", name, "-n", namespace, "--ignore-not-found", "-o", "json")
    return json.loads(found) if found else None


def back(kubectl: Kubectl, namespace: str, name: str, old_uid: str) -> dict | None:
    """The pod ``name`` again, with another uid than ``old_uid``."""
    found = pod(kubectl, namespace, name)
    return found if found and found["metadata"]["uid"] != old_uid else None


def delete(kubectl: Kubectl, namespace: str, name: str, *who: str) -> None:
    kubectl(TARGET, "delete", "pod", name, "-n", namespace, "--wait=false", *who)


def stays_gone(kubectl: Kubectl, namespace: str, *names: str) -> None:
    """None of ``names`` is made again while the keeper would have made it."""
    deadline = time.monotonic() + UNDONE_WITHIN
    while time.monotonic() < deadline:
        for name in names:
            found = pod(kubectl, namespace, name)
            alive = found and not found["metadata"].get("deletionTimestamp")
            assert not alive, f"{name} was created again"
        time.sleep(2)


def refusal(kubectl: Kubectl, namespace: str, name: str) -> str:
    """The message of the keeper's NotRecreated event about ``name``."""

    def said() -> str | None:
        found = kubectl.json(
            TARGET, "get", "events", "-n", namespace, "--field-selector",
            f"reason=NotRecreated,involvedObject.name={name}",
        )["items"]  # fmt: skip
        return found[0]["message"] if found else None

    return wait_for(said, 30, what=f"why {name} is not created again")


def listed(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    """What cluster1's heartbeat in cluster2 lists (nothing when there is none)."""
    found = kubectl(
        TARGET, "get", "sourceheartbeats", heartbeat_name(cluster_name(kubectl)), "-n", namespace,
        "--ignore-not-found", "-o", "json",
    )  # fmt: skip
    return (json.loads(found)["spec"].get("delegates") or {}) if found else {}


def grant(kubectl: Kubectl, user: str, role: str, namespace: str) -> None:
    kubectl(
        TARGET, "create", "rolebinding", f"{user}-{role}", f"--clusterrole={role}",
        f"--user={user}", "-n", namespace,
    )  # fmt: skip


def shaped_like_a_delegate(namespace: str, source: str, **spec: object) -> dict:
    """A pod named and annotated as ``source`` names its delegates, for a proxy pod that does
    not exist; it asks for the node's root filesystem, privileged."""
    parent, parent_uid = "web-0", str(uuid.uuid4())
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": delegate_name(parent, parent_uid),
            "namespace": namespace,
            "labels": {PREFIX + "parent-uid": parent_uid},
            "annotations": {
                PREFIX + "parent-name": parent,
                PREFIX + "parent-namespace": namespace,
                PREFIX + "parent-cluster-name": source,
            },
        },
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "securityContext": {"privileged": True},
                    "volumeMounts": [{"name": "host", "mountPath": "/host"}],
                }
            ],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}],
            **spec,
        },
    }


# -- upstream's scenario ------------------------------------------------------------------------


def test_a_delegate_deleted_while_its_source_is_away_comes_back_once(
    joined: str, kubectl: Kubectl, source: Agents
):
    """Upstream's delete-delegate test, run as it runs: the pods scheduled, the source's agents
    stopped at once (no time for a periodic heartbeat: it is written with the first delegate),
    the delegates deleted in the target. They come back as they were, once: deleted again while
    their source is still away, they are not. When the source is back, the pod whose delegate
    came back runs on, the other is deleted (``DelegateLost``), as upstream's test expects."""
    namespace = joined
    names = ("kept", "lost")
    for name in names:
        kubectl.apply(SOURCE, elected(name), "-n", namespace)
    for name in names:
        scheduled(kubectl, namespace, name)
    source.away()
    delegates = {name: delegate_of(kubectl, namespace, name)["metadata"] for name in names}
    deleted = time.monotonic()
    for meta in delegates.values():
        delete(kubectl, namespace, meta["name"])
    again = {
        name: wait_for(
            lambda m=meta: back(kubectl, namespace, m["name"], m["uid"]),
            BACK_WITHIN,
            interval=1,
            what=f"{name}'s delegate created again",
        )
        for name, meta in delegates.items()
    }
    took = time.monotonic() - deleted
    print(f"delegates created again {took:.1f} s after they were deleted")
    assert took <= 120, "upstream's bar: two minutes"
    for name, made in again.items():
        assert RECREATED in made["metadata"]["annotations"]
        assert made["metadata"]["labels"] == delegates[name]["labels"]
        assert made["spec"]["containers"][0]["image"] == "gcr.io/google_containers/pause"
    events = kubectl.json(
        TARGET, "get", "events", "-n", namespace, "--field-selector",
        "reason=RecreatedWhileSourceAway",
    )["items"]  # fmt: skip
    assert len(events) == 2

    # Deleted again, the source still away: a pod the keeper made is not one the source made.
    lost = delegates["lost"]["name"]
    wait_for(lambda: (pod(kubectl, namespace, lost) or {}).get("spec", {}).get("nodeName"), 30)
    delete(kubectl, namespace, lost)
    stays_gone(kubectl, namespace, lost)
    assert "does not list it" in refusal(kubectl, namespace, lost)

    # The source is back: "kept" mirrors its new delegate; "lost" is deleted, as upstream's.
    source.back()
    kubectl(SOURCE, "wait", "pod", "lost", "-n", namespace, "--for=delete", "--timeout=90s")
    wait_for(
        lambda: (
            kubectl.json(SOURCE, "get", "pod", "kept", "-n", namespace)["status"].get("phase")
            == "Running"
        ),
        60,
        what="kept Running, mirroring its new delegate",
    )
    kept = kubectl.json(SOURCE, "get", "pod", "kept", "-n", namespace)
    assert not kept["metadata"].get("deletionTimestamp")
    assert (
        delegate_of(kubectl, namespace, "kept")["metadata"]["uid"]
        == (again["kept"]["metadata"]["uid"])
    )
    # The source lists no more what it did not create: the first delegate's entry went.
    wait_for(
        lambda: delegates["kept"]["name"] not in listed(kubectl, namespace),
        120,
        what="the entry of the delegate deleted while cluster1 was away gone",
    )


# -- attacks ----------------------------------------------------------------------------------


def test_a_tenants_heartbeat_for_a_cluster_that_does_not_exist_keeps_nothing_alive(
    installation: Installation, kubectl: Kubectl, namespace: str
):
    """Eve may edit one namespace of cluster2, nothing else. She writes a heartbeat for a
    cluster of her invention (a Lease as the previous release read them: allowed; one of ours:
    refused, edit grants nothing of our group) and a privileged pod with the host's root
    filesystem, shaped like that cluster's delegate. Then the admin removes her access and
    deletes the pod: it stays deleted. Even someone an admin let write heartbeats (Eve, later)
    writes only their own name as the writer, which no Source names."""
    grant(kubectl, "eve", "edit", namespace)
    as_eve = ("--as=eve",)
    ghost = "ghost-cluster"
    name = heartbeat_name(ghost)
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LEGACY_HEARTBEAT_LABEL: "true"},
            "annotations": {PREFIX + "parent-cluster-name": ghost},
        },
        "spec": {"holderIdentity": ghost, "leaseDurationSeconds": 60, "renewTime": now()},
    }
    kubectl.apply(TARGET, lease, *as_eve)
    impostor = shaped_like_a_delegate(namespace, ghost)
    made = json.loads(kubectl.apply(TARGET, impostor, *as_eve, "-o", "json"))
    heartbeat = {
        "apiVersion": GROUP,
        "kind": "SourceHeartbeat",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "source": ghost,
            "writer": f"system:serviceaccount:{namespace}:c1",
            "renewTime": now(),
            "delegates": {made["metadata"]["name"]: made["metadata"]["uid"]},
        },
    }
    refused = kubectl.run(TARGET, "create", "-f", "-", *as_eve, stdin=json.dumps(heartbeat),
                          check=False)  # fmt: skip
    assert refused.returncode != 0
    assert "forbidden" in refused.stderr, refused.stderr
    # An admin lets her write heartbeats: she still cannot write someone else's name...
    kubectl(
        TARGET, "create", "role", "heartbeats", "--verb=create,patch,get",
        "--resource=sourceheartbeats.multicluster.admiralty.io", "-n", namespace,
    )  # fmt: skip
    kubectl(
        TARGET, "create", "rolebinding", "eve-heartbeats", "--role=heartbeats", "--user=eve",
        "-n", namespace,
    )  # fmt: skip
    refused = kubectl.run(TARGET, "create", "-f", "-", *as_eve, stdin=json.dumps(heartbeat),
                          check=False)  # fmt: skip
    assert refused.returncode != 0
    assert "spec.writer of a SourceHeartbeat is whoever writes it: eve" in refused.stderr
    # ... and her own is no Source's.
    heartbeat["spec"]["writer"] = "eve"
    kubectl(TARGET, "create", "-f", "-", *as_eve, stdin=json.dumps(heartbeat))
    time.sleep(2 * LOOK_EVERY)  # the keeper follows it, and the pods of the namespace

    for binding in ("eve-edit", "eve-heartbeats"):
        kubectl(TARGET, "delete", "rolebinding", binding, "-n", namespace)
    delete(kubectl, namespace, impostor["metadata"]["name"])
    stays_gone(kubectl, namespace, impostor["metadata"]["name"])
    assert "last written by eve" in refusal(kubectl, namespace, impostor["metadata"]["name"])


def test_someone_who_may_edit_the_sources_namespace_speaks_not_for_its_account(
    joined: str, testbed: TestBed, kubectl: Kubectl, tmp_path: Path
):
    """cluster1's Source in cluster2 names a service account of the namespace, and Kubernetes'
    ``edit`` role there grants impersonating its service accounts and making tokens for them.
    Eve (a service account of a namespace of her own, bound to ``edit`` there) writes, as
    cluster1's account, a heartbeat for a cluster of her invention listing a privileged pod of
    hers; another one with a token she made for that account. The admin removes her access,
    deletes both pods and makes the account again (a new uid: her token dies). Before, both pods
    were created again by the agent, a minute later (the first as the first heartbeat attack of
    this module, which "edit cannot write a SourceHeartbeat" was to stop). Now the impersonated
    heartbeat is refused, and the other one was written with a token of an account that is no
    more."""
    namespace = joined
    account = f"system:serviceaccount:{namespace}:{SOURCE}"
    home = f"{namespace}-eve"
    kubectl(TARGET, "create", "namespace", home)
    try:
        kubectl(TARGET, "create", "serviceaccount", "eve", "-n", home)
        kubectl(
            TARGET, "create", "rolebinding", "eve-edit", "--clusterrole=edit",
            f"--serviceaccount={home}:eve", "-n", namespace,
        )  # fmt: skip
        token = kubectl(TARGET, "create", "token", "eve", "-n", home).strip()
        eve = as_token(testbed, tmp_path, token, namespace)
        impostors = {}

        def heartbeat_listing_an_impostor(ghost: str) -> dict:
            impostor = shaped_like_a_delegate(namespace, ghost)
            made = json.loads(eve("create", "-f", "-", "-o", "json", stdin=json.dumps(impostor)))
            impostors[ghost] = made["metadata"]["name"]
            return {
                "apiVersion": GROUP,
                "kind": "SourceHeartbeat",
                "metadata": {"name": heartbeat_name(ghost), "namespace": namespace},
                "spec": {
                    "source": ghost,
                    "writer": account,
                    "renewTime": now(),
                    "delegates": {made["metadata"]["name"]: made["metadata"]["uid"]},
                },
            }

        # Impersonating cluster1's account (edit grants it).
        heartbeat = heartbeat_listing_an_impostor("ghost-a")
        written = eve("--as", account, "create", "-f", "-", stdin=json.dumps(heartbeat),
                      check=False)  # fmt: skip
        print(f"impersonated: {written.strip()}")
        assert "created" in written or "not by impersonating it" in written
        # With a token she made for cluster1's account (edit grants it too).
        heartbeat = heartbeat_listing_an_impostor("ghost-b")
        speak = as_token(testbed, tmp_path, eve("create", "token", SOURCE).strip(), namespace)
        who = json.loads(speak("auth", "whoami", "-o", "json"))["status"]["userInfo"]
        assert who["username"] == account
        heartbeat["spec"]["writerUID"] = who.get("uid")
        speak("create", "--validate=warn", "-f", "-", stdin=json.dumps(heartbeat))
        time.sleep(2 * LOOK_EVERY)  # the keeper follows them, and the pods of the namespace

        old_uid = kubectl.json(TARGET, "get", "serviceaccount", SOURCE, "-n", namespace)
        kubectl(TARGET, "delete", "rolebinding", "eve-edit", "-n", namespace)
        for name in impostors.values():
            delete(kubectl, namespace, name)
        kubectl(TARGET, "delete", "serviceaccount", SOURCE, "-n", namespace)
        wait_for(
            lambda: (
                kubectl.run(TARGET, "get", "serviceaccount", SOURCE, "-n", namespace, "-o",
                            "jsonpath={.metadata.uid}", check=False).stdout
                not in ("", old_uid["metadata"]["uid"])
            ),
            30, what="the Source's account made again",
        )  # fmt: skip
        stays_gone(kubectl, namespace, *impostors.values())
        said = refusal(kubectl, namespace, impostors["ghost-b"])
        print(said)
        assert "an earlier service account" in said or "no longer exists" in said
    finally:
        kubectl(TARGET, "delete", "namespace", home, "--wait=false")


def as_token(testbed: TestBed, folder: Path, token: str, namespace: str):
    """``run(*args)``: kubectl in ``namespace`` of cluster2 with ``token`` only (no client
    certificate); its output (``check=False``: and its errors, whatever its exit)."""
    path = folder / f"token-{uuid.uuid4().hex[:8]}.kubeconfig"
    path.write_text(kubeconfig_for(testbed, token))
    with_token = Kubectl(path, testbed.bin_dir)

    def run(*args: str, stdin: str | None = None, check: bool = True) -> str:
        proc = with_token.run("c2", "-n", namespace, *args, stdin=stdin, check=check)
        return proc.stdout if check else proc.stdout + proc.stderr

    return run


def test_a_pod_shaped_like_a_real_sources_delegate_is_not_kept_alive(
    joined: str, kubectl: Kubectl, source: Agents
):
    """cluster1 is joined to cluster2's namespace, where its heartbeat is. Eve, who may edit
    that namespace, makes a pod named and annotated as cluster1's delegate once cluster1 is away
    (before, cluster1 deletes it: its proxy pod does not exist). Both it and a real delegate
    are deleted while cluster1 is away: the real one comes back, hers does not."""
    namespace = joined
    grant(kubectl, "eve", "edit", namespace)
    kubectl.apply(SOURCE, elected("real"), "-n", namespace)
    scheduled(kubectl, namespace, "real")
    real = delegate_of(kubectl, namespace, "real")["metadata"]
    assert listed(kubectl, namespace) == {real["name"]: real["uid"]}
    source.away()
    impostor = shaped_like_a_delegate(namespace, cluster_name(kubectl))
    kubectl.apply(TARGET, impostor, "--as=eve")
    fake = impostor["metadata"]["name"]
    assert fake not in listed(kubectl, namespace)
    time.sleep(LOOK_EVERY)  # seen by the keeper, as it sees every pod shaped so
    delete(kubectl, namespace, real["name"])
    delete(kubectl, namespace, fake, "--as=eve")
    wait_for(
        lambda: back(kubectl, namespace, real["name"], real["uid"]),
        BACK_WITHIN,
        interval=1,
        what="the real delegate created again",
    )
    stays_gone(kubectl, namespace, fake)
    assert "does not list it" in refusal(kubectl, namespace, fake)


def test_a_delegate_whose_source_was_deleted_in_the_target_is_not_kept_alive(
    joined: str, kubectl: Kubectl, source: Agents
):
    """The target's admin deletes cluster1's Source (its access goes with it) while cluster1 is
    away; a delegate cluster1 made is deleted then: it stays deleted."""
    namespace = joined
    kubectl.apply(SOURCE, elected("web"), "-n", namespace)
    scheduled(kubectl, namespace, "web")
    real = delegate_of(kubectl, namespace, "web")["metadata"]
    assert real["name"] in listed(kubectl, namespace)
    source.away()
    kubectl(TARGET, "delete", "source", SOURCE, "-n", namespace, "--timeout=30s")
    wait_for(
        lambda: not kubectl(TARGET, "get", "rolebindings", "-n", namespace, "-o", "name"),
        30,
        what="the Source's RoleBinding gone",
    )
    delete(kubectl, namespace, real["name"])
    stays_gone(kubectl, namespace, real["name"])
    assert "no Source of namespace" in refusal(kubectl, namespace, real["name"])


# -- the upgrade ------------------------------------------------------------------------------


def test_the_previous_releases_heartbeat_lease_is_deleted_by_its_source(
    installation: Installation, testbed: TestBed, kubectl: Kubectl, namespace: str
):
    """A target's agent of the previous release reads Leases: one its source no longer renews
    would make it recreate every delegate deleted there. The source deletes its own."""
    name = heartbeat_name(cluster_name(kubectl))
    lease = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {LEGACY_HEARTBEAT_LABEL: "true"},
            "annotations": {PREFIX + "parent-cluster-name": cluster_name(kubectl)},
        },
        "spec": {"holderIdentity": cluster_name(kubectl), "renewTime": now()},
    }
    kubectl.apply(TARGET, lease)
    proc = join(testbed, "-n", namespace)
    assert proc.returncode == 0, proc.stderr
    wait_for(
        lambda: not kubectl(TARGET, "get", "lease", name, "-n", namespace, "--ignore-not-found"),
        60,
        what="the previous release's heartbeat Lease deleted",
    )
    heartbeat = kubectl.json(TARGET, "get", "sourceheartbeats", name, "-n", namespace)
    assert heartbeat["spec"]["writer"] == f"system:serviceaccount:{namespace}:{SOURCE}"
    table = kubectl(TARGET, "get", "shb", "-n", namespace)
    print(table)
    assert table.split("\n")[0].split() == ["NAME", "SOURCE", "WRITER", "RENEWED", "AGE"]


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
