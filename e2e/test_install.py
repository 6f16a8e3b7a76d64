"""The chart installed with helm into two clusters, agents running under its identity: the
webhook is called over TLS with the caBundle the agents wrote, RBAC is complete and minimal,
and uninstalling leaves nothing of ours behind."""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import subprocess
import time
import urllib.request

import pytest
import yaml

from multicluster_scheduler import agent
from multicluster_scheduler.api.ingresses import ClassPolicy, IngressPolicy
from testbed import TestBed, wait_for
from testbed.install import CHART, NAMESPACE, RELEASE, Installation
from testbed.kubectl import Kubectl

CONTEXTS = ("cluster1", "cluster2")


def helm(bin_dir, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(bin_dir / "helm"), *args], capture_output=True, text=True, timeout=60, check=False
    )


def render(bin_dir, *values: str) -> list[dict]:
    argv = ["template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", "1.36.0"]
    proc = helm(bin_dir, *argv, *[a for v in values for a in ("--set", v)])
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_chart_lints(bin_dir):
    proc = helm(bin_dir, "lint", "--strict", str(CHART), "--kube-version", "1.36.0")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_helm_template_needs_no_flags_and_old_clusters_are_refused(bin_dir):
    """`helm template` assumes Kubernetes 1.20 when not told: it renders all the same; a cluster
    older than 1.30 (no v1 ValidatingAdmissionPolicy) is refused with its version."""
    plain = helm(bin_dir, "template", RELEASE, str(CHART), "-n", NAMESPACE)
    assert plain.returncode == 0, plain.stderr
    assert "kind: Deployment" in plain.stdout
    old = helm(bin_dir, "template", RELEASE, str(CHART), "--kube-version", "1.29.9")
    assert old.returncode != 0
    assert "needs Kubernetes 1.30 or later, not v1.29.9" in old.stderr


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("agent.replica=3", "additional properties 'replica' not allowed"),
        ("agent.logLevel=verbose", "value must be one of 'debug', 'info', 'warning', 'error'"),
        ("scheduler.delegateTimeout=30", "got number, want string"),
        ("agent.leaderElection.leaseDuration=15 seconds", "does not match pattern"),
        ("webhook.url=http://127.0.0.1:9/m", "does not match pattern"),
        ("targets.maxPerNamespace=-1", "minimum"),
        ("ingresses.allowedAnnotations={(?i)snippet}", "does not match pattern"),
        ("ingresses.allowedHosts={*example.com}", "does not match pattern"),
        ("ingresses.ingressClass.policy=drop", "value must be one of 'keep', 'refuse', 'rewrite'"),
        ("ingresses.ingressClass.policy=rewrite", "ingressClass/name"),
    ],
)
def test_values_are_checked(bin_dir, value, said):
    """A typo or a wrong type is refused by helm with where and why (values.schema.json)."""
    proc = helm(bin_dir, "template", RELEASE, str(CHART), "--set", value)
    assert proc.returncode != 0
    assert said in proc.stderr


def agent_args(docs: list[dict]) -> list[str]:
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_the_ingress_values_become_the_agents_flags(bin_dir, tmp_path):
    """Each allowed annotation and host is a flag of its own, which the agent reads back into
    its policy; the values of an older chart (what ``helm upgrade --reuse-values`` keeps, without
    the newer keys) render the defaults."""
    args = agent_args(
        render(
            bin_dir,
            "ingresses.allowedAnnotations={nginx.ingress.kubernetes.io/rewrite-target,a.example/*}",
            "ingresses.allowedHosts={*.apps.example.com,shop.example.com}",
            "ingresses.ingressClass.policy=rewrite",
            "ingresses.ingressClass.name=public",
        )
    )
    assert [a for a in args if a.startswith("--ingress")] == [
        "--ingress-refused-annotations=(?i)snippet|auth-url|auth-signin|auth-tls-match-cn|mirror-(target|host|uri)",
        "--ingress-allowed-annotation=nginx.ingress.kubernetes.io/rewrite-target",
        "--ingress-allowed-annotation=a.example/*",
        "--ingress-class-policy=rewrite",
        "--ingress-class=public",
        "--ingress-allowed-host=*.apps.example.com",
        "--ingress-allowed-host=shop.example.com",
    ]
    parser = argparse.ArgumentParser()
    agent.add_arguments(parser)
    policy = agent.settings_from(parser.parse_args(args[1:])).ingress_policy()
    assert policy == IngressPolicy(
        allowed_annotations=("nginx.ingress.kubernetes.io/rewrite-target", "a.example/*"),
        class_policy=ClassPolicy.REWRITE,
        ingress_class="public",
        allowed_hosts=("*.apps.example.com", "shop.example.com"),
    )

    older = tmp_path / "chart"
    shutil.copytree(CHART, older)
    values = yaml.safe_load((older / "values.yaml").read_text())
    values["ingresses"] = {
        k: v
        for k, v in values["ingresses"].items()
        if k in ("refusedAnnotations", "sourcesMayWrite")
    }
    (older / "values.yaml").write_text(yaml.safe_dump(values))
    argv = ["template", RELEASE, str(older), "-n", NAMESPACE, "--kube-version", "1.36.0"]
    proc = helm(bin_dir, *argv)
    assert proc.returncode == 0, proc.stderr
    args = agent_args([d for d in yaml.safe_load_all(proc.stdout) if d])
    policy = agent.settings_from(parser.parse_args(args[1:])).ingress_policy()
    assert policy == IngressPolicy(), "the defaults: nothing allowed"


def test_notes_say_what_to_do_next(installation: Installation):
    """What helm prints after installing, against a real cluster (its version checked too)."""
    out = installation.helm(
        "cluster1", "upgrade", RELEASE, str(CHART), "-n", NAMESPACE, "--reuse-values",
        "--dry-run=server",
    )  # fmt: skip
    notes = out.partition("NOTES:")[2]
    assert "multicluster-scheduler join --source-context" in notes
    assert "multicluster-scheduler export" in notes
    assert "kubectl label namespace default multicluster-scheduler=enabled" in notes
    assert "multicluster-scheduler status --context SOURCE -A" in notes
    assert "kubectl multicluster status -A" in notes
    assert "multicluster-scheduler unjoin --source-context" in notes


@pytest.mark.parametrize(
    "values", [(), ("webhook.certManager.enabled=true",), ("webhook.url=https://127.0.0.1:9/m",)]
)
def test_templates(bin_dir, values):
    docs = render(bin_dir, *values)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ClusterRole", "multicluster-scheduler-source") in kinds
    assert ("ClusterRole", "multicluster-scheduler-cluster-summary-viewer") in kinds
    for doc in docs:
        for rule in doc.get("rules") or ():
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule.get(field, []), (doc["metadata"]["name"], rule)
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"livenessProbe", "readinessProbe", "resources"} <= set(container)
    webhook = next(d for d in docs if d["kind"] == "MutatingWebhookConfiguration")["webhooks"][0]
    assert (webhook["failurePolicy"], webhook["sideEffects"]) == ("Fail", "None")
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["rules"][0]["operations"] == ["CREATE"]
    selector = webhook["namespaceSelector"]["matchExpressions"]
    assert {"key": "multicluster-scheduler", "operator": "In", "values": ["enabled"]} in selector
    assert {
        "key": "kubernetes.io/metadata.name",
        "operator": "NotIn",
        "values": [NAMESPACE, "kube-system"],
    } in selector
    client = webhook["clientConfig"]
    if "webhook.url=https://127.0.0.1:9/m" in values:
        assert client == {"url": "https://127.0.0.1:9/m"}
    else:
        assert client["service"]["path"] == "/mutate"
    cert_manager = any(d["kind"] == "Certificate" for d in docs)
    assert cert_manager == ("webhook.certManager.enabled=true" in values)
    assert any(d["kind"] == "PodDisruptionBudget" for d in docs)
    # The key that seals saved manifests: an empty Secret, cert-manager or not, that the agent
    # alone may read and fill.
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    assert "data" not in secrets[f"{RELEASE}-manifest-key"]
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == RELEASE)
    (secret_rule,) = [r for r in role["rules"] if r["resources"] == ["secrets"]]
    assert f"{RELEASE}-manifest-key" in secret_rule["resourceNames"]
    assert secret_rule["verbs"] == ["get", "update"]
    policy = next(
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicy" and d["metadata"]["name"].endswith("proxy-pods")
    )
    agent = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
    assert any(agent in c["expression"] for c in policy["spec"]["matchConditions"])
    assert ("ValidatingAdmissionPolicyBinding", f"{RELEASE}-proxy-pods") in kinds
    warnings = f"{RELEASE}-warnings"
    policy = next(d for d in docs if d["metadata"]["name"] == warnings)
    assert (policy["kind"], policy["spec"]["failurePolicy"]) == (
        "ValidatingAdmissionPolicy",
        "Ignore",
    )
    binding = next(
        d
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["metadata"]["name"] == warnings
    )
    assert binding["spec"] == {"policyName": warnings, "validationActions": ["Warn"]}


def test_admission_warnings_may_be_turned_off(bin_dir):
    docs = render(bin_dir, "admissionWarnings.enabled=false")
    assert not any(d["metadata"]["name"] == f"{RELEASE}-warnings" for d in docs)


def metrics_of(install: Installation, context: str) -> str:
    port = install.health_ports[context][0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode()


def test_installed_with_crds_established(installation: Installation, kubectl: Kubectl):
    for context in CONTEXTS:
        kubectl(
            context,
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/targets.multicluster.admiralty.io",
            "crd/clustersummaries.multicluster.admiralty.io",
        )
        status = kubectl.json(context, "get", "secret", f"{RELEASE}-webhook-ca", "-n", NAMESPACE)
        assert set(status["data"]) == {"ca.crt", "ca.key"}
        key = kubectl.json(context, "get", "secret", f"{RELEASE}-manifest-key", "-n", NAMESPACE)
        assert set(key["data"]) == {"key", "created"}


def test_api_server_calls_the_webhook_with_the_ca_bundle_the_agent_wrote(
    installation: Installation, kubectl: Kubectl, namespace: str
):
    for context in CONTEXTS:
        secret = kubectl.json(context, "get", "secret", f"{RELEASE}-webhook-ca", "-n", NAMESPACE)
        configuration = wait_for(
            lambda c=context: (
                (m := kubectl.json(c, "get", "mutatingwebhookconfiguration", RELEASE))
                and m["webhooks"][0]["clientConfig"].get("caBundle")
                and m
            ),
            timeout=30,
            what=f"the caBundle written in {context}",
        )
        bundle = configuration["webhooks"][0]["clientConfig"]["caBundle"]
        assert base64.b64decode(bundle) == base64.b64decode(secret["data"]["ca.crt"])

        kubectl(context, "label", "namespace", namespace, "multicluster-scheduler=enabled")

        def calls(c=context) -> float:
            for line in metrics_of(installation, c).splitlines():
                if line.startswith('webhook_requests_total{result="allowed",webhook="proxy-pods"}'):
                    return float(line.split()[-1])
            return 0.0

        before = calls()
        # The API server may take a moment to see the new caBundle: until then it refuses.
        wait_for(
            lambda c=context: (
                kubectl.run(
                    c, "run", "through-webhook", "-n", namespace, "--image=nginx", check=False
                ).returncode
                == 0
                or None
            ),
            timeout=30,
            what=f"a pod admitted through the webhook in {context}",
        )
        assert calls() > before


def test_each_cluster_publishes_its_summary(
    installation: Installation, kubectl: Kubectl, namespace: str
):
    def summary(context: str) -> dict | None:
        proc = kubectl.run(context, "get", "clustersummary", "singleton", "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    for context in CONTEXTS:
        published = wait_for(lambda c=context: summary(c), timeout=30, what=f"{context} summary")
        assert published["allocatable"] == {"cpu": "24", "memory": "96Gi", "pods": "330"}
        (group,) = published["nodeGroups"]
        assert group["count"] == 3
        assert "kubernetes.io/hostname" not in group["labels"]
        assert group["labels"]["type"] == "kwok"

    context = "cluster2"
    kubectl(
        context, "create", "deployment", "sized", "-n", namespace, "--image=nginx", "--replicas=4"
    )
    kubectl(
        context,
        "set",
        "resources",
        "deployment",
        "sized",
        "-n",
        namespace,
        "--requests=cpu=500m,memory=1Gi",
    )
    wait_for(
        lambda: summary(context)["nodeGroups"][0]["requested"].get("cpu") == "2",
        timeout=60,
        what="the requests of 4 pods in the summary",
    )
    requested = summary(context)["nodeGroups"][0]["requested"]
    assert requested["memory"] == "4Gi"
    kubectl.apply(
        context,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": "admiralty-namespace-default-elsewhere",
                "labels": {"type": "virtual-kubelet", "virtual-kubelet.io/provider": "admiralty"},
            },
            "status": {"allocatable": {"cpu": "1000"}, "capacity": {"cpu": "1000"}},
        },
    )
    kubectl(context, "delete", "deployment", "sized", "-n", namespace)
    wait_for(
        lambda: "cpu" not in summary(context)["nodeGroups"][0]["requested"],
        timeout=60,
        what="the summary after the pods went",
    )
    assert summary(context)["allocatable"]["cpu"] == "24", "virtual nodes are not counted"
    kubectl(context, "delete", "node", "admiralty-namespace-default-elsewhere")


def test_summary_writes_stay_rare_under_pod_churn(
    installation: Installation, kubectl: Kubectl, namespace: str
):
    context = "cluster1"

    def writes() -> float:
        for line in metrics_of(installation, context).splitlines():
            if line.startswith("multicluster_scheduler_summary_writes_total "):
                return float(line.split()[-1])
        return 0.0

    before, started = writes(), time.monotonic()
    kubectl.apply(
        context,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "churn", "namespace": namespace},
            "spec": {
                "replicas": 60,
                "selector": {"matchLabels": {"app": "churn"}},
                "template": {
                    "metadata": {"labels": {"app": "churn"}},
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "image": "nginx",
                                "resources": {"requests": {"cpu": "10m"}},
                            }
                        ]
                    },
                },
            },
        },
    )
    kubectl(
        context,
        "wait",
        "deployment/churn",
        "-n",
        namespace,
        "--for=condition=Available",
        "--timeout=150s",
        timeout=180,
    )
    kubectl(context, "scale", "deployment", "churn", "-n", namespace, "--replicas=0")
    kubectl(context, "delete", "deployment", "churn", "-n", namespace)
    time.sleep(2)
    elapsed = time.monotonic() - started
    written = writes() - before
    print(f"{written:.0f} summary writes in {elapsed:.1f}s of churn over 120 pod changes")
    assert 1 <= written <= elapsed + 2


def test_a_helm_upgrade_that_resets_the_ca_bundle_is_repaired(
    installation: Installation, kubectl: Kubectl
):
    context = "cluster1"
    port = installation.webhook_ports[context]
    installation.helm(
        context,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        NAMESPACE,
        "--reuse-values",
        "--set",
        f"webhook.url=https://127.0.0.1:{port}/mutate",
        "--set",
        "webhook.timeoutSeconds=9",
    )
    wait_for(
        lambda: kubectl.json(context, "get", "mutatingwebhookconfiguration", RELEASE)["webhooks"][
            0
        ]["clientConfig"].get("caBundle"),
        timeout=30,
        what="the caBundle restored after an upgrade",
    )


def test_agents_meet_no_forbidden_error(installation: Installation, testbed: TestBed):
    for context in CONTEXTS:
        text = metrics_of(installation, context)
        forbidden = [line for line in text.splitlines() if 'code="403"' in line]
        log = installation.agent_log(installation.agents[context][0])
        said = [line for line in log.splitlines() if "403" in line or "orbidden" in line]
        assert forbidden == [], (context, forbidden, said)
        assert "Forbidden" not in log, log
        assert " 403 " not in log, log


def test_a_dead_agent_is_restarted_as_its_deployment_would_be(installation: Installation):
    agent = installation.agents["cluster2"][0]
    first = agent.pid
    agent.kill()
    wait_for(lambda: agent.running and agent.pid != first, timeout=15, what="the agent restarted")
    port = installation.health_ports["cluster2"][0]
    wait_for(
        lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2).status == 200,
        timeout=30,
        what="the restarted agent ready",
    )


def test_uninstall_leaves_nothing_of_ours_behind(
    installation: Installation, kubectl: Kubectl, namespace: str
):
    kubectl.apply(
        "cluster1",
        {
            "apiVersion": "multicluster.admiralty.io/v1alpha1",
            "kind": "Target",
            "metadata": {"name": "me", "namespace": namespace},
            "spec": {"self": True},
        },
    )
    virtual = f"admiralty-namespace-{namespace}-me"
    wait_for(
        lambda: kubectl.run("cluster1", "get", "node", virtual, check=False).returncode == 0,
        timeout=15,
        what="a virtual node",
    )
    installation.uninstall()
    wait_for(
        lambda: kubectl.run("cluster1", "get", "node", virtual, check=False).returncode != 0,
        timeout=30,
        what="the virtual node garbage-collected after uninstall",
    )
    for context in CONTEXTS:
        leftovers = kubectl(
            context,
            "get",
            "secrets,leases,serviceaccounts,roles,rolebindings,services,deployments,"
            "poddisruptionbudgets",
            "-n",
            NAMESPACE,
            "-l",
            "app.kubernetes.io/part-of=multicluster-scheduler",
            "-o",
            "name",
        )
        assert leftovers == ""
        for kind in (
            "mutatingwebhookconfigurations",
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
            "clusterroles",
            "clusterrolebindings",
        ):
            names = kubectl(context, "get", kind, "-o", "name")
            assert "multicluster-scheduler" not in names, names
        for kind in ("secret", "lease"):
            gone = kubectl.run(context, "get", kind, "-n", NAMESPACE, "-o", "name", check=False)
            assert "multicluster-scheduler" not in gone.stdout
