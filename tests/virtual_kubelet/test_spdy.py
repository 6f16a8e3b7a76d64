"""SPDY framing and the server session, without a network: a client's frames in, ours out."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multicluster_scheduler.virtual_kubelet import spdy
from multicluster_scheduler.virtual_kubelet.server import parse_head


def test_the_dictionary_is_the_specifications():
    # SPDY/3 section 2.6.10.1: 1423 bytes (its SHA-256, as every implementation has it).
    assert len(spdy.DICTIONARY) == 1423
    assert (
        hashlib.sha256(spdy.DICTIONARY).hexdigest()
        == "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
    )


@given(
    st.dictionaries(
        st.text("abcdefghijklmnopqrstuvwxyz-", min_size=1, max_size=20),
        st.text(max_size=50),
        max_size=8,
    )
)
def test_header_blocks_round_trip_through_one_zlib_stream_per_direction(headers):
    sender, receiver = spdy.HeaderCodec(), spdy.HeaderCodec()
    for _ in range(3):  # later blocks depend on earlier ones: the same streams throughout
        assert receiver.decode(sender.encode(headers)) == headers


def test_a_partial_frame_waits_for_the_rest():
    frame = spdy.data_frame(5, b"hello", fin=True) + spdy.control_frame(spdy.PING, 0, b"\0\0\0\1")
    buffer = bytearray(frame[:7])
    assert spdy.parse_frames(buffer) == []
    buffer += frame[7:]
    data, ping = spdy.parse_frames(buffer)
    assert (data.control, data.stream_id, data.flags, data.payload) == (False, 5, 1, b"hello")
    assert (ping.control, ping.kind, ping.payload) == (True, spdy.PING, b"\0\0\0\1")
    assert buffer == b""


def test_another_version_is_refused():
    frame = bytearray(struct.pack(">HHI", 0x8000 | 2, spdy.PING, 4) + b"\0\0\0\1")
    with pytest.raises(spdy.ProtocolError, match="version 2"):
        spdy.parse_frames(frame)


class Transport:
    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += data

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def frames(self) -> list[spdy.Frame]:
        return spdy.parse_frames(self.written)


def syn_stream(client: spdy.HeaderCodec, stream_id: int, kind: str, fin: bool = False) -> bytes:
    payload = struct.pack(">IIH", stream_id, 0, 0) + client.encode({"streamtype": kind})
    return spdy.control_frame(spdy.SYN_STREAM, spdy.FLAG_FIN if fin else 0, payload)


async def test_streams_are_answered_and_carry_data_both_ways():
    transport = Transport()
    session = spdy.Session(transport)  # type: ignore[arg-type]
    opened: list[spdy.Stream] = []
    session.on_stream = opened.append
    client, from_server = spdy.HeaderCodec(), spdy.HeaderCodec()
    # Frames that arrive before the upgrade is answered wait.
    session.data_received(syn_stream(client, 1, "error"))
    assert not opened
    session.start()
    session.data_received(syn_stream(client, 3, "stdin") + syn_stream(client, 5, "stdout"))
    assert [(s.id, s.kind) for s in opened] == [(1, "error"), (3, "stdin"), (5, "stdout")]
    replies = transport.frames()
    assert [f.kind for f in replies] == [spdy.SYN_REPLY] * 3
    assert [struct.unpack_from(">I", f.payload)[0] for f in replies] == [1, 3, 5]
    assert from_server.decode(replies[0].payload[4:]) == {}
    session.data_received(spdy.data_frame(3, b"typed") + spdy.data_frame(3, b"", fin=True))
    stdin = opened[1]
    assert [c async for c in stdin.chunks()] == [b"typed"]
    await opened[2].write(b"x" * (spdy.MAX_DATA + 1))
    out = transport.frames()
    assert [(f.stream_id, len(f.payload)) for f in out] == [(5, spdy.MAX_DATA), (5, 1)]
    await session.close()
    closing = transport.frames()
    assert [(f.stream_id, f.flags) for f in closing if not f.control] == [(1, 1), (3, 1), (5, 1)]
    assert closing[-1].kind == spdy.GOAWAY
    assert transport.closing
    assert session.closed.is_set()


async def test_pings_are_answered_and_a_reset_ends_a_stream():
    transport = Transport()
    session = spdy.Session(transport)  # type: ignore[arg-type]
    session.start()
    client = spdy.HeaderCodec()
    session.data_received(syn_stream(client, 1, "stdin"))
    transport.frames()
    session.data_received(spdy.control_frame(spdy.PING, 0, b"\0\0\0\7"))
    (pong,) = transport.frames()
    assert (pong.kind, pong.payload) == (spdy.PING, b"\0\0\0\7")
    session.data_received(spdy.control_frame(spdy.RST_STREAM, 0, struct.pack(">II", 1, 5)))
    assert [c async for c in session.streams[1].chunks()] == []


def test_garbage_closes_the_connection():
    transport = Transport()
    session = spdy.Session(transport)  # type: ignore[arg-type]
    session.start()
    session.data_received(struct.pack(">HHI", 0x8000 | 3, spdy.SYN_STREAM, 12) + b"\0" * 12)
    assert transport.closing
    assert session.closed.is_set()


def test_request_heads():
    head = parse_head(
        b"POST /exec/ns/p/main?command=ls&command=-l&output=1 HTTP/1.1\r\n"
        b"Upgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n"
        b"X-Stream-Protocol-Version: v3.channel.k8s.io"
    )
    assert head is not None
    assert head.method == "POST"
    assert head.url.path == "/exec/ns/p/main"
    assert head.url.query.getall("command") == ["ls", "-l"]
    assert head.headers.getall("x-stream-protocol-version") == [
        "v4.channel.k8s.io",
        "v3.channel.k8s.io",
    ]
    assert parse_head(b"\x16\x03\x01 not http") is None
    assert parse_head(b"GET / HTTP/1.1\r\nno colon here") is None
