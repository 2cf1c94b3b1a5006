"""The TCPStore wire format (ddpboot.tcpstore.protocol): torch's encoding of byte vectors and lists, a reader that
says how many bytes a request cut short still needs, the limits of one request, and the framer that finds where a
request ends as it arrives, reading each of its lengths once."""

from __future__ import annotations

import struct

import pytest

from ddpboot.tcpstore.commands import SHAPES
from ddpboot.tcpstore.protocol import (
    GETNUMKEYS,
    MAX_KEYS,
    MAX_REQUEST,
    MULTI_SET,
    SET,
    WAIT,
    Framer,
    NeedMore,
    ProtocolError,
    Reader,
    vec,
    vecs,
)


def test_vectors_are_a_native_uint64_length_then_the_bytes() -> None:
    assert vec(b"abc") == struct.pack("=Q", 3) + b"abc"
    assert vecs([b"a", b"bc"]) == struct.pack("=Q", 2) + vec(b"a") + vec(b"bc")
    assert vecs([]) == struct.pack("=Q", 0)


def test_the_reader_takes_fields_in_order() -> None:
    buf = bytearray(struct.pack("=BIq", 6, 0x3C85F7CE, -5) + vecs([b"k1", b"k2"]) + vec(b"v"))
    r = Reader(buf)
    assert (r.u8(), r.u32(), r.i64()) == (6, 0x3C85F7CE, -5)
    assert r.blobs() == [b"k1", b"k2"]
    assert r.blob() == b"v"
    assert r.pos == len(buf)


def test_a_request_cut_short_needs_more_bytes() -> None:
    whole = vec(b"value")
    with pytest.raises(NeedMore) as cut_in_length:
        Reader(bytearray(whole[:3])).blob()
    assert cut_in_length.value.total == 8
    with pytest.raises(NeedMore) as cut_in_bytes:
        Reader(bytearray(whole[:10])).blob()
    assert cut_in_bytes.value.total == len(whole)


def test_a_length_or_count_beyond_the_limits_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match=f"a value of {MAX_REQUEST + 1} bytes, more than the store takes"):
        Reader(bytearray(struct.pack("=Q", MAX_REQUEST + 1))).blob()
    with pytest.raises(ProtocolError, match=f"a list of {MAX_KEYS + 1} keys"):
        Reader(bytearray(struct.pack("=Q", MAX_KEYS + 1))).blobs()
    assert Reader(bytearray(struct.pack("=Q", MAX_KEYS) + vec(b"k"))).count() == MAX_KEYS


def _end(request: bytes, start: int = 0) -> int | None:
    return Framer(SHAPES).end(bytearray(request), start)


def test_the_framer_finds_where_a_request_ends_however_it_is_cut() -> None:
    """Each prefix of a request is not yet a request, the whole is; fed the same bytes in two reads (one Framer),
    it finds the same end; the next request's bytes after it change nothing."""
    requests = [bytes([SET]) + vec(b"key") + vec(b"value"), bytes([WAIT]) + vecs([b"a", b"", b"ccc"]),
                bytes([MULTI_SET]) + struct.pack("=Q", 2) + vec(b"k1") + vec(b"v1") + vec(b"k2") + vec(b""),
                bytes([GETNUMKEYS])]
    for whole in requests:
        for cut in range(len(whole)):
            assert _end(whole[:cut]) is None, (whole, cut)
            framer = Framer(SHAPES)
            assert framer.end(bytearray(whole[:cut]), 0) is None
            assert framer.end(bytearray(whole + b"\x07"), 0) == len(whole), (whole, cut)
        assert _end(b"\x07" * 5 + whole, 5) == 5 + len(whole)


def test_the_framer_resumes_where_it_stopped_and_never_reads_a_length_twice() -> None:
    """A WAIT of MAX_KEYS empty keys (1 MiB) arriving 64 KiB at a time: after each read, every byte the framer has
    already read is overwritten with 0xFF (a length of 2^64 - 1 if it were read again, a ProtocolError): it still
    finds the end, so each read only looks at what is new, and the work is linear in the request's size."""
    whole = bytes([WAIT]) + vecs([b""] * MAX_KEYS)
    framer = Framer(SHAPES)
    buf = bytearray()
    end = None
    for at in range(0, len(whole), 1 << 16):
        buf += whole[at : at + (1 << 16)]
        end = framer.end(buf, 0)
        if end is None:
            buf[: framer.size] = b"\xff" * framer.size  # what it has read: it must never look there again
    assert end == len(whole)


def test_a_request_declared_too_large_is_refused_as_soon_as_its_length_arrives() -> None:
    """A key of 2^39 bytes is refused from its first 9 bytes; a list of more keys than MAX_KEYS from its count; and
    values each within the limit but over it together, once their lengths add up past it."""
    with pytest.raises(ProtocolError, match=f"of {1 << 39} bytes"):
        _end(bytes([SET]) + struct.pack("=Q", 1 << 39))
    with pytest.raises(ProtocolError, match=f"a list of {MAX_KEYS + 1} keys"):
        _end(bytes([WAIT]) + struct.pack("=Q", MAX_KEYS + 1))
    half = MAX_REQUEST // 2
    with pytest.raises(ProtocolError, match=r"a request of \d+ bytes, more than the store takes in one request"):
        _end(bytes([SET]) + struct.pack("=Q", half) + b"k" * half + struct.pack("=Q", half))
    assert _end(bytes([SET]) + struct.pack("=Q", half) + b"k" * half + struct.pack("=Q", 0)) == half + 17
