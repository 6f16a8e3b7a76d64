"""A loopback TCP forwarder for network faults: a cluster that appears late, or connections
that go silent without closing (half-open), as real networks do."""

from __future__ import annotations

import asyncio
import socket


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._server: asyncio.Server | None = None
        self._connections: list[asyncio.Event] = []

    async def start(self) -> None:
        """Start listening (until then, connections are refused)."""

        async def pipe(reader, writer, flowing: asyncio.Event):
            try:
                while data := await reader.read(65536):
                    await flowing.wait()
                    writer.write(data)
                    await writer.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                writer.close()

        async def handle(reader, writer):
            try:
                up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
            except OSError:
                writer.close()
                return
            flowing = asyncio.Event()
            flowing.set()
            self._connections.append(flowing)
            await asyncio.gather(
                pipe(reader, up_writer, flowing),
                pipe(up_reader, writer, flowing),
                return_exceptions=True,
            )

        self._server = await asyncio.start_server(handle, "127.0.0.1", self.port)

    def stall_existing(self) -> int:
        """Stop forwarding on every open connection, without closing it; new ones still work."""
        for flowing in self._connections:
            flowing.clear()
        stalled = len(self._connections)
        self._connections = []
        return stalled

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
