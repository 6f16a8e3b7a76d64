"""Config maps and secrets follow delegates to their targets: copied before the delegate is
created, kept in sync, deleted when no delegate there uses them, never written over someone
else's object, and never copied to a self target."""

from __future__ import annotations

import base64
import json

from e2e.scenarios import REGION, SOURCE, TARGET, job_condition
from multicluster_scheduler.api.keys import PREFIX
from testbed import wait_for
from testbed.kubectl import Kubectl

FINALIZER = PREFIX + "multiclusterForegroundDeletion"


def reader_job(name: str, region: str, config_map: str, secret: str | None = None) -> dict:
    """An elected Job whose container reads a config map (and a secret) through envFrom and
    checks the values."""
    env_from = [{"configMapRef": {"name": config_map}}]
    if secret:
        env_from.append({"secretRef": {"name": secret}})
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {
                    "annotations": {
                        PREFIX + "elect": "",
                        "testbed.multicluster-scheduler.io/exit-code": "0",
                    }
                },
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {REGION: region},
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "command": [
                                "sh",
                                "-c",
                                'test "$GREETING" = hello && test "${PASSWORD-s3cret}" = s3cret',
                            ],
                            "envFrom": env_from,
                        }
                    ],
                },
            },
        },
    }


def get(kubectl: Kubectl, context: str, kind: str, name: str, namespace: str) -> dict | None:
    out = kubectl(context, "get", kind, name, "-n", namespace, "--ignore-not-found", "-o", "json")
    return json.loads(out) if out.strip() else None


def environment(kubectl: Kubectl, context: str, pod: dict) -> dict[str, str]:
    """The environment a kubelet in ``context`` would give the pod's first container from its
    envFrom (config maps and secrets read there, as the kubelet reads them)."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    for source in pod["spec"]["containers"][0].get("envFrom") or ():
        if "configMapRef" in source:
            found = get(kubectl, context, "configmap", source["configMapRef"]["name"], namespace)
            assert found is not None, f"config map {source} missing in {context}"
            env.update(found.get("data") or {})
        if "secretRef" in source:
            found = get(kubectl, context, "secret", source["secretRef"]["name"], namespace)
            assert found is not None, f"secret {source} missing in {context}"
            env.update({k: base64.b64decode(v).decode() for k, v in found["data"].items()})
    return env


def delegates(kubectl: Kubectl, context: str, namespace: str, job: str) -> list[dict]:
    return kubectl.json(context, "get", "pods", "-n", namespace, "-l", f"{PREFIX}job-name={job}")[
        "items"
    ]


def ours(obj: dict | None) -> bool:
    """Whether our finalizer or its label is still on ``obj``."""
    if obj is None:
        return False
    meta = obj["metadata"]
    return FINALIZER in (meta.get("finalizers") or ()) or PREFIX + "has-finalizer" in (
        meta.get("labels") or {}
    )


def test_config_maps_and_secrets_follow_a_job_to_its_target(guide, regions, kubectl: Kubectl):
    namespace, _ = guide
    kubectl(
        SOURCE, "create", "configmap", "settings", "-n", namespace, "--from-literal=GREETING=hello"
    )
    kubectl(
        SOURCE,
        "create",
        "secret",
        "generic",
        "credentials",
        "-n",
        namespace,
        "--from-literal=PASSWORD=s3cret",
    )
    kubectl(
        SOURCE,
        "create",
        "configmap",
        "local-only",
        "-n",
        namespace,
        "--from-literal=GREETING=hello",
    )
    kubectl.apply(SOURCE, reader_job("reader", "eu", "settings", "credentials"), "-n", namespace)
    kubectl.apply(SOURCE, reader_job("local", "us", "local-only"), "-n", namespace)

    # The copies are in cluster2 as soon as the delegate is: the kubelet there finds them.
    found: list[dict] = []
    wait_for(
        lambda: found.extend(delegates(kubectl, TARGET, namespace, "reader")) or found,
        60,
        what="the reader's delegate in cluster2",
    )
    env = environment(kubectl, TARGET, found[0])
    assert (env["GREETING"], env["PASSWORD"]) == ("hello", "s3cret")

    source = get(kubectl, SOURCE, "configmap", "settings", namespace)
    copy = get(kubectl, TARGET, "configmap", "settings", namespace)
    assert copy["metadata"]["labels"][PREFIX + "parent-uid"] == source["metadata"]["uid"]
    annotations = copy["metadata"]["annotations"]
    assert annotations[PREFIX + "parent-name"] == "settings"
    assert annotations[PREFIX + "parent-namespace"] == namespace
    assert FINALIZER in source["metadata"]["finalizers"]
    assert source["metadata"]["labels"][PREFIX + "has-finalizer"] == "true"
    secret_copy = get(kubectl, TARGET, "secret", "credentials", namespace)
    assert secret_copy["type"] == "Opaque"

    wait_for(lambda: job_condition(kubectl, namespace, "reader") == "Complete", 60, what="done")
    wait_for(lambda: job_condition(kubectl, namespace, "local") == "Complete", 60, what="done")
    # Self target: nothing copied, nothing held.
    assert delegates(kubectl, SOURCE, namespace, "local")
    assert get(kubectl, TARGET, "configmap", "local-only", namespace) is None
    assert not ours(get(kubectl, SOURCE, "configmap", "local-only", namespace))

    # A change of the source reaches the copy.
    kubectl(
        SOURCE,
        "patch",
        "configmap",
        "settings",
        "-n",
        namespace,
        "--type=merge",
        "-p",
        json.dumps({"data": {"GREETING": "bonjour"}}),
    )
    wait_for(
        lambda: (
            (get(kubectl, TARGET, "configmap", "settings", namespace) or {})
            .get("data", {})
            .get("GREETING")
            == "bonjour"
        ),
        30,
        what="the change copied",
    )

    # No delegate uses them any more: the copies go, and so does our finalizer.
    kubectl(SOURCE, "delete", "pods", "-n", namespace, "-l", "job-name=reader", "--wait=false")
    wait_for(
        lambda: (
            get(kubectl, TARGET, "configmap", "settings", namespace) is None
            and get(kubectl, TARGET, "secret", "credentials", namespace) is None
        ),
        60,
        what="the copies deleted",
    )
    wait_for(
        lambda: (
            not ours(get(kubectl, SOURCE, "configmap", "settings", namespace))
            and not ours(get(kubectl, SOURCE, "secret", "credentials", namespace))
        ),
        30,
        what="our finalizers removed",
    )


def test_a_deleted_source_takes_its_copies_and_a_namesake_is_never_overwritten(
    guide,
    regions,
    kubectl: Kubectl,
):
    namespace, _ = guide
    kubectl(
        SOURCE, "create", "configmap", "settings", "-n", namespace, "--from-literal=GREETING=hello"
    )
    kubectl(
        SOURCE, "create", "configmap", "taken", "-n", namespace, "--from-literal=GREETING=hello"
    )
    kubectl(
        TARGET, "create", "configmap", "taken", "-n", namespace, "--from-literal=GREETING=theirs"
    )
    kubectl.apply(SOURCE, reader_job("reader", "eu", "settings"), "-n", namespace)
    kubectl.apply(SOURCE, reader_job("squatter", "eu", "taken"), "-n", namespace)
    wait_for(
        lambda: get(kubectl, TARGET, "configmap", "settings", namespace) is not None,
        60,
        what="the copy",
    )
    wait_for(
        lambda: delegates(kubectl, TARGET, namespace, "squatter"), 60, what="the other delegate"
    )

    # Someone else's object of the same name stays as it is, and an event says why.
    def conflict_events() -> list[dict]:
        return [
            e
            for e in kubectl.json(
                SOURCE,
                "get",
                "events",
                "-n",
                namespace,
                "--field-selector",
                "involvedObject.name=taken",
            )["items"]
            if e["reason"] == "CopyConflict"
        ]

    wait_for(conflict_events, 30, what="a CopyConflict event")
    taken = get(kubectl, TARGET, "configmap", "taken", namespace)
    assert taken["data"] == {"GREETING": "theirs"}
    assert PREFIX + "parent-uid" not in (taken["metadata"].get("labels") or {})
    assert "not a copy made by this cluster" in conflict_events()[0]["message"]

    # Deleting the source while a delegate uses it: its copy goes first, then the source.
    kubectl(SOURCE, "delete", "configmap", "settings", "-n", namespace, "--wait=false")
    wait_for(
        lambda: (
            get(kubectl, TARGET, "configmap", "settings", namespace) is None
            and get(kubectl, SOURCE, "configmap", "settings", namespace) is None
        ),
        30,
        what="the copy, then the source, deleted",
    )
