"""The TCPStore wire format (ddpboot.tcpstore.protocol): torch's encoding of byte vectors and lists, and a reader
that says how many bytes a request cut short still needs."""

from __future__ import annotations

import struct

import pytest

from ddpboot.tcpstore.protocol import MAX_LEN, NeedMore, ProtocolError, Reader, vec, vecs


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


def test_an_impossible_length_is_a_protocol_error() -> None:
    with pytest.raises(ProtocolError, match=f"a value of {MAX_LEN + 1} bytes"):
        Reader(bytearray(struct.pack("=Q", MAX_LEN + 1))).blob()
    with pytest.raises(ProtocolError, match="a list of"):
        Reader(bytearray(struct.pack("=Q", MAX_LEN + 1))).blobs()
