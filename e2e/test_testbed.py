"""The test bed behaves like real clusters: nodes, scheduling, controllers, webhooks and helm."""

from __future__ import annotations

import base64
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from multicluster.pki import CertificateAuthority
from testbed import TestBed, wait_for
from testbed.kubectl import Kubectl


def pods_running(kubectl: Kubectl, context: str, namespace: str, selector: str) -> int:
    pods = kubectl.json(context, "get", "pods", "-n", namespace, "-l", selector)["items"]
    return sum(1 for p in pods if p.get("status", {}).get("phase") == "Running")


def test_get_nodes_lists_ready_fake_nodes(testbed: TestBed, kubectl: Kubectl):
    for context, cluster in testbed.clusters.items():
        table = kubectl(context, "get", "nodes", "--no-headers")
        rows = [line.split() for line in table.splitlines()]
        assert len(rows) == cluster.spec.nodes, table
        assert all(row[1] == "Ready" for row in rows), table
        assert all(row[0].startswith(f"{context}-node-") for row in rows), table


def test_contexts_reach_distinct_clusters(testbed: TestBed, kubectl: Kubectl):
    uids = {
        context: kubectl.json(context, "get", "namespace", "kube-system")["metadata"]["uid"]
        for context in testbed.clusters
    }
    assert len(set(uids.values())) == len(testbed.clusters)
    version = kubectl.json(next(iter(testbed.clusters)), "version")["serverVersion"]
    assert version["gitVersion"].startswith("v1.36."), version


def test_deployment_runs_then_controllers_clean_up(
    testbed: TestBed, kubectl: Kubectl, namespace: str
):
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {
            "replicas": 20,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    # Spread whatever earlier tests left on the nodes (least-allocated scoring
                    # alone may put every replica on the emptiest node).
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "DoNotSchedule",
                            "nodeTaintsPolicy": "Honor",  # tainted (e.g. virtual) nodes: none
                            "labelSelector": {"matchLabels": {"app": "web"}},
                        }
                    ],
                    "containers": [
                        {
                            "name": "nginx",
                            "image": "nginx",
                            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                        }
                    ],
                },
            },
        },
    }
    for context in testbed.clusters:
        # Nodes tainted for a moment (after an API server restart by an earlier test, or lease
        # renewals late under load) would not get pods: spreading needs them all.
        testbed[context].wait_settled()
        kubectl.apply(context, deployment)
    for context in testbed.clusters:
        wait_for(
            lambda c=context: pods_running(kubectl, c, namespace, "app=web") == 20,
            timeout=90,
            what=f"20 Running pods in {context}",
        )
        nodes = {
            p["spec"]["nodeName"]
            for p in kubectl.json(context, "get", "pods", "-n", namespace)["items"]
        }
        assert len(nodes) > 1, f"the scheduler spread pods over nodes: {nodes}"
    for context in testbed.clusters:
        kubectl(context, "delete", "deployment", "web", "-n", namespace, "--wait=false")
    for context in testbed.clusters:
        wait_for(
            lambda c=context: not kubectl.json(c, "get", "pods", "-n", namespace)["items"],
            timeout=60,
            what=f"pods of the deleted Deployment gone from {context}",
        )


def test_unschedulable_pod_stays_pending_with_failed_scheduling(
    testbed: TestBed, kubectl: Kubectl, namespace: str
):
    context = list(testbed.clusters)[-1]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "nowhere", "namespace": namespace},
        "spec": {
            "nodeSelector": {"topology.kubernetes.io/region": "nowhere"},
            "containers": [{"name": "c", "image": "busybox"}],
        },
    }
    kubectl.apply(context, pod)

    def failed_scheduling():
        events = kubectl.json(
            context,
            "get",
            "events",
            "-n",
            namespace,
            "--field-selector",
            "involvedObject.name=nowhere,reason=FailedScheduling",
        )["items"]
        return events[0]["message"] if events else None

    message = wait_for(failed_scheduling, timeout=60, what="FailedScheduling event")
    assert "didn't match Pod's node affinity/selector" in message, message
    status = kubectl.json(context, "get", "pod", "nowhere", "-n", namespace)["status"]
    assert status["phase"] == "Pending"
    scheduled = next(c for c in status["conditions"] if c["type"] == "PodScheduled")
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")


class _Webhook(BaseHTTPRequestHandler):
    calls: list[dict]

    def do_POST(self):
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.calls.append(review)
        patch = [{"op": "add", "path": "/metadata/labels/mutated-by", "value": "test-webhook"}]
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_api_server_calls_a_webhook_served_on_loopback(
    testbed: TestBed, kubectl: Kubectl, namespace: str, tmp_path: Path
):
    ca = CertificateAuthority.new("test-webhook-ca", path_length=None)
    cert, key = ca.issue("webhook", hosts=("127.0.0.1",), server=True).write_to(tmp_path, "webhook")
    handler = type("Handler", (_Webhook,), {"calls": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    context = next(iter(testbed.clusters))
    name = f"test-webhook-{namespace}"
    try:
        kubectl(context, "label", "namespace", namespace, "webhook-test=enabled")
        kubectl.apply(
            context,
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": name},
                "webhooks": [
                    {
                        "name": "test.webhook.example.com",
                        "clientConfig": {
                            "url": f"https://127.0.0.1:{server.server_address[1]}/mutate",
                            "caBundle": base64.b64encode(ca.cert_pem).decode(),
                        },
                        "rules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "operations": ["CREATE"],
                                "resources": ["pods"],
                            }
                        ],
                        "namespaceSelector": {"matchLabels": {"webhook-test": "enabled"}},
                        "admissionReviewVersions": ["v1"],
                        "sideEffects": "None",
                        "failurePolicy": "Fail",
                        "timeoutSeconds": 5,
                    }
                ],
            },
        )
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "mutated", "namespace": namespace, "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }
        # The configuration takes effect once the API server's informer has seen it.
        wait_for(
            lambda: (
                kubectl.run(context, "apply", "-f", "-", stdin=json.dumps(pod), check=False)
                and handler.calls
            ),
            timeout=30,
            what="the webhook's first call",
        )
        labels = kubectl.json(context, "get", "pod", "mutated", "-n", namespace)["metadata"][
            "labels"
        ]
        assert labels == {"app": "x", "mutated-by": "test-webhook"}
        request = handler.calls[0]["request"]
        assert (request["operation"], request["namespace"]) == ("CREATE", namespace)
    finally:
        kubectl(context, "delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")
        server.shutdown()


def test_helm_installs_a_chart_in_each_cluster(
    testbed: TestBed, kubectl: Kubectl, namespace: str, tmp_path: Path
):
    chart = tmp_path / "hello"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text(
        "apiVersion: v2\nname: hello\nversion: 0.1.0\nkubeVersion: '>=1.30.0-0'\n"
    )
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "configmap.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-greeting\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
        "  cluster: {{ .Values.cluster | quote }}\n"
    )
    for context in testbed.clusters:
        kubectl.helm(
            context,
            "install",
            "hello",
            str(chart),
            "-n",
            namespace,
            "--set",
            f"cluster={context}",
            "--wait",
            home=tmp_path,
        )
        data = kubectl.json(context, "get", "configmap", "hello-greeting", "-n", namespace)["data"]
        assert data == {"greeting": "hello", "cluster": context}
        listed = json.loads(
            kubectl.helm(context, "list", "-n", namespace, "-o", "json", home=tmp_path)
        )
        assert [(r["name"], r["status"]) for r in listed] == [("hello", "deployed")]
        kubectl.helm(context, "uninstall", "hello", "-n", namespace, "--wait", home=tmp_path)
        missing = kubectl.run(
            context, "get", "configmap", "hello-greeting", "-n", namespace, check=False
        )
        assert "NotFound" in missing.stderr
