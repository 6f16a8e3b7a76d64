"""A webhook server on loopback, serving a certificate from a fresh CA."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from multicluster.pki import KeyPair
from multicluster_scheduler.webhook.certificates import new_ca, new_serving_certificate
from multicluster_scheduler.webhook.server import WebhookServer
from tests.webhook.sealing import KEY


@dataclass
class Served:
    server: WebhookServer
    ca: KeyPair
    first: KeyPair
    port: int
    cert_dir: Path


@pytest.fixture
async def served(tmp_path: Path):
    ca = new_ca("test-ca")
    first = new_serving_certificate(ca, ["127.0.0.1"])
    (tmp_path / "tls.crt").write_bytes(first.cert_pem)
    (tmp_path / "tls.key").write_bytes(first.key_pem)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = WebhookServer("127.0.0.1", port, tmp_path / "tls.crt", tmp_path / "tls.key", KEY)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(10):
            while not server.started:
                await asyncio.sleep(0.02)
        yield Served(server, ca, first, port, tmp_path)
    finally:
        server.server.should_exit = True
        await task
