"""A tenant points a Target at a server of its own, and that server answers as no API server
does (issue 19, attacks 3 and 4), tried as an attacker would:

- lists of 100 MB, sent without a length, however small a page is asked for;
- a watch that sends one line of 300 MB, in small pieces, without a newline;
- a watch that sends valid events of new objects without end;
- a kubeconfig ``server`` with a path and a query, to make the agent call any URL;
- error answers and non-JSON answers that hold something the tenant wants to read back.

The agent must stay under the chart's memory limit (512 MiB) and give that memory back when the
Target goes, spend little CPU on such a server, keep placing other tenants' pods meanwhile, and
quote nothing of what the server said into the Target's status or events.
"""

from __future__ import annotations

import json
import secrets
import select
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from e2e.scenarios import (
    SOURCE,
    TARGET,
    all_running,
    as_tenant,
    cluster_name,
    connect,
    disconnect,
    grant_tenant,
    kubeconfig_for,
    nginx,
    nothing_left,
    tenant_target,
    virtual_nodes,
)
from e2e.scenarios import target_ready as ready
from testbed import TestBed, wait_for
from testbed.install import Installation
from testbed.kubectl import Kubectl

CHART_MEMORY_LIMIT = 512 << 20  # values.yaml: agent.resources.limits.memory
MIB = 1 << 20
LIST_BYTES = 100 * MIB
LINE_BYTES = 300 * MIB
EMPTY_LIST = b'{"kind":"List","metadata":{"resourceVersion":"1"},"items":[]}'
ATTACK = 30.0  # seconds each attack is kept up: retries and back-off both happen


# -- the hostile server ---------------------------------------------------------------------------


class Hostile(ThreadingHTTPServer):
    """An HTTP server that answers every request as ``mode`` says, and notes what was asked."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.mode = "big-list"
        self.marker = "leak-" + secrets.token_hex(8)
        self.requests: list[str] = []
        self.sent = 0  # bytes of bodies written before the agent hung up
        # "forged-copies": what the source's name is, how many copies of each kind to forge
        self.source = ""
        self.forged = 0
        self.deleting: dict[str, int] = {}  # DELETEs held now, by resource
        self.most_deleting: dict[str, int] = {}  # ... the most at once
        self.deletes = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"  # the body ends when the connection closes: no length said
    server: Hostile

    def log_message(self, *_args) -> None:
        pass

    def do_GET(self) -> None:
        server = self.server
        server.requests.append(self.path)
        watch = "watch=1" in self.path or "watch=true" in self.path
        try:
            if server.mode == "forged-copies":
                self._forged(watch)
            elif server.mode == "error-body":
                self._answer(500, "text/plain", f"admin dump: {server.marker}\n".encode() * 50)
            elif server.mode == "not-json":
                self._answer(200, "text/html", f"<html>{server.marker}</html>".encode())
            elif server.mode == "long-line" and watch:
                self._stream(b'{"type":"ADDED","object":{"metadata":{"name":"', LINE_BYTES)
            elif server.mode == "endless-events" and watch:
                self._endless_events()
            elif server.mode in ("long-line", "endless-events") or watch:
                self._answer(200, "application/json", b'{"metadata":{"resourceVersion":"1"}}')
            else:
                self._big_list()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent stopped reading: what it should do

    def do_DELETE(self) -> None:
        """Each DELETE is held longer than any client waits, then accepted."""
        server = self.server
        server.requests.append("DELETE " + self.path)
        resource = self.path.split("?")[0].split("/")[-2]
        with server.lock:
            server.deletes += 1
            held = server.deleting[resource] = server.deleting.get(resource, 0) + 1
            server.most_deleting[resource] = max(server.most_deleting.get(resource, 0), held)
        try:
            # Held until the client gives up (it closes the connection: a worker of its own no
            # longer waits here, and is not counted) or for 30 s.
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                readable, _, _ = select.select([self.connection], [], [], 0.2)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    return
            self._answer(200, "application/json", b'{"kind":"Status","status":"Success"}')
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with server.lock:
                server.deleting[resource] -= 1

    def _forged(self, watch: bool) -> None:
        """Empty lists; then, for Services and ConfigMaps, watch events of ``forged`` objects
        that say they are the source's copies, and nothing more for a minute."""
        path = self.path.split("?")[0]
        parts = path.split("/")
        resource = parts[-1]
        namespace = parts[parts.index("namespaces") + 1] if "namespaces" in parts else "default"
        if not watch:
            self._answer(200, "application/json", EMPTY_LIST)
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        if resource in ("services", "configmaps"):
            for i in range(self.server.forged):
                name = f"forged-{i}"
                annotations = {
                    "multicluster.admiralty.io/parent-cluster-name": self.server.source,
                    "multicluster.admiralty.io/parent-namespace": namespace,
                    "multicluster.admiralty.io/parent-name": name,
                }
                meta = {
                    "name": name,
                    "namespace": namespace,
                    "uid": f"{resource}-{i}",
                    "resourceVersion": str(i + 2),
                    "creationTimestamp": "2020-01-01T00:00:00Z",
                    "labels": {"multicluster.admiralty.io/parent-uid": f"p{i}"},
                    "annotations": annotations,
                }
                event = {"type": "ADDED", "object": {"metadata": meta}}
                self.wfile.write(json.dumps(event).encode() + b"\n")
            self.wfile.flush()
        time.sleep(60)

    def _answer(self, code: int, kind: str, body: bytes) -> None:
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def _stream(self, head: bytes, size: int, piece: int = 16 << 10) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(head)
        chunk = b"a" * piece
        for _ in range(size // piece):
            self.wfile.write(chunk)
            self.server.sent += piece

    def _endless_events(self) -> None:
        """New objects, 4 KiB each, as fast as the agent reads them, for as long as it does."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        pad = "a" * 4000
        for i in range(10**7):
            event = {
                "type": "ADDED",
                "object": {
                    "metadata": {
                        "name": f"e{i}",
                        "namespace": "default",
                        "uid": f"u{i}",
                        "resourceVersion": str(i + 2),
                        "labels": {"multicluster.admiralty.io/parent-uid": f"p{i}"},
                        "annotations": {"pad": pad},
                    }
                },
            }
            line = json.dumps(event).encode() + b"\n"
            self.wfile.write(line)
            self.server.sent += len(line)

    def _big_list(self) -> None:
        """A list of 1 MiB objects, 100 MB in all, whatever ``limit`` asks."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"kind":"List","metadata":{"resourceVersion":"1"},"items":[')
        pad = b"a" * MIB
        for i in range(LIST_BYTES // MIB):
            item = b'{"metadata":{"name":"x%d","namespace":"default","uid":"u%d"},"pad":"' % (i, i)
            self.wfile.write((b"," if i else b"") + item + pad + b'"}')
            self.server.sent += MIB
        self.wfile.write(b"]}")


@pytest.fixture
def hostile(kubectl: Kubectl, namespace: str) -> Iterator[Hostile]:
    """The server; afterwards, the Target pointing at it deleted and its node gone (before the
    namespace goes: the next agents would otherwise meet a Target in a terminating namespace)."""
    server = Hostile()
    thread = threading.Thread(target=server.serve_forever, name="hostile", daemon=True)
    thread.start()
    yield server
    kubectl(SOURCE, "delete", "target", "evil", "-n", namespace, "--ignore-not-found")
    # A server that holds every request makes each cleanup of the removal (copies of Services
    # and Ingresses, config maps, secrets, the heartbeat) wait its 10 s, one after the other.
    wait_for(lambda: not virtual_nodes(kubectl, namespace), 75, what="the virtual node gone")
    server.shutdown()
    server.server_close()


# -- the agent, seen from outside -----------------------------------------------------------------


def agent_pid(installation: Installation) -> int:
    pid = installation.agents[SOURCE][0].pid
    assert pid is not None, "cluster1's agent is not running"
    return pid


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (the peak since the last reset) of ``pid``, in bytes."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) * 1024
    return found


def reset_peak(pid: int) -> None:
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak RSS starts over from now


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / 100  # utime + stime, in clock ticks (USER_HZ)


def same_agent(installation: Installation, pid: int) -> None:
    assert agent_pid(installation) == pid, "the agent restarted (out of memory or crashed?)"


# -- the Target -----------------------------------------------------------------------------------


def hostile_target(kubectl: Kubectl, testbed: TestBed, namespace: str, server: str) -> None:
    """The tenant's Secret and Target ``evil``, pointing at ``server``."""
    tenant_target(kubectl, namespace, kubeconfig_for(testbed, "any-token", server=server))


def target_condition(kubectl: Kubectl, namespace: str) -> dict:
    return ready(kubectl.json(SOURCE, "get", "target", "evil", "-n", namespace))


def said_about(kubectl: Kubectl, namespace: str) -> str:
    """Everything the Target's status and events say."""
    events = kubectl.json(SOURCE, "get", "events", "-n", namespace)["items"]
    return json.dumps(
        [target_condition(kubectl, namespace)]
        + [e.get("message") for e in events if e["involvedObject"].get("name") == "evil"]
    )


def waits_with(kubectl: Kubectl, namespace: str, reason: str, says: str, *others) -> dict:
    """The Target's Ready condition once its reason and message are one of the pairs given."""
    wanted = [(reason, says), *zip(others[::2], others[1::2], strict=True)]

    def found() -> dict:
        condition = target_condition(kubectl, namespace)
        ok = any(
            condition.get("reason") == r and s in condition.get("message", "") for r, s in wanted
        )
        return condition if ok else {}

    return wait_for(found, 120, what=f"Target evil {' or '.join(f'{r}: {s}' for r, s in wanted)}")


@pytest.fixture
def good_tenant(kubectl: Kubectl, testbed: TestBed, installation: Installation) -> Iterator[str]:
    """Another tenant's namespace, connected to c1 and c2 and enabled."""
    name = f"g{secrets.token_hex(4)}"
    for context in testbed.clusters:
        kubectl(context, "create", "namespace", name)
    connect(kubectl, testbed, name)
    kubectl(SOURCE, "label", "namespace", name, "multicluster-scheduler=enabled")
    yield name
    kubectl(SOURCE, "delete", "deployments", "--all", "-n", name)
    wait_for(lambda: nothing_left(kubectl, name), 60, what=f"{name} emptied")
    disconnect(kubectl, name)
    for context in testbed.clusters:
        kubectl(context, "delete", "namespace", name, "--wait=false")


# -- 3. a server that answers too much ------------------------------------------------------------


def test_a_target_answering_huge_lists_and_lines_costs_bounded_memory_and_cpu(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    hostile: Hostile,
    good_tenant: str,
):
    """Before: 100 MB lists took the agent from 88 MB to 1.1 GB, not released after the Target
    was deleted; a 300 MB line without a newline cost full CPU for minutes, through quadratic
    buffering, and slowed every tenant's placements."""
    pid = agent_pid(installation)
    grant_tenant(kubectl, namespace)
    time.sleep(2)
    before = memory(pid)["VmRSS"]
    reset_peak(pid)

    hostile_target(kubectl, testbed, namespace, hostile.url)
    wait_for(lambda: hostile.requests, 30, what="the agent asking the hostile server")
    attacked = time.monotonic()
    kubectl(SOURCE, "apply", "-n", good_tenant, "-f", "-", stdin=nginx(10))
    wait_for(lambda: all_running(kubectl, good_tenant, 10), 60, what="another tenant's pods")
    placed = time.monotonic() - attacked
    time.sleep(max(0.0, ATTACK - placed))
    lists = memory(pid)
    sent = hostile.sent
    print(
        f"big lists: RSS {before / MIB:.0f} MiB before, peak {lists['VmHWM'] / MIB:.0f} MiB; "
        f"{len(hostile.requests)} requests, {sent / MIB:.0f} MiB sent; another tenant's 10 pods "
        f"Running {placed:.1f} s after the attack began"
    )
    assert lists["VmHWM"] < CHART_MEMORY_LIMIT
    same_agent(installation, pid)
    condition = waits_with(kubectl, namespace, "InvalidResponse", "not read further")
    print("big lists:", condition["message"])
    assert hostile.marker not in said_about(kubectl, namespace)

    hostile.mode = "long-line"
    condition = waits_with(kubectl, namespace, "InvalidResponse", "a watch event is over")
    print("long lines:", condition["message"])
    cpu, sent = cpu_seconds(pid), hostile.sent
    time.sleep(ATTACK)
    used = cpu_seconds(pid) - cpu
    lines = memory(pid)
    print(
        f"long lines: {used:.1f} s of CPU in {ATTACK:.0f} s, peak {lines['VmHWM'] / MIB:.0f} "
        f"MiB, {(hostile.sent - sent) / MIB:.0f} MiB read"
    )
    assert used < ATTACK * 0.25, "a quarter of a core at most"
    assert lines["VmHWM"] < CHART_MEMORY_LIMIT

    # A server that answered as no API server does is not asked again for minutes (the pause
    # grows each time): the third attack comes from a Target made anew, as a tenant would.
    as_tenant(kubectl, namespace, "delete", "target", "evil")
    wait_for(lambda: not virtual_nodes(kubectl, namespace), 75, what="the virtual node gone")
    hostile.mode = "endless-events"
    hostile_target(kubectl, testbed, namespace, hostile.url)
    # Whichever bound is met first: the cache budget, or the rate of events when the server
    # sends them faster than the agent may read (a busy agent parses slower, and fills first).
    condition = waits_with(
        kubectl, namespace,
        "CacheFull", "would cache over 32 MiB",
        "InvalidResponse", "watch events come faster than 4 MiB a second",
    )  # fmt: skip
    print("endless events:", condition["message"])
    sent = hostile.sent
    time.sleep(ATTACK)
    events = memory(pid)
    print(
        f"endless events: peak {events['VmHWM'] / MIB:.0f} MiB, "
        f"{(hostile.sent - sent) / MIB:.0f} MiB read in {ATTACK:.0f} s"
    )
    assert events["VmHWM"] < CHART_MEMORY_LIMIT

    as_tenant(kubectl, namespace, "delete", "target", "evil")
    wait_for(lambda: not virtual_nodes(kubectl, namespace), 75, what="the virtual node gone")
    time.sleep(5)
    after = memory(pid)["VmRSS"]
    print(f"after the Target went: RSS {after / MIB:.0f} MiB (before: {before / MIB:.0f} MiB)")
    assert after - before < 64 * MIB, "the memory was given back"
    same_agent(installation, pid)


# -- 4. a server that is not an API server, to read something back --------------------------------


def test_a_server_url_with_a_path_or_query_is_refused_and_never_called(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    hostile: Hostile,
):
    """Before: ``http://host:port/admin/dump?x=`` made the agent call that URL (with ours
    appended as the query's value) and echo 500 characters of a non-2xx answer into the
    Target's status, readable by the tenant."""
    grant_tenant(kubectl, namespace)
    hostile.mode = "error-body"
    hostile_target(kubectl, testbed, namespace, hostile.url + "/admin/dump?x=")
    condition = waits_with(kubectl, namespace, "InvalidKubeconfig", "has a path and a query")
    print(condition["message"])
    time.sleep(3)
    assert hostile.requests == [], "the agent called the server anyway"


@pytest.mark.parametrize("mode", ["error-body", "not-json"])
def test_what_a_server_that_is_not_an_api_server_says_is_never_quoted(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    hostile: Hostile,
    mode: str,
):
    """500s with a plain-text body and 200s with HTML: the Target says what was wrong, by
    status code or kind of answer, and quotes nothing the server wrote."""
    grant_tenant(kubectl, namespace)
    hostile.mode = mode
    hostile_target(kubectl, testbed, namespace, hostile.url)
    reason, says = {
        "error-body": ("Unreachable", "not a Kubernetes Status: not quoted"),
        "not-json": ("InvalidResponse", "not JSON (not quoted)"),
    }[mode]
    condition = waits_with(kubectl, namespace, reason, says)
    print(condition["message"])
    assert hostile.requests, "the server was asked"
    time.sleep(3)
    assert hostile.marker not in said_about(kubectl, namespace)


# -- a server that holds every request: other tenants' copies keep going -----------------------


def test_a_target_holding_deletes_of_forged_copies_holds_no_other_tenants_copies(
    installation: Installation,
    testbed: TestBed,
    kubectl: Kubectl,
    namespace: str,
    hostile: Hostile,
    good_tenant: str,
):
    """Before: a target naming hundreds of Services and ConfigMaps as this cluster's copies, and
    holding each DELETE of them until the agent gave up (10 s), held every worker of the
    services and follow controllers: another tenant's global Service waited minutes for its
    copy. Now a target's owner holds two workers of each controller at most."""
    grant_tenant(kubectl, namespace)
    kubectl(SOURCE, "label", "namespace", namespace, "multicluster-scheduler=enabled")
    hostile.mode, hostile.source, hostile.forged = "forged-copies", cluster_name(kubectl), 300
    hostile_target(kubectl, testbed, namespace, hostile.url)
    wait_for(lambda: hostile.deletes >= 2, 60, what="the agent deleting forged copies")
    time.sleep(5)  # every worker the target may hold is held by now
    asked = time.monotonic()
    kubectl.apply(
        SOURCE,
        f"""apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {good_tenant}
  annotations: {{multicluster.admiralty.io/global: "true"}}
spec:
  selector: {{app: web}}
  ports: [{{port: 80}}]
""",
    )

    def copied() -> bool:
        found = kubectl(TARGET, "get", "service", "web", "-n", good_tenant, "--ignore-not-found")
        return "web" in found

    wait_for(copied, 30, what="another tenant's Service copied to cluster2")
    took = time.monotonic() - asked
    most = dict(hostile.most_deleting)
    print(
        f"another tenant's Service copied in {took:.1f} s; {hostile.deletes} DELETEs held by "
        f"the target, at most at once: {most}"
    )
    assert most.get("services", 0) <= 2
    assert most.get("configmaps", 0) <= 2
    kubectl(SOURCE, "delete", "service", "web", "-n", good_tenant)
