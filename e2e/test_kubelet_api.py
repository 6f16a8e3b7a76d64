"""``kubectl logs``, ``exec`` and ``attach`` on a proxy pod reach its delegate in the target.

The API server of cluster1 calls the kubelet API of the proxy pod's virtual node (the agent);
the agent relays to cluster2's API server, which calls kwok, the kubelet of the fake node the
delegate runs on. kwok logs a file of the test bed's (different in each cluster), and runs exec
commands on this machine with ``CLUSTER`` set to its cluster's name: what comes back says where
it came from.
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl
import subprocess
import threading
import time

import pytest

from e2e.scenarios import (
    REGION,
    SOURCE,
    TARGET,
    node_ready,
    proxies,
    restart_api_server,
    running_and_ready,
)
from testbed import TestBed, wait_for
from testbed.kubectl import Kubectl

POD = "debug-me"


def elected_pod(name: str = POD) -> str:
    """One elected pod that can only run in cluster2 (its nodes are in region eu)."""
    return f"""apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    multicluster.admiralty.io/elect: ""
spec:
  nodeSelector:
    {REGION}: eu
  containers:
  - name: main
    image: busybox
  - name: sidecar
    image: busybox
"""


@pytest.fixture
def placed(guide, regions, kubectl: Kubectl):
    """The elected pod, running, its delegate in cluster2; (namespace, proxy, target node)."""
    namespace, nodes = guide
    kubectl.apply(SOURCE, elected_pod(), "-n", namespace)

    def running() -> dict | None:
        found = [p for p in proxies(kubectl, namespace) if p["metadata"]["name"] == POD]
        return found[0] if found and running_and_ready(found[0]) else None

    proxy = wait_for(running, 60, what="the proxy pod Running")
    assert proxy["spec"]["nodeName"] == nodes[1], "placed in cluster2"
    # The test bed's own promise: the delegate's fake node has an address and kwok's port.
    delegate = delegates_of(kubectl, namespace, proxy)[0]
    node = kubectl.json(TARGET, "get", "node", delegate["spec"]["nodeName"])
    assert node["status"].get("addresses"), json.dumps(node, indent=1)
    return namespace, proxy, nodes[1]


def lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line]


def logs(kubectl: Kubectl, namespace: str, *args: str, check: bool = True):
    return kubectl.run(SOURCE, "logs", POD, "-n", namespace, *args, check=check)


# -- logs ---------------------------------------------------------------------------------------


def logged(testbed: TestBed, cluster: str) -> list[str]:
    """What kwok's containers of ``cluster`` say (the log file without its CRI prefixes)."""
    text = testbed[cluster].container_log.read_text()
    return [line.split(" ", 3)[3] for line in lines(text)]


def test_kubectl_logs_returns_the_delegates_output(placed, kubectl: Kubectl, testbed: TestBed):
    namespace, _, _ = placed
    expected = logged(testbed, TARGET)
    assert expected[:3] == ["cluster2 line 1", "cluster2 line 2", "cluster2 line 3"]
    assert lines(logs(kubectl, namespace, "-c", "main").stdout) == expected
    assert lines(logs(kubectl, namespace, "-c", "sidecar", "--tail=1").stdout) == expected[-1:]
    stamped = lines(logs(kubectl, namespace, "-c", "main", "--timestamps").stdout)
    assert stamped[0].startswith("2026-01-01T00:00:00")
    assert stamped[0].endswith("cluster2 line 1")
    previous = logs(kubectl, namespace, "-c", "main", "--previous").stdout
    assert lines(previous) == ["cluster2 previous run"]
    assert logs(kubectl, namespace, "-c", "main", "--limit-bytes=8").stdout == "cluster2"
    assert logs(kubectl, namespace, "-c", "main", "--since=1h").stdout == ""  # all older
    since = logs(kubectl, namespace, "-c", "main", "--since-time=2025-12-31T00:00:00Z").stdout
    assert lines(since) == expected
    every = logs(kubectl, namespace, "--all-containers").stdout
    assert lines(every) == expected * 2  # main's, then sidecar's


def test_a_self_targets_delegate_too(placed, kubectl: Kubectl):
    """Delegates of the self target run in cluster1 itself: the agent asks its own API server,
    with its own identity."""
    namespace, _, _ = placed
    here = elected_pod("debug-here").replace(f"{REGION}: eu", f"{REGION}: us")
    kubectl.apply(SOURCE, here, "-n", namespace)

    def running() -> bool:
        found = [p for p in proxies(kubectl, namespace) if p["metadata"]["name"] == "debug-here"]
        return bool(found) and running_and_ready(found[0])

    wait_for(running, 60, what="the proxy pod in cluster1 Running")
    said = kubectl.run(SOURCE, "logs", "debug-here", "-c", "main", "-n", namespace, "--tail=1")
    assert said.stdout.startswith("cluster1 line")
    ran = kubectl.run(
        SOURCE,
        "exec",
        "debug-here",
        "-c",
        "main",
        "-n",
        namespace,
        "--",
        "sh",
        "-c",
        "echo $CLUSTER",
    )
    assert ran.stdout == "cluster1\n"


def test_kubectl_logs_follow_streams_new_lines(placed, kubectl: Kubectl, testbed: TestBed):
    namespace, _, _ = placed
    follow, seen = streaming(kubectl, "logs", "-f", POD, "-c", "main", "-n", namespace)
    try:
        wait_for(lambda: "cluster2 line 3\n" in seen, 20, what="the log so far")
        append(testbed, "cluster2 followed")
        wait_for(lambda: "cluster2 followed\n" in seen, 20, what="the appended line")
        assert follow.poll() is None, "still following"
    finally:
        follow.kill()
        follow.wait()


def streaming(kubectl: Kubectl, *args: str) -> tuple[subprocess.Popen, list[str]]:
    """A kubectl that keeps running in cluster1, and the lines it has printed so far."""
    argv = [str(kubectl.bin_dir / "kubectl"), "--context", SOURCE, *args]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=kubectl.env()
    )
    seen: list[str] = []
    threading.Thread(target=lambda: seen.extend(process.stdout), daemon=True).start()
    return process, seen


def append(testbed: TestBed, line: str) -> None:
    with testbed[TARGET].container_log.open("a") as log_file:
        log_file.write(f"2026-01-01T00:00:01.000000000Z stdout F {line}\n")


# -- exec and attach ----------------------------------------------------------------------------


def test_kubectl_exec_runs_there_with_output_and_exit_code(placed, kubectl: Kubectl):
    """What kubectl says through the proxy pod is what it says on the delegate in cluster2,
    output, error output and exit status alike. (kwok reports a command's non-zero exit as an
    error that carries the status in words, not as an exit code: kubectl exits 1 both ways.)"""
    namespace, proxy, _ = placed
    script = 'echo "in $CLUSTER"; echo oops >&2; exit 3'
    ran = kubectl.run(
        SOURCE, "exec", POD, "-n", namespace, "-c", "main", "--", "sh", "-c", script, check=False
    )
    assert ran.stdout == "in cluster2\n"
    assert ran.stderr.startswith("oops\n")
    assert "exit status 3" in ran.stderr
    assert_as_native(kubectl, namespace, proxy, script, ran)
    # Input (kwok's commands never see the end of it, natively either: read what is sent).
    echoed = kubectl.run(
        SOURCE,
        "exec",
        "-i",
        POD,
        "-n",
        namespace,
        "-c",
        "main",
        "--",
        "head",
        "-c",
        "6",
        stdin="hello\n",
    )
    assert echoed.stdout == "hello\n"
    done = kubectl.run(SOURCE, "exec", POD, "-n", namespace, "--", "true", check=False)
    assert done.returncode == 0, done.stderr
    count = "head -c 1000000 | wc -c"
    big = kubectl.run(
        SOURCE, "exec", "-i", POD, "-n", namespace, "--", "sh", "-c", count, stdin="x" * 1_000_000
    )
    assert big.stdout.strip() == "1000000"


def assert_as_native(kubectl: Kubectl, namespace: str, proxy: dict, script: str, ran) -> None:
    """``ran`` (the script through the proxy pod) said what the delegate says when asked in
    cluster2 itself: output, error output and exit status."""
    native = kubectl.run(
        TARGET,
        "exec",
        delegate_name(kubectl, namespace, proxy),
        "-n",
        namespace,
        "-c",
        "main",
        "--",
        "sh",
        "-c",
        script,
        check=False,
    )
    assert (ran.stdout, unwrapped(ran.stderr), ran.returncode) == (
        native.stdout,
        unwrapped(native.stderr),
        native.returncode,
    )


def unwrapped(stderr: str) -> str:
    """An API server that translates a stream to SPDY wraps the kubelet's internal errors once
    more ("Internal error occurred: " again), as it does for any kubelet's."""
    return re.sub(r"(Internal error occurred: )+", "", stderr)


def delegates_of(kubectl: Kubectl, namespace: str, proxy: dict) -> list[dict]:
    uid = proxy["metadata"]["uid"]
    return kubectl.json(
        TARGET, "get", "pods", "-n", namespace, "-l", f"multicluster.admiralty.io/parent-uid={uid}"
    )["items"]


def delegate_name(kubectl: Kubectl, namespace: str, proxy: dict) -> str:
    found = delegates_of(kubectl, namespace, proxy)
    assert len(found) == 1
    return found[0]["metadata"]["name"]


def test_kubectl_attach_connects(placed, kubectl: Kubectl, testbed: TestBed):
    namespace, _, _ = placed
    attach, seen = streaming(kubectl, "attach", POD, "-c", "main", "-n", namespace)
    said = iter(range(1000))

    def attached() -> bool:  # kwok attaches to what the container says from now on
        append(testbed, f"cluster2 attached {next(said)}")
        return any(s.startswith("cluster2 attached") for s in seen)

    try:
        wait_for(attached, 30, interval=1.0, what="attached output")
        assert attach.poll() is None, "still attached"
    finally:
        attach.kill()
        _, errors = attach.communicate()
    assert "error" not in errors.lower(), errors


# -- errors -------------------------------------------------------------------------------------


def test_errors_read_well(placed, kubectl: Kubectl, testbed: TestBed):
    namespace, _, node = placed
    # A container the pod does not have: the API server says so itself.
    wrong = logs(kubectl, namespace, "-c", "nope", check=False)
    assert wrong.returncode != 0
    assert "container nope is not valid for pod debug-me" in wrong.stderr
    # The target's API server down: the agent says which target cannot be reached.
    cluster2 = testbed[TARGET]
    cluster2.stop("kube-apiserver")
    try:
        unreachable = logs(kubectl, namespace, "-c", "main", check=False)
        assert unreachable.returncode != 0
        assert "target c2 is unreachable" in unreachable.stderr, unreachable.stderr
        failed = kubectl.run(
            SOURCE, "exec", POD, "-n", namespace, "-c", "main", "--", "true", check=False
        )
        assert failed.returncode != 0
        assert "target c2 is unreachable" in failed.stderr, failed.stderr
    finally:
        restart_api_server(cluster2, stopped=True)
    wait_for(lambda: node_ready(kubectl, node) == "True", 60, what=f"{node} Ready again")
    # The delegate deleted behind our back: its proxy pod is deleted with it (DelegateLost, as
    # upstream), so nothing is left to exec into. (The moment in between, a delegate not found,
    # is told in tests/virtual_kubelet/test_server.py.)
    kubectl(TARGET, "delete", "pods", "-n", namespace, "-l", "multicluster.admiralty.io/parent-uid")
    wait_for(
        lambda: not kubectl(SOURCE, "get", "pod", POD, "-n", namespace, "--ignore-not-found"),
        30,
        what="the proxy pod of the lost delegate deleted",
    )
    gone = kubectl.run(
        SOURCE, "exec", POD, "-n", namespace, "-c", "main", "--", "true", check=False
    )
    assert gone.returncode != 0
    assert "not found" in gone.stderr, gone.stderr


def test_what_the_target_refuses_is_quoted(placed, kubectl: Kubectl):
    """The source's identity in cluster2 loses pods/exec: the target's own words come back."""
    namespace, _, _ = placed
    role = kubectl.json(TARGET, "get", "clusterrole", "multicluster-scheduler-source")
    rules = role["rules"]

    def replace(new_rules: list[dict]) -> None:
        current = kubectl.json(TARGET, "get", "clusterrole", "multicluster-scheduler-source")
        current["rules"] = new_rules
        kubectl(TARGET, "replace", "-f", "-", stdin=json.dumps(current))

    without = [
        {**r, "resources": [x for x in r["resources"] if x != "pods/exec"]}
        for r in rules
        if r.get("resources") != ["pods/exec"]
    ]
    replace(without)
    try:

        def refused() -> str | None:
            ran = kubectl.run(
                SOURCE, "exec", POD, "-n", namespace, "-c", "main", "--", "true", check=False
            )
            return ran.stderr if 'resource "pods/exec"' in ran.stderr else None

        said = wait_for(refused, 30, what="exec refused by the target")
        assert "target c2: pods " in said
        assert "is forbidden" in said
    finally:
        replace(rules)


# -- who may call -------------------------------------------------------------------------------


def kubelet_endpoint(kubectl: Kubectl, node: str) -> tuple[str, int, dict]:
    status = kubectl.json(SOURCE, "get", "node", node)["status"]
    address = next(a["address"] for a in status["addresses"] if a["type"] == "InternalIP")
    return address, status["daemonEndpoints"]["kubeletEndpoint"]["Port"], status


def get(host: str, port: int, path: str, context: ssl.SSLContext) -> tuple[int, str]:
    connection = http.client.HTTPSConnection(host, port, context=context, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def client_context(testbed: TestBed, cert: bytes | None = None, key: bytes | None = None):
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if cert and key:
        directory = testbed.dir / "kubelet-api-clients"
        directory.mkdir(exist_ok=True)
        stem = str(time.monotonic_ns())
        (directory / f"{stem}.crt").write_bytes(cert)
        (directory / f"{stem}.key").write_bytes(key)
        context.load_cert_chain(directory / f"{stem}.crt", directory / f"{stem}.key")
    return context


def test_only_the_api_server_may_call(placed, kubectl: Kubectl, testbed: TestBed):
    namespace, _, node = placed
    host, port, status = kubelet_endpoint(kubectl, node)
    assert "ExtendWebSocketsToKubelet" in status.get("declaredFeatures", [])
    path = f"/containerLogs/{namespace}/{POD}/main"
    cluster1 = testbed[SOURCE]
    # Serving certificate: issued by the cluster's kubelet-serving signer (its CA).
    with socket.create_connection((host, port), timeout=10) as raw:
        verify = ssl.create_default_context(cadata=cluster1.ca.cert_pem.decode())
        verify.check_hostname = False
        verify.load_cert_chain(*_write(testbed, cluster1.admin))
        with verify.wrap_socket(raw) as tls:
            assert tls.getpeercert() is not None  # verified against the cluster CA
    # No client certificate: the TLS handshake itself fails.
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        get(host, port, path, client_context(testbed))
    # A certificate from another cluster's CA: refused too.
    other = testbed[TARGET].admin
    with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
        get(host, port, path, client_context(testbed, other.cert_pem, other.key_pem))
    # A certificate of this cluster's CA whose user may not proxy to nodes: 403.
    intruder = cluster1.ca.issue("intruder", organizations=("developers",), client=True)
    code, body = get(host, port, path, client_context(testbed, intruder.cert_pem, intruder.key_pem))
    assert code == 403, body
    assert 'user "intruder" may not get nodes/proxy' in body
    # The API server's own kubelet client certificate: served.
    pki = cluster1.dir / "pki"
    served = ssl.create_default_context()
    served.check_hostname = False
    served.verify_mode = ssl.CERT_NONE
    served.load_cert_chain(
        pki / "apiserver-kubelet-client.crt", pki / "apiserver-kubelet-client.key"
    )
    code, body = get(host, port, path, served)
    assert code == 200, body
    assert "cluster2 line 1" in body


def _write(testbed: TestBed, pair) -> tuple[str, str]:
    directory = testbed.dir / "kubelet-api-clients"
    directory.mkdir(exist_ok=True)
    stem = directory / f"admin-{time.monotonic_ns()}"
    cert, key = f"{stem}.crt", f"{stem}.key"
    with open(cert, "wb") as f:
        f.write(pair.cert_pem)
    with open(key, "wb") as f:
        f.write(pair.key_pem)
    return cert, key


# -- SPDY ---------------------------------------------------------------------------------------


def spdy_kubectl(kubectl: Kubectl, *args: str, stdin: str | None = None):
    """kubectl streaming over SPDY, as before 1.30 (and client-go's SPDY executor)."""
    argv = [str(kubectl.bin_dir / "kubectl"), "--context", SOURCE, *args]
    env = kubectl.env() | {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, env=env, timeout=60)


def test_spdy_clients_exec_too(placed, kubectl: Kubectl, testbed: TestBed, installation):
    namespace, proxy, _ = placed
    script = 'echo "in $CLUSTER"; echo oops >&2; exit 3'
    ran = spdy_kubectl(
        kubectl, "exec", POD, "-n", namespace, "-c", "main", "--", "sh", "-c", script
    )
    assert ran.stdout == "in cluster2\n"
    assert_as_native(kubectl, namespace, proxy, script, ran)
    count = "head -c 1000000 | wc -c"
    big = spdy_kubectl(
        kubectl, "exec", "-i", POD, "-n", namespace, "--", "sh", "-c", count, stdin="x" * 1_000_000
    )
    assert big.stdout.strip() == "1000000", big.stderr
    done = spdy_kubectl(kubectl, "exec", POD, "-n", namespace, "-c", "main", "--", "true")
    assert done.returncode == 0, done.stderr
    log = "".join(installation.agent_log(a) for a in installation.agents[SOURCE])
    assert "protocol=v4.channel.k8s.io (SPDY) upstream=v5.channel.k8s.io" in log


def test_the_agent_approves_only_its_own_certificate_requests(
    installation, kubectl: Kubectl, testbed: TestBed
):
    """The chart's policy: a request made by someone else (a real node's, say) is not the
    agent's to approve, whatever its RBAC allows."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from multicluster_scheduler.virtual_kubelet.serving import certificate_request

    pem = certificate_request(ec.generate_private_key(ec.SECP256R1()), "a-real-node", ["10.1.2.3"])
    name = f"someone-else-{time.monotonic_ns()}"
    csr = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64.b64encode(pem).decode(),
            "signerName": "kubernetes.io/kubelet-serving",
            "usages": ["digital signature", "server auth"],
        },
    }
    kubectl.apply(SOURCE, csr)
    try:
        agent = str(testbed[SOURCE].dir / "agent.kubeconfig")
        approved = kubectl.run(
            SOURCE, "--kubeconfig", agent, "certificate", "approve", name, check=False
        )
        assert approved.returncode != 0
        assert "approves only the certificate requests it made" in approved.stderr
        conditions = kubectl.json(SOURCE, "get", "csr", name).get("status", {}).get("conditions")
        assert not conditions
    finally:
        kubectl(SOURCE, "delete", "csr", name, "--ignore-not-found")
