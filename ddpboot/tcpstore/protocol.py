"""torch's TCPStore wire protocol, written once for ddpboot's server (server.py) and client (client.py).

As torch defines it (torch/csrc/distributed/c10d/TCPStoreBackend.hpp; checked byte by byte against torch 2.13's own
server through a recording proxy): a request is one QueryType byte followed by its arguments; strings and byte
vectors are a native uint64 length and the bytes; integers are native int64. A client first sends VALIDATE with
VALIDATION_MAGIC. Codes are only ever appended in torch, so a newer client speaks the same codes plus new ones.

Limits (docs/security.md): a request takes at most MAX_REQUEST bytes and a list in it at most MAX_KEYS keys (torch's
own server, TCPStoreLibUvBackend.cpp, allows 128 Ki keys too, and values of 8 MiB, keys of 8 KiB); beyond that it is
a ProtocolError, raised as soon as the length or count that breaks the limit arrives, before the rest is buffered.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping

VALIDATION_MAGIC = 0x3C85F7CE

# QueryType, in torch's order.
VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND = range(10)
MULTI_GET, MULTI_SET, CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN, LIST_KEYS = range(10, 18)

READY, NOT_READY = 0, 1  # CheckResponseType
STOP_WAITING, WAIT_CANCELED = 0, 1  # WaitResponseType

U8 = struct.Struct("=B")
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")
I64 = struct.Struct("=q")
MAX_REQUEST = 64 << 20  # bytes of one request, its arguments included
MAX_KEYS = 128 << 10  # keys (or key-value pairs) of one request's list

# What a request's arguments are, for Framer: a positive number is a field of that many bytes; BLOB a byte vector
# (uint64 length, then the bytes); KEYS a uint64 count then that many byte vectors; PAIRS a count then that many
# pairs of byte vectors.
BLOB, KEYS, PAIRS = -1, -2, -3
Shape = tuple[int, ...]


def vec(value: bytes) -> bytes:
    """A byte vector on the wire: its uint64 length, then the bytes."""
    return U64.pack(len(value)) + value


def vecs(values: Iterable[bytes]) -> bytes:
    """A list of byte vectors on the wire (CHECK's and WAIT's keys): the uint64 count, then each vector."""
    items = list(values)
    return U64.pack(len(items)) + b"".join(vec(v) for v in items)


class NeedMore(Exception):
    """The buffer does not hold a whole request yet; `total` is a lower bound of the bytes it needs."""

    def __init__(self, total: int) -> None:
        self.total = total


class ProtocolError(Exception):
    """A request the server cannot take: the connection is closed. `kind` says which rule it broke (the server
    warns once per kind)."""

    def __init__(self, message: str, kind: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind or message


def checked_length(n: int, what: str = "a value") -> int:
    """A byte vector's length, or a request's size, within MAX_REQUEST."""
    if n > MAX_REQUEST:
        raise ProtocolError(f"{what} of {n} bytes, more than the store takes in one request ({MAX_REQUEST >> 20} MiB)",
                            "request size")
    return n


def checked_count(n: int, what: str = "a list") -> int:
    if n > MAX_KEYS:
        raise ProtocolError(f"{what} of {n} keys, more than the store takes in one request ({MAX_KEYS})", "key count")
    return n


class Reader:
    """Reads one request's fields out of a buffer (a connection's bytearray, or a view of the bytes just
    received), raising NeedMore when it runs short."""

    def __init__(self, buf: bytearray | memoryview) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise NeedMore(end)
        out = bytes(self.buf[self.pos : end])
        self.pos = end
        return out

    def _number(self, kind: struct.Struct) -> int:
        """A fixed-size number at the read position, unpacked in place (no copy)."""
        end = self.pos + kind.size
        if end > len(self.buf):
            raise NeedMore(end)
        value = int(kind.unpack_from(self.buf, self.pos)[0])
        self.pos = end
        return value

    def u8(self) -> int:
        return self._number(U8)

    def u32(self) -> int:
        return self._number(U32)

    def i64(self) -> int:
        return self._number(I64)

    def count(self, what: str = "a list") -> int:
        """A uint64 count of keys to follow; beyond MAX_KEYS it is a ProtocolError naming `what` was sent."""
        return checked_count(self._number(U64), what)

    def blob(self) -> bytes:
        return self._take(checked_length(self._number(U64)))

    def blobs(self) -> list[bytes]:
        return [self.blob() for _ in range(self.count())]


class Framer:
    """Finds where a request ends while its bytes arrive over many reads, reading each length and count once.

    Reader, which the handlers use, reads a request from its start: run again on each read of a request that
    arrives 64 KiB at a time, a WAIT of 100,000 keys would be read from its first key every time. The server
    therefore runs a request's handler once it has all arrived, and a Framer (made where a request was found cut
    short) says when that is. Its state counts from the request's first byte, so the buffer may drop what came
    before. The limits are checked as the lengths and counts arrive: a request declared too large is refused
    before its bytes are buffered."""

    def __init__(self, shapes: Mapping[int, Shape]) -> None:
        self.shapes = shapes
        self.fields: Shape | None = None  # the request's arguments, once its type byte is known
        self.field = 0  # the next of them to scan
        self.blobs = 0  # byte vectors still to scan in the current list
        self.size = 0  # the request's bytes known so far: up to the next length or count to read

    def end(self, buf: bytearray | memoryview, start: int) -> int | None:
        """Where in `buf` the request that starts at `start` ends, once all of it is there; None until then."""
        have = len(buf) - start
        if self.fields is None:
            if have < 1:
                return None
            self.fields = self.shapes.get(buf[start], ())  # an unknown type: its handler lookup refuses it
            self.size = 1
        while True:
            if self.blobs or (self.field < len(self.fields) and self.fields[self.field] < BLOB):
                if self.size + U64.size > have:
                    return None
                self._counted(U64.unpack_from(buf, start + self.size)[0])
            elif self.field < len(self.fields):
                kind = self.fields[self.field]
                self.field += 1
                if kind == BLOB:
                    self.blobs = 1
                else:
                    self._grow(kind)
            else:
                return start + self.size if self.size <= have else None

    def _counted(self, n: int) -> None:
        """The length of the next byte vector (`n` of its bytes follow), or the count of the list that starts."""
        self._grow(U64.size)
        if self.blobs:
            self.blobs -= 1
            self._grow(checked_length(n))
            return
        kind = self.fields[self.field] if self.fields is not None else KEYS
        self.field += 1
        self.blobs = checked_count(n) * (2 if kind == PAIRS else 1)

    def _grow(self, n: int) -> None:
        self.size += n
        checked_length(self.size, "a request")
