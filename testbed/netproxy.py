"""A loopback TCP forwarder for network faults: a cluster that appears late, or connections
that go silent without closing (half-open), as real networks do; and a balancer in front of
replicas, as a Service is."""

from __future__ import annotations

import asyncio
import socket
import threading


class TcpProxy:
    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self._server: asyncio.Server | None = None
        self._connections: list[asyncio.Event] = []
        self._tasks: set = set()

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
            # Held here: a connection whose reading is paused is held by nothing else, and
            # would be garbage-collected with its task.
            task = asyncio.current_task()
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
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


class TcpBalancer:
    """What a Service is to the replicas behind it: one address (``port``) whose connections go
    to the first of ``upstreams`` that accepts, round-robin; with none up, a connection is reset
    at once, as a Service without ready endpoints refuses it. Runs in a thread of its own, so
    that blocking test code can use it."""

    def __init__(self, port: int, upstreams: list[int]) -> None:
        self.port = port
        self.upstreams = list(upstreams)
        self._next = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._open: set[asyncio.WriteTransport] = set()

    def start(self) -> None:
        ready = threading.Event()
        self._loop = asyncio.new_event_loop()

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            self._server = self._loop.run_until_complete(
                asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)
            )
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=run, name=f"balancer-{self.port}", daemon=True)
        self._thread.start()
        ready.wait(10)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        for _ in range(len(self.upstreams)):
            port = self.upstreams[self._next % len(self.upstreams)]
            self._next += 1
            try:
                return await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream = await self._connect()
        if upstream is None:
            writer.transport.abort()
            return
        transports = (writer.transport, upstream[1].transport)
        self._open.update(transports)

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                sink.close()

        await asyncio.gather(
            pipe(reader, upstream[1]), pipe(upstream[0], writer), return_exceptions=True
        )
        self._open.difference_update(transports)

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def close() -> None:
            server.close()
            for transport in list(self._open):
                transport.abort()

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = self._server = self._thread = None
