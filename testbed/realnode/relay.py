"""The network between a real node's namespace and the machine, without touching the machine's.

A real node lives in a network namespace of its own (its pods on a bridge in there), so that
nothing kubelet, containerd or the CNI plugins do to networking reaches the machine's own
interfaces, routes or iptables. The control plane stays on the machine's loopback. Three relays,
all in the node's init process, join the two without a route, an interface or a rule on the
machine:

- the API server's egress: kube-apiserver sends its "cluster" traffic (webhooks behind
  Services, kubelet calls for logs and exec, the ``proxy`` subresources) through an HTTP
  CONNECT proxy on a Unix socket (``--egress-selector-config-file``, as konnectivity is used);
  addresses on the node's network are dialled inside the namespace, the others (kwok's fake
  nodes on 127.0.0.1) on the machine;
- the ``kubernetes`` Service: inside the namespace, its cluster IP is an address of its own, and
  connections to it are forwarded to the API server on the machine: what kube-proxy does for
  that one Service;
- the machine as pods see it: one address inside the namespace whose ports are the API servers
  of the test bed's clusters, so that a pod of one cluster reaches another (a Target's
  kubeconfig names it, as kind users name the Docker host).

Sockets on the machine's side are made in its network namespace (``setns`` around
``socket()``, then used from here); a socket keeps the namespace it was made in.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ipaddress
import logging
import os
import socket
from collections.abc import Callable, Iterable

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
log = logging.getLogger("relay")


class Namespaces:
    """Makes sockets in the machine's network namespace or in this process's own."""

    def __init__(self, host_netns_fd: int) -> None:
        self.host = host_netns_fd
        self.own = os.open("/proc/self/ns/net", os.O_RDONLY)

    def _setns(self, fd: int) -> None:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns: {os.strerror(errno)}")

    def host_socket(self) -> socket.socket:
        self._setns(self.host)
        try:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        finally:
            self._setns(self.own)
        sock.setblocking(False)
        return sock


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(65536):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if sink.can_write_eof():
                sink.write_eof()
            else:
                sink.close()


# The tasks of the connections being relayed. asyncio keeps a connection's task only through its
# transport, and the loop keeps a transport only while it reads: one whose reading is paused
# (its peer is slower, a big list in flight) would be garbage-collected with its task ("Task was
# destroyed but it is pending!"), leaving both sides of the connection open and silent.
_relaying: set[asyncio.Task] = set()


async def splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    b: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Copy both ways until both sides are done, then close both."""
    task = asyncio.current_task()
    if task is not None:
        _relaying.add(task)
        task.add_done_callback(_relaying.discard)
    try:
        await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))
    finally:
        for writer in (a[1], b[1]):
            writer.close()


class Dialer:
    """Opens TCP connections: to ``inside`` networks from the node's namespace, to anything
    else from the machine's (``host_socket`` makes a socket there)."""

    def __init__(self, host_socket: Callable[[], socket.socket], inside: Iterable[str]) -> None:
        self.host_socket = host_socket
        self.inside = [ipaddress.ip_network(n) for n in inside]

    def is_inside(self, host: str) -> bool:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self.inside)

    async def open(
        self, host: str, port: int, timeout: float = 10.0
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.is_inside(host):
            return await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        sock = self.host_socket()
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout)
        except BaseException:
            sock.close()
            raise
        return await asyncio.open_connection(sock=sock)


class EgressProxy:
    """kube-apiserver's egress for the "cluster" network: HTTP CONNECT on a Unix socket."""

    def __init__(self, path: str, dialer: Dialer) -> None:
        self.path = path
        self.dialer = dialer

    async def start(self) -> asyncio.AbstractServer:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        server = await asyncio.start_unix_server(self._handle, self.path)
        os.chmod(self.path, 0o600)
        return server

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            writer.close()
            return
        request = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(request) != 3 or request[0] != "CONNECT":
            writer.write(b"HTTP/1.1 405 Method Not Allowed\r\n\r\n")
            writer.close()
            return
        host, _, port = request[1].rpartition(":")
        host = host.strip("[]")
        try:
            upstream = await self.dialer.open(host, int(port))
        except (OSError, ValueError, TimeoutError) as e:
            log.info("egress refused target=%s error=%r", request[1], e)
            writer.write(b"HTTP/1.1 502 Bad Gateway\r\n\r\n")
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await splice((reader, writer), upstream)


class Forwarder:
    """Listens on an address inside the node's namespace; connections go to ``target`` on the
    machine."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int], dialer: Dialer) -> None:
        self.listen = listen
        self.target = target
        self.dialer = dialer

    async def start(self) -> asyncio.AbstractServer:
        return await asyncio.start_server(
            self._handle, self.listen[0], self.listen[1], reuse_address=True
        )

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream = await self.dialer.open(*self.target)
        except (OSError, TimeoutError) as e:
            log.info("forward refused listen=%s:%s error=%r", *self.listen, e)
            writer.close()
            return
        await splice((reader, writer), upstream)
