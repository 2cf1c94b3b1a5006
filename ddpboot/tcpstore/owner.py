"""Only the job's owner (and root) may use its store: the check the server makes when it accepts a connection.

Loopback is shared by every user of a machine, so without a check any local process could write the job's keys,
read their count or hold its ranks in a WAIT. A connection from a loopback address (127.0.0.0/8, ::1, or
::ffff:127.x) is let in only when the kernel's socket tables (peer.py) say that its client socket belongs to an
allowed uid; anything else, including a client whose socket is already gone, is closed before the server reads a
byte. Connections from other addresses (the other nodes of a multi-node job) are not judged here: allow.py
checks them against the job's hosts where those are known.

Where the kernel's tables cannot be read at all (a sandbox without sock_diag netlink and without /proc/net), no
connection's owner can be known; refusing them all would make every job hang at its rendezvous, so the store then
serves every connection, as it did before the check, and says so once.

docs/security.md describes the guarantee and its measured cost.
"""

from __future__ import annotations

import enum
import functools
import os
import pwd
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpboot.tcpstore.allow import plain_address
from ddpboot.tcpstore.peer import Endpoint, SocketEntry, SocketTables, TablesUnavailable

ROOT = 0
PID_SEARCH_SECONDS = 0.2  # the most one refusal spends looking for the client's process in /proc


class Allow(enum.Enum):
    """The default of StoreServer's `allowed_uids`: the server process's own uid, and root."""

    OWNER_AND_ROOT = "owner-and-root"


def resolve_allowed_uids(choice: frozenset[int] | Allow | None) -> frozenset[int] | None:
    """The uids a store admits (None: no check)."""
    if choice is Allow.OWNER_AND_ROOT:
        return frozenset({os.getuid(), ROOT})
    return choice


@functools.lru_cache(maxsize=1024)
def is_loopback_peer(address: str) -> bool:
    """127.0.0.0/8, ::1, and IPv4-mapped loopback (a dual-stack listener sees 127.0.0.1 as ::ffff:127.0.0.1).
    Cached: a job's connections come from a few addresses, and parsing one was a fifth of the check's cost."""
    parsed = plain_address(address)
    return parsed is not None and parsed.is_loopback


@dataclass(frozen=True)
class Verdict:
    """Whether a connection may use the store, and whose it is (uid None: the kernel no longer knows)."""

    allowed: bool
    uid: int | None
    inode: int = 0


def judge(entry: SocketEntry | None, allowed: frozenset[int]) -> Verdict:
    """The decision for a loopback client whose socket is `entry` (None: not in the kernel's tables)."""
    if entry is None or not entry.owner_known:
        return Verdict(allowed=False, uid=None)
    return Verdict(allowed=entry.uid in allowed, uid=entry.uid, inode=entry.inode)


def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def pid_of_socket(inode: int, proc: Path = Path("/proc"), budget: float = PID_SEARCH_SECONDS) -> int | None:
    """The process holding socket `inode`, searched in /proc/*/fd for at most `budget` seconds. Only root may
    read other users' fd tables, so for anyone else this answers None at once."""
    if inode == 0 or os.geteuid() != ROOT:
        return None
    target = f"socket:[{inode}]"
    deadline = time.monotonic() + budget
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        if time.monotonic() > deadline:
            return None
        try:
            if any(os.readlink(fd) == target for fd in (pid_dir / "fd").iterdir()):
                return int(pid_dir.name)
        except OSError:  # the process exited while we looked
            continue
    return None


def describe_allowed(allowed: frozenset[int], owner: int) -> str:
    """`only the job's owner (uid 1000) and root may use its store`, or the uids when the owner is not among them."""
    if owner not in allowed:
        return f"only uid {', '.join(str(u) for u in sorted(allowed)) or 'none'} may use its store"
    others = sorted(allowed - {owner})
    text = f"only the job's owner (uid {owner})"
    if others == [ROOT]:
        text += " and root"
    elif others:
        text += f" and uid {', '.join(str(u) for u in others)}"
    return text + " may use its store"


def refusal_message(verdict: Verdict, peer: Endpoint, allowed: frozenset[int], pid: int | None = None) -> str:
    """What the launcher's stderr says about a refused connection (after the server's `ddpboot: store: `)."""
    if verdict.uid is None:
        return (
            f"refused a connection from {peer[0]} port {peer[1]}: its socket is no longer in the kernel's tables "
            "(closed by the client, or reset by the kernel under a full listen queue, before the store accepted "
            "it), so whose it was is unknown"
        )
    about = [name] if (name := user_name(verdict.uid)) else []
    if pid is not None:
        about.append(f"pid {pid}")
    who = f" ({', '.join(about)})" if about else ""
    return f"refused a connection from uid {verdict.uid}{who}: {describe_allowed(allowed, os.getuid())}"


class OwnerGate:
    """Admits or refuses each accepted connection; each refused uid is reported once through `warn`."""

    def __init__(self, allowed: frozenset[int], warn: Callable[[str], None]) -> None:
        self.allowed = allowed
        self.warn = warn
        self.tables = SocketTables()
        self.reported: set[int | None] = set()
        self.blind = False  # the kernel's tables cannot be read here (reported once)

    def admit(self, sock: socket.socket) -> bool:
        """Whether `sock` (just accepted) may be served; the caller closes it when not."""
        return self.admit_many([sock])[0]

    def admit_many(self, socks: Sequence[socket.socket]) -> list[bool]:
        """`admit` for each socket of a burst accepted together: their owners are looked up in one batch."""
        verdicts = [True] * len(socks)
        asked: list[int] = []  # indexes of the loopback connections, whose owner decides
        ends: list[tuple[Endpoint, Endpoint]] = []  # (the client's side, ours) of each
        for index, sock in enumerate(socks):
            try:
                peer, own = sock.getpeername()[:2], sock.getsockname()[:2]
            except OSError:  # reset by the client before we looked
                verdicts[index] = False
                continue
            if is_loopback_peer(peer[0]):
                asked.append(index)
                ends.append((peer, own))
        if not asked:
            return verdicts
        try:
            found = self.tables.find_many(ends)
        except TablesUnavailable as exc:
            if not self.blind:
                self.blind = True
                self.warn(f"cannot tell which user a connection comes from ({exc}); serving every local connection")
            return verdicts
        for index, (peer, _), entry in zip(asked, ends, found, strict=True):
            verdict = judge(entry, self.allowed)
            if not verdict.allowed:
                verdicts[index] = False
                if verdict.uid not in self.reported:
                    self.reported.add(verdict.uid)
                    self.warn(refusal_message(verdict, peer, self.allowed, pid_of_socket(verdict.inode)))
        return verdicts

    def close(self) -> None:
        self.tables.close()
