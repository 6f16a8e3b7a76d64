"""The server side of SPDY/3.1 as Kubernetes uses it for exec and attach.

API servers before 1.36 (and kubectl before 1.30, or clients built on client-go's SPDY
executor) stream exec and attach to kubelets over SPDY: an HTTP/1.1 upgrade, then frames on
the same connection. The client opens one stream per standard stream (a ``streamtype`` header:
``error``, ``stdin``, ``stdout``, ``stderr``, ``resize``) and the server answers each; data flows
in data frames, and a frame with the FIN flag ends a stream in its direction.

This is the part of the protocol those clients use: no server push, no priorities, and no flow
control (Kubernetes' SPDY library sends no window updates and honours none). Header blocks are
zlib streams with the protocol's dictionary, one stream per direction of a connection.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import zlib
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = (
    1,
    2,
    3,
    4,
    6,
    7,
    8,
    9,
)
FLAG_FIN = 0x01
RST_CANCEL = 5
MAX_DATA = 32 * 1024  # bytes per data frame we send
MAX_FRAME = 1 << 24  # what the 24-bit length allows
HIGH_WATER = 1 << 20  # bytes buffered for the client before writers wait

# The header dictionary of the SPDY/3 specification (section 2.6.10.1): length-prefixed names
# and methods, then common values.
_NAMES = (
    "options head post put delete trace accept accept-charset accept-encoding accept-language "
    "accept-ranges age allow authorization cache-control connection content-base "
    "content-encoding content-language content-length content-location content-md5 "
    "content-range content-type date etag expect expires from host if-match "
    "if-modified-since if-none-match if-range if-unmodified-since last-modified location "
    "max-forwards pragma proxy-authenticate proxy-authorization range referer retry-after "
    "server te trailer transfer-encoding upgrade user-agent vary via warning "
    "www-authenticate method get status"
)
_WORDS = [*_NAMES.split(), "200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie"]
_WORDS += ["keep-alive", "origin"]
_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 "
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
DICTIONARY = b"".join(len(w).to_bytes(4, "big") + w.encode() for w in _WORDS) + _TAIL.encode()


class ProtocolError(Exception):
    pass


# -- frames --------------------------------------------------------------------------------------


def control_frame(kind: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload


def data_frame(stream_id: int, data: bytes, fin: bool = False) -> bytes:
    flags = FLAG_FIN if fin else 0
    return struct.pack(">II", stream_id & 0x7FFFFFFF, (flags << 24) | len(data)) + data


@dataclass(frozen=True)
class Frame:
    control: bool
    kind: int  # control frame type; 0 for data
    stream_id: int  # data frames (control frames carry theirs in the payload)
    flags: int
    payload: bytes


def parse_frames(buffer: bytearray) -> list[Frame]:
    """Complete frames at the start of ``buffer`` (removed from it); a partial one stays."""
    frames = []
    while len(buffer) >= 8:
        first, second = struct.unpack_from(">II", buffer)
        length = second & 0xFFFFFF
        if len(buffer) < 8 + length:
            break
        payload = bytes(buffer[8 : 8 + length])
        del buffer[: 8 + length]
        flags = second >> 24
        if first & 0x80000000:
            version, kind = (first >> 16) & 0x7FFF, first & 0xFFFF
            if version != VERSION:
                raise ProtocolError(f"SPDY version {version} is not supported")
            frames.append(Frame(True, kind, 0, flags, payload))
        else:
            frames.append(Frame(False, 0, first & 0x7FFFFFFF, flags, payload))
    return frames


class HeaderCodec:
    """Name/value header blocks, compressed with the shared zlib stream of each direction."""

    def __init__(self) -> None:
        self._out = zlib.compressobj(zdict=DICTIONARY)
        self._in = zlib.decompressobj(zdict=DICTIONARY)

    def encode(self, headers: dict[str, str]) -> bytes:
        block = struct.pack(">I", len(headers))
        for name, value in headers.items():
            raw_name, raw_value = name.lower().encode(), value.encode()
            block += struct.pack(">I", len(raw_name)) + raw_name
            block += struct.pack(">I", len(raw_value)) + raw_value
        return self._out.compress(block) + self._out.flush(zlib.Z_SYNC_FLUSH)

    def decode(self, data: bytes) -> dict[str, str]:
        try:
            block = self._in.decompress(data)
        except zlib.error as e:
            raise ProtocolError(f"bad header block: {e}") from e
        try:
            (count,) = struct.unpack_from(">I", block)
            offset, headers = 4, {}
            for _ in range(count):
                (size,) = struct.unpack_from(">I", block, offset)
                name = block[offset + 4 : offset + 4 + size].decode()
                offset += 4 + size
                (size,) = struct.unpack_from(">I", block, offset)
                value = block[offset + 4 : offset + 4 + size].decode()
                offset += 4 + size
                headers[name] = value
        except (struct.error, UnicodeDecodeError) as e:
            raise ProtocolError(f"bad header block: {e}") from e
        return headers


# -- a connection --------------------------------------------------------------------------------


@dataclass
class Stream:
    """One stream the client opened: what it sends arrives on ``received`` (None: it finished),
    and :meth:`write` sends to it."""

    session: Session
    id: int
    headers: dict[str, str]
    received: asyncio.Queue = field(default_factory=asyncio.Queue)
    finished: bool = False  # we sent FIN

    @property
    def kind(self) -> str:
        return self.headers.get("streamtype", "")

    async def write(self, data: bytes) -> None:
        for start in range(0, len(data), MAX_DATA):
            await self.session.send(data_frame(self.id, data[start : start + MAX_DATA]))

    async def close(self) -> None:
        if not self.finished:
            self.finished = True
            await self.session.send(data_frame(self.id, b"", fin=True))

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        while True:
            chunk = await self.received.get()
            if chunk is None:
                return
            yield chunk


class Session(asyncio.Protocol):
    """The server end of a SPDY connection, once the upgrade is answered. ``on_stream`` hears
    of each stream the client opens."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.codec = HeaderCodec()
        self.streams: dict[int, Stream] = {}
        self.on_stream: Callable[[Stream], None] | None = None
        self.closed = asyncio.Event()
        self._buffer = bytearray()
        self._started = False
        self._can_write = asyncio.Event()
        self._can_write.set()

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # set_protocol skips it
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if self._started:
            self._process()

    def eof_received(self) -> bool:
        self._end()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._end()
        self._can_write.set()

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    # use
    def start(self) -> None:
        """Read frames from now on (the upgrade has been answered)."""
        self._started = True
        self._process()

    async def send(self, frame: bytes) -> None:
        if self.transport.is_closing():
            raise ConnectionResetError("the SPDY connection is closed")
        self.transport.write(frame)
        if not self._can_write.is_set():
            await self._can_write.wait()

    async def close(self) -> None:
        """FIN on every stream still open, GOAWAY, and the connection closed once flushed."""
        for stream in list(self.streams.values()):
            try:
                await stream.close()
            except ConnectionResetError:
                break
        if not self.transport.is_closing():
            last = max(self.streams, default=0)
            self.transport.write(control_frame(GOAWAY, 0, struct.pack(">II", last, 0)))
            self.transport.close()
        self._end()

    def _end(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for stream in self.streams.values():
            stream.received.put_nowait(None)

    def _process(self) -> None:
        try:
            for frame in parse_frames(self._buffer):
                self._handle(frame)
        except ProtocolError as e:
            log.warning("SPDY connection closed: %s", e)
            self.transport.close()
            self._end()

    def _handle(self, frame: Frame) -> None:
        if not frame.control:
            stream = self.streams.get(frame.stream_id)
            if stream is None:
                return
            if frame.payload:
                stream.received.put_nowait(frame.payload)
            if frame.flags & FLAG_FIN:
                stream.received.put_nowait(None)
            return
        payload = frame.payload
        if frame.kind == SYN_STREAM:
            if len(payload) < 10:
                raise ProtocolError("short SYN_STREAM")
            (stream_id,) = struct.unpack_from(">I", payload)
            stream_id &= 0x7FFFFFFF
            headers = self.codec.decode(payload[10:])
            stream = Stream(self, stream_id, headers)
            self.streams[stream_id] = stream
            reply = struct.pack(">I", stream_id) + self.codec.encode({})
            self.transport.write(control_frame(SYN_REPLY, 0, reply))
            if frame.flags & FLAG_FIN:
                stream.received.put_nowait(None)
            if self.on_stream is not None:
                self.on_stream(stream)
        elif frame.kind == RST_STREAM:
            (stream_id,) = struct.unpack_from(">I", payload)
            stream = self.streams.get(stream_id & 0x7FFFFFFF)
            if stream is not None:
                stream.finished = True
                stream.received.put_nowait(None)
        elif frame.kind == PING:
            self.transport.write(control_frame(PING, 0, payload))
        elif frame.kind == GOAWAY:
            self._end()
        elif frame.kind == HEADERS and len(payload) >= 4:
            self.codec.decode(payload[4:])  # keeps the zlib stream in step
        # SETTINGS, WINDOW_UPDATE and the rest: nothing to do without flow control.
