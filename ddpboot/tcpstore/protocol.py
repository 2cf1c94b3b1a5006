"""torch's TCPStore wire protocol, written once for ddpboot's server (server.py) and client (client.py).

As torch defines it (torch/csrc/distributed/c10d/TCPStoreBackend.hpp; checked byte by byte against torch 2.13's own
server through a recording proxy): a request is one QueryType byte followed by its arguments; strings and byte
vectors are a native uint64 length and the bytes; integers are native int64. A client first sends VALIDATE with
VALIDATION_MAGIC. Codes are only ever appended in torch, so a newer client speaks the same codes plus new ones.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

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
MAX_LEN = 1 << 40  # a length or count beyond this is a corrupt stream, not a value


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
    """A request the server cannot take: the connection is closed."""


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

    def count(self, what: str, unit: str) -> int:
        """A uint64 count of `unit`s to follow; beyond MAX_LEN it is a ProtocolError naming `what` was sent."""
        n = self._number(U64)
        if n > MAX_LEN:
            raise ProtocolError(f"{what} of {n} {unit}")
        return n

    def blob(self) -> bytes:
        return self._take(self.count("a value", "bytes"))

    def blobs(self) -> list[bytes]:
        return [self.blob() for _ in range(self.count("a list", "keys"))]
