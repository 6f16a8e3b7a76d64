"""The kubelet API's decisions, without a cluster: who the caller is, how kubelet queries become
API server ones, which delegate a request is for, and how errors reach the user."""

from __future__ import annotations

import ssl

import orjson
import pytest
from multidict import MultiDict

from multicluster_scheduler.api import keys
from multicluster_scheduler.api.proxy import delegate_pod
from multicluster_scheduler.targets.delegates import DelegateLookup
from multicluster_scheduler.targets.registry import TargetConnection, TargetRegistry
from multicluster_scheduler.virtual_kubelet.access import server_context, user_of
from multicluster_scheduler.virtual_kubelet.channels import log_params, status_frame, stream_params
from multicluster_scheduler.virtual_kubelet.node import node_status, status_differs
from multicluster_scheduler.virtual_kubelet.server import KubeletError, KubeletServer, _text


def test_user_and_groups_come_from_the_certificate_subject():
    peercert = {
        "subject": (
            (("organizationName", "kubeadm:cluster-admins"),),
            (("organizationName", "system:nodes"),),
            (("commonName", "kube-apiserver-kubelet-client"),),
        )
    }
    assert user_of(peercert) == (
        "kube-apiserver-kubelet-client",
        ["kubeadm:cluster-admins", "system:nodes"],
    )
    assert user_of(None) == ("", [])


def test_kubelet_exec_query_becomes_the_api_servers():
    query = MultiDict(
        [
            ("command", "sh"),
            ("command", "-c"),
            ("command", "echo hi"),
            ("input", "1"),
            ("output", "1"),
            ("error", "1"),
            ("tty", "0"),
        ]
    )
    assert stream_params(query, "main", "exec") == [
        ("container", "main"),
        ("stdin", "true"),
        ("stdout", "true"),
        ("stderr", "true"),
        ("command", "sh"),
        ("command", "-c"),
        ("command", "echo hi"),
    ]
    attach = stream_params(MultiDict([("output", "1"), ("tty", "1")]), "side", "attach")
    assert attach == [("container", "side"), ("stdout", "true"), ("tty", "true")]


def test_log_options_pass_through_and_nothing_else():
    query = MultiDict(
        [("follow", "true"), ("tailLines", "5"), ("sinceSeconds", "10"), ("evil", "x")]
    )
    assert log_params(query, "main") == [
        ("container", "main"),
        ("follow", "true"),
        ("sinceSeconds", "10"),
        ("tailLines", "5"),
    ]


def test_errors_on_the_error_channel_are_a_status_from_v4():
    frame = status_frame("v5.channel.k8s.io", "target c2 is unreachable", "InternalError", 500)
    assert isinstance(frame, bytes)
    assert frame[0] == 3
    status = orjson.loads(frame[1:])
    assert status["status"] == "Failure"
    assert status["message"] == "target c2 is unreachable"
    assert status["reason"] == "InternalError"
    assert status_frame("channel.k8s.io", "no", "BadRequest", 400) == b"\x03no"
    assert status_frame("base64.channel.k8s.io", "no", "BadRequest", 400) == "3bm8="


@pytest.mark.parametrize(
    ("status", "sent"), [(400, 400), (403, 403), (404, 400), (500, 500), (503, 500)]
)
def test_errors_use_codes_whose_body_the_api_server_shows(status: int, sent: int):
    response = _text(KubeletError(status, "why"))
    assert response.status == sent
    assert response.text == "why"


class Proxies:
    def __init__(self, *pods: dict) -> None:
        self.pods = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}

    def get(self, name: str, namespace: str) -> dict | None:
        return self.pods.get((namespace, name))


class Delegates:
    def __init__(self, *pods: dict, synced: bool = True) -> None:
        self.pods = pods
        self.has_synced = synced
        self.last_error = None if synced else OSError("connection refused")

    def by_index(self, _index: str, uid: str) -> list[dict]:
        return [p for p in self.pods if p["metadata"]["labels"][keys.PARENT_UID] == uid]


ME = "me"


def proxy(name: str, node: str, uid: str = "u1") -> dict:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid}, "spec": {"nodeName": node}}


def delegate(of: dict, *, deleting: bool = False, cluster: str = ME, **meta: str) -> dict:
    """The delegate cluster ``cluster`` makes of proxy pod ``of`` (``meta``: changed)."""
    made = delegate_pod(of, {"spec": {"containers": [{"name": "c"}]}}, cluster)
    made["metadata"].update({"uid": "d-" + made["metadata"]["name"], **meta})
    if deleting:
        made["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return made


def server(proxies: Proxies, *connections: TargetConnection, leading: bool = True):
    registry = TargetRegistry()
    for connection in connections:
        registry.connections[connection.node_name] = connection
    lookup = DelegateLookup(registry, proxies, ME)  # type: ignore[arg-type]
    return KubeletServer(lookup, None, host="", port=0, leading=lambda: leading)


def connected(name: str, *delegates: dict, ready: bool = True) -> TargetConnection:
    connection = TargetConnection("Target", name, "ns", cluster=object())  # type: ignore[arg-type]
    connection.delegates = Delegates(*delegates)  # type: ignore[assignment]
    connection.ready = ready
    connection.message = "" if ready else "cannot connect to 10.0.0.1:6443: Connection refused"
    return connection


def test_a_request_finds_the_live_delegate_in_the_pods_target():
    c2 = connected("c2")
    p = proxy("p", c2.node_name)
    live = delegate(p)
    c2.delegates = Delegates(delegate(p, deleting=True, uid="old"), live)  # type: ignore
    found = server(Proxies(p), c2).locate("ns", "p")
    assert found.connection is c2
    assert found.delegate is live


def test_what_is_missing_is_said():
    c2 = connected("c2", ready=False)
    api = server(Proxies(proxy("p", c2.node_name), proxy("q", "admiralty-gone")), c2)
    with pytest.raises(KubeletError, match="pod ns/nope is not a proxy pod"):
        api.locate("ns", "nope")
    with pytest.raises(KubeletError, match="target of node admiralty-gone is not connected"):
        api.locate("ns", "q")
    with pytest.raises(KubeletError) as missing:
        api.locate("ns", "p")
    assert "the delegate of pod ns/p is gone from target c2" in missing.value.message
    assert "Connection refused" in missing.value.message
    assert missing.value.status == 404
    with pytest.raises(KubeletError, match="does not lead"):
        server(Proxies(), leading=False).locate("ns", "p")


def test_a_target_that_cannot_be_read_is_not_said_to_have_lost_the_delegate():
    c2 = connected("c2", ready=False)
    c2.reason = "Unreachable"
    c2.delegates = Delegates(synced=False)  # type: ignore[assignment]
    with pytest.raises(KubeletError) as away:
        server(Proxies(proxy("p", c2.node_name)), c2).locate("ns", "p")
    assert away.value.status == 503
    assert away.value.message.startswith(
        "target c2 cannot be read now (Unreachable: cannot connect to 10.0.0.1:6443: "
        "Connection refused): the delegate of pod ns/p may still run there"
    )
    assert "gone" not in away.value.message


def test_virtual_nodes_declare_websocket_streaming_and_a_change_of_port_is_written():
    status = node_status(None, True, "", "", address="10.0.0.5", port=10250)
    assert status["declaredFeatures"] == ["ExtendWebSocketsToKubelet"]
    assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
    moved = node_status(None, True, "", "", address="10.0.0.5", port=10251)
    assert status_differs(status, moved)
    assert not status_differs(
        status, node_status(None, True, "", "", address="10.0.0.5", port=10250)
    )
    # A server that drops the field (before 1.35) is not rewritten for it at every pass...
    dropped = {k: v for k, v in status.items() if k != "declaredFeatures"}
    assert not status_differs(dropped, status)
    # ...but one that keeps it is told of a change.
    off = node_status(None, True, "", "", address="10.0.0.5", port=10250, features=[])
    assert status_differs(status, off)


def _accepts(server: ssl.SSLContext, client: ssl.SSLContext) -> bool:
    """Whether a TLS handshake between the two contexts succeeds on the server's side."""
    to_server, to_client = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_end = server.wrap_bio(to_server, to_client, server_side=True)
    client_end = client.wrap_bio(to_client_in := ssl.MemoryBIO(), to_server_out := ssl.MemoryBIO())
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, end in (("client", client_end), ("server", server_end)):
            if done[name]:
                continue
            try:
                end.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError:
                return False
        to_server.write(to_server_out.read())
        to_client_in.write(to_client.read())
        if done["server"]:
            return True
    return False


def test_tls_requires_a_client_certificate_of_the_client_ca_and_trusts_nothing_else(
    tmp_path, monkeypatch
):
    from multicluster_scheduler.webhook.certificates import new_ca, new_serving_certificate

    client_ca, serving_ca, public_ca = new_ca("client-ca"), new_ca("serving"), new_ca("public")
    serving = new_serving_certificate(serving_ca, ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)
    # A CA the system trusts (OpenSSL's default file) must not be trusted for clients.
    (tmp_path / "system.pem").write_bytes(public_ca.cert_pem)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "system.pem"))
    context = server_context(tmp_path / "tls.crt", tmp_path / "tls.key", client_ca.cert_pem)

    def client(ca=None) -> ssl.SSLContext:
        made = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        made.check_hostname = False
        made.verify_mode = ssl.CERT_NONE
        if ca is not None:
            pair = new_client_certificate(ca)
            (tmp_path / "client.crt").write_bytes(pair.cert_pem)
            (tmp_path / "client.key").write_bytes(pair.key_pem)
            made.load_cert_chain(tmp_path / "client.crt", tmp_path / "client.key")
        return made

    assert _accepts(context, client(client_ca))
    assert not _accepts(context, client())
    assert not _accepts(context, client(public_ca))
    assert not _accepts(context, client(serving_ca))


def new_client_certificate(ca):
    """A client certificate signed by ``ca`` (the serving helper's, with client auth)."""
    import datetime as dt

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    from multicluster.pki import KeyPair

    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "someone")]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), pem)


def test_only_this_clusters_delegate_in_the_pods_namespace_gets_the_session():
    """Pods that copy the proxy's uid (and anything else they can) are not its delegate."""
    c2 = connected("c2")
    p = proxy("p", c2.node_name)
    planted = [
        delegate(p, cluster="other"),
        delegate(p, namespace="ns2"),
        delegate(p, name="p-planted"),
    ]
    real = delegate(p)
    c2.delegates = Delegates(*planted, real)  # type: ignore[assignment]
    api = server(Proxies(p), c2)
    assert api.locate("ns", "p").delegate is real
    c2.delegates = Delegates(*planted)  # type: ignore[assignment]
    with pytest.raises(KubeletError, match="is gone from target c2"):
        api.locate("ns", "p")


async def test_a_new_client_ca_replaces_the_old_for_new_connections(tmp_path):
    import asyncio

    from multicluster_scheduler.webhook.certificates import new_ca, new_serving_certificate

    old_ca, new_ca_pair, serving_ca = new_ca("old"), new_ca("new"), new_ca("serving")
    serving = new_serving_certificate(serving_ca, ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(serving.cert_pem)
    (tmp_path / "tls.key").write_bytes(serving.key_pem)

    def context_for(ca) -> ssl.SSLContext:
        return server_context(tmp_path / "tls.crt", tmp_path / "tls.key", ca.cert_pem)

    def client_of(ca) -> ssl.SSLContext:
        pair = new_client_certificate(ca)
        (tmp_path / "c.crt").write_bytes(pair.cert_pem)
        (tmp_path / "c.key").write_bytes(pair.key_pem)
        made = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        made.check_hostname, made.verify_mode = False, ssl.CERT_NONE
        made.load_cert_chain(tmp_path / "c.crt", tmp_path / "c.key")
        return made

    async def healthy(context: ssl.SSLContext) -> bool:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = await reader.read()
            writer.close()
            return answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
        except (ssl.SSLError, ConnectionError):
            return False

    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lookup = DelegateLookup(TargetRegistry(), Proxies(), ME)  # type: ignore[arg-type]
    api = KubeletServer(lookup, None, host="127.0.0.1", port=port)
    serving_task = asyncio.create_task(api.serve(context_for(old_ca)))
    for _ in range(100):
        if api.started:
            break
        await asyncio.sleep(0.02)
    old_client, new_client = client_of(old_ca), client_of(new_ca_pair)
    assert await healthy(old_client)
    assert not await healthy(new_client)
    await api.use_context(context_for(new_ca_pair))
    assert await healthy(new_client)
    assert not await healthy(old_client), "the rotated-out CA is trusted no more"
    serving_task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await serving_task
