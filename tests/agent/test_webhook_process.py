"""The webhook served from a child process: answers over TLS, counts seen by the agent's
metrics, a reloaded certificate served, the child gone when the agent stops serving it, and
nothing of the agent's runtime loaded in the child."""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import socket
import ssl
from pathlib import Path

import aiohttp
import orjson
import pytest

from multicluster import metrics
from multicluster_scheduler.api import keys
from multicluster_scheduler.api.manifest_mac import ManifestKey, user_hash, verify
from multicluster_scheduler.webhook.certificates import new_ca, new_serving_certificate
from multicluster_scheduler.webhook.server import AnswerCounts, WebhookProcess
from tests.agent.test_webhook_server import elected_pod, review
from tests.webhook.json_patch import apply_patch
from tests.webhook.sealing import KEY, NAMESPACE, USER


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def patched() -> float:
    labels = {"webhook": "proxy-pods", "result": "patched"}
    return metrics.REGISTRY.get_sample_value("webhook_requests_total", labels) or 0.0


async def served_certificate(port: int, ca_pem: bytes) -> bytes:
    context = ssl.create_default_context(cadata=ca_pem.decode())
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
    return ssl.DER_cert_to_PEM_cert(der).encode()


@pytest.mark.timeout(60)
async def test_the_webhook_answers_from_its_own_process_and_stops_with_the_agent(tmp_path: Path):
    ca = new_ca("test-ca")
    first = new_serving_certificate(ca, ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(first.cert_pem)
    (tmp_path / "tls.key").write_bytes(first.key_pem)
    port = free_port()
    server = WebhookProcess("127.0.0.1", port, tmp_path / "tls.crt", tmp_path / "tls.key", KEY)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                await asyncio.sleep(0.05)
        before = patched()
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        connector = aiohttp.TCPConnector(ssl=context)
        async with aiohttp.ClientSession(connector=connector) as session:
            for _ in range(3):
                async with session.post(
                    f"https://127.0.0.1:{port}/mutate", json=review(elected_pod())
                ) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["response"]["patchType"] == "JSONPatch"
        assert patched() == before + 3, "the child's answers show in this process's metrics"

        second = new_serving_certificate(ca, ["127.0.0.1"])
        (tmp_path / "next.crt").write_bytes(second.cert_pem)
        (tmp_path / "next.key").write_bytes(second.key_pem)
        server.reload_certificate(tmp_path / "next.crt", tmp_path / "next.key")
        async with asyncio.timeout(10):
            while await served_certificate(port, ca.cert_pem) != second.cert_pem:
                await asyncio.sleep(0.05)

        # A reload that fails is logged; the process goes on serving what it had.
        server.reload_certificate(tmp_path / "missing.crt", tmp_path / "missing.key")
        await asyncio.sleep(0.5)
        assert await served_certificate(port, ca.cert_pem) == second.cert_pem
        server.reload_certificate(tmp_path / "next.crt", tmp_path / "next.key")

        # A webhook process that dies is started again (the replica unready meanwhile).
        first_pid = server.pid
        os.kill(first_pid, signal.SIGKILL)
        async with asyncio.timeout(30):
            while not (server.started and server.pid != first_pid):
                await asyncio.sleep(0.05)
        async with asyncio.timeout(10):
            while await served_certificate(port, ca.cert_pem) != second.cert_pem:
                await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    with pytest.raises(ConnectionRefusedError):
        await served_certificate(port, ca.cert_pem)


def test_the_webhook_process_loads_neither_the_runtime_nor_the_kubernetes_package():
    import subprocess
    import sys

    probe = (
        "import sys, multicluster_scheduler.webhook.child; "
        "print(sorted(m for m in ('multicluster', 'kubernetes', 'fastapi', 'pydantic') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


AGENT = """
import asyncio, sys
from pathlib import Path
from multicluster_scheduler.webhook.server import WebhookProcess
from tests.webhook.sealing import KEY

async def main():
    cert, key, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    server = WebhookProcess("127.0.0.1", port, cert, key, KEY)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    print(server.pid, flush=True)
    await task

asyncio.run(main())
"""


@pytest.mark.timeout(60)
async def test_the_webhook_process_dies_with_an_agent_that_is_killed(tmp_path: Path):
    """Killed at once (SIGKILL, out of memory), the agent takes its webhook with it, as one
    container would: no admission is answered by a webhook whose agent is gone."""
    import sys

    ca = new_ca("test-ca")
    pair = new_serving_certificate(ca, ["127.0.0.1"])
    pair.write(tmp_path / "tls.crt", tmp_path / "tls.key")
    port = free_port()
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        AGENT,
        str(tmp_path / "tls.crt"),
        str(tmp_path / "tls.key"),
        str(port),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert agent.stdout is not None
        async with asyncio.timeout(30):
            child = int(await agent.stdout.readline())
        await served_certificate(port, ca.cert_pem)
        # Stopped, the child cannot see its stdin close: only the kernel can end it.
        os.kill(child, signal.SIGSTOP)
        agent.kill()
        await agent.wait()
        async with asyncio.timeout(2):
            while _alive(child):
                await asyncio.sleep(0.01)
        with pytest.raises(ConnectionRefusedError):
            await served_certificate(port, ca.cert_pem)
    finally:
        if agent.returncode is None:
            agent.kill()


def _alive(pid: int) -> bool:
    """Running or stopped (a zombie, waiting to be reaped, serves nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _rss(pid: int) -> int:
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.timeout(60)
async def test_the_webhook_process_gives_back_what_a_burst_of_connections_took(tmp_path: Path):
    """The API server opens a connection per admission in flight: 400 at once, each with one
    admission, then closed. The process held about 40 MiB more for good before it trimmed its
    heap (glibc returns only the heap's top); now it comes back near where it was."""
    ca = new_ca("test-ca")
    new_serving_certificate(ca, ["127.0.0.1"]).write(tmp_path / "tls.crt", tmp_path / "tls.key")
    port = free_port()
    server = WebhookProcess("127.0.0.1", port, tmp_path / "tls.crt", tmp_path / "tls.key", KEY)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                await asyncio.sleep(0.05)
        assert server.pid is not None
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        body = orjson.dumps(review(elected_pod()))
        request = b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        request += b"Content-Length: %d\r\n\r\n%s" % (len(body), body)

        async def admit(
            connection: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        ) -> None:
            reader, writer = connection
            writer.write(request)
            assert (await reader.readuntil(b"\r\n")).split()[1] == b"200"
            await reader.readuntil(b"\r\n\r\n")

        async def burst() -> None:
            connections = await asyncio.gather(
                *(asyncio.open_connection("127.0.0.1", port, ssl=context) for _ in range(400))
            )
            await asyncio.gather(*(admit(c) for c in connections))
            for _, writer in connections:
                writer.close()

        before = _rss(server.pid)
        await burst()
        async with asyncio.timeout(10):
            while _rss(server.pid) > before + 16 * 2**20:
                await asyncio.sleep(0.2)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.timeout(60)
async def test_the_key_reaches_the_webhook_process_on_its_stdin_only(tmp_path: Path):
    """The process seals with the agent's key, which is neither in its arguments nor in its
    environment (both readable in /proc by whoever shares the node's PID namespace)."""
    key = ManifestKey.new()
    ca = new_ca("test-ca")
    new_serving_certificate(ca, ["127.0.0.1"]).write(tmp_path / "tls.crt", tmp_path / "tls.key")
    port = free_port()
    server = WebhookProcess("127.0.0.1", port, tmp_path / "tls.crt", tmp_path / "tls.key", key)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(30):
            while not server.started:
                await asyncio.sleep(0.05)
        shown = b"".join(
            Path(f"/proc/{server.pid}/{name}").read_bytes()  # noqa: ASYNC240 (tiny, in /proc)
            for name in ("cmdline", "environ")
        )
        for form in (key.secret, base64.b64encode(key.secret), key.secret.hex().encode()):
            assert form not in shown
        context = ssl.create_default_context(cadata=ca.cert_pem.decode())
        connector = aiohttp.TCPConnector(ssl=context)
        async with aiohttp.ClientSession(connector=connector) as session:
            pod = elected_pod()
            async with session.post(f"https://127.0.0.1:{port}/mutate", json=review(pod)) as resp:
                patch = orjson.loads(base64.b64decode((await resp.json())["response"]["patch"]))
        annotations = apply_patch(pod, patch)["metadata"]["annotations"]
        found = verify(
            key,
            NAMESPACE,
            annotations[keys.SOURCEPOD_MANIFEST],
            annotations[keys.SOURCEPOD_MANIFEST_MAC],
        )
        assert found.user == user_hash(USER)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_a_webhook_process_given_no_key_does_not_serve():
    import subprocess
    import sys

    counts = AnswerCounts()
    child = subprocess.run(
        [sys.executable, "-m", "multicluster_scheduler.webhook.child", "--host=127.0.0.1",
         "--port=1", "--cert-file=x", "--key-file=y", f"--counts-fd={counts.fd}"],
        input=b"not a key\n", capture_output=True, timeout=30, pass_fds=(counts.fd,),
    )  # fmt: skip
    assert b"no manifest key on stdin: not serving" in child.stderr
    assert b"not a key" not in child.stderr
