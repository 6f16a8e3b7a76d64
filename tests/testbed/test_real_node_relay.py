"""The real node's relays without namespaces: the API server's CONNECT egress and the
forwarders, over loopback (the machine's side is this process's own network here)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from testbed.realnode.relay import Dialer, EgressProxy, Forwarder


def plain_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


@pytest.fixture
async def echo():
    """A TCP server that answers every line with itself, upper-cased; its port."""

    async def handle(reader, writer):
        while line := await reader.readline():
            writer.write(line.upper())
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


def test_addresses_of_the_node_network_are_dialled_inside():
    dialer = Dialer(plain_socket, ["10.88.0.0/24"])
    assert dialer.is_inside("10.88.0.7")
    assert not dialer.is_inside("127.0.0.1")
    assert not dialer.is_inside("10.89.0.1")
    assert not dialer.is_inside("node-name")


async def test_connect_through_the_egress_socket(tmp_path, echo):
    proxy = EgressProxy(str(tmp_path / "egress.sock"), Dialer(plain_socket, ["10.88.0.0/24"]))
    server = await proxy.start()
    try:
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        writer.write(f"CONNECT 127.0.0.1:{echo} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 200 Connection established\r\n\r\n"
        writer.write(b"hello\n")
        assert await reader.readline() == b"HELLO\n"
        writer.close()
    finally:
        server.close()


async def test_an_unreachable_target_is_a_bad_gateway(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    proxy = EgressProxy(str(tmp_path / "egress.sock"), Dialer(plain_socket, []))
    server = await proxy.start()
    try:
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        writer.write(f"CONNECT 127.0.0.1:{closed} HTTP/1.1\r\n\r\n".encode())
        assert (await reader.read()).startswith(b"HTTP/1.1 502")
        reader, writer = await asyncio.open_unix_connection(proxy.path)
        writer.write(b"GET / HTTP/1.1\r\n\r\n")
        assert (await reader.read()).startswith(b"HTTP/1.1 405")
    finally:
        server.close()


async def test_a_forwarder_relays_to_its_target(echo):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    forwarder = Forwarder(("127.0.0.1", port), ("127.0.0.1", echo), Dialer(plain_socket, []))
    server = await forwarder.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"through\n")
        assert await reader.readline() == b"THROUGH\n"
        writer.write_eof()
        assert await reader.read() == b""
    finally:
        server.close()
