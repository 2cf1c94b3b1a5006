"""Only the job's owner (and root) may use its store: the check the server makes when it accepts a connection.

Loopback is shared by every user of a machine, so without a check any local process could write the job's keys,
read their count or hold its ranks in a WAIT. A connection from a loopback address (127.0.0.0/8, ::1, or
::ffff:127.x) is let in only when the kernel's socket tables (peer.py) say that its client socket belongs to an
allowed uid; anything else, including a client whose socket is already gone, is closed before the server reads a
byte. Connections from other addresses (the other nodes of a multi-node job) are not judged here: allow.py
checks them against the job's hosts where those are known.

The check fails closed: a loopback connection is served only once its owner is known to be allowed.
- A lookup that fails for now (no free file descriptor, no kernel memory: peer.LookupFailed) decides nothing: its
  connections are held, unread, and judged again later (`admit_many` answers None for them).
- Where the kernel's tables cannot be read at all (a sandbox without sock_diag netlink and without /proc/net), no
  connection's owner can be known and every loopback connection is refused, with one warning. Serving them all
  instead would open the store to every user of the machine; refusing them would leave the job's ranks waiting
  at their rendezvous, so the launcher asks first (`tables_unusable`, before the store listens) and refuses such a
  job with a message (launch/runner.py), `--store torch` (torch's server, which checks no uid) being the way out.

docs/security.md describes the guarantee and its measured cost.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import os
import pwd
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpboot.errors import PlanError
from ddpboot.tcpstore.address import is_loopback
from ddpboot.tcpstore.allow import plain_address
from ddpboot.tcpstore.peer import Endpoint, LookupFailed, SocketEntry, SocketTables, TablesUnavailable

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

    def __init__(
        self, allowed: frozenset[int], warn: Callable[[str], None], tables: SocketTables | None = None
    ) -> None:
        self.allowed = allowed
        self.warn = warn
        self.tables = tables or SocketTables()
        self.tables.open()  # its file descriptor is held from now on
        self.reported: set[int | None] = set()
        self.blind = False  # the kernel's tables cannot be read here (reported once)
        self.failed: set[int | None] = set()  # errnos of lookups that failed for now (each reported once)

    def admit(self, sock: socket.socket) -> bool | None:
        """Whether `sock` (just accepted) may be served (None: cannot tell yet); the caller closes it when not."""
        return self.admit_many([sock])[0]

    def admit_many(self, socks: Sequence[socket.socket]) -> list[bool | None]:
        """`admit` for each socket of a burst accepted together: their owners are looked up in one batch. None for
        a loopback connection whose owner cannot be looked up now: the caller holds it, unread, and asks again."""
        verdicts: list[bool | None] = [True] * len(socks)
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
        except LookupFailed as exc:
            if exc.errno not in self.failed:
                self.failed.add(exc.errno)
                self.warn(f"cannot look up which user a connection comes from just now ({exc.strerror}); "
                          "such connections wait, unread, until it can be known")
            return _decided(verdicts, asked, None)
        except TablesUnavailable as exc:
            if not self.blind:
                self.blind = True
                self.warn(f"cannot tell which user a connection comes from ({exc}); refusing every local "
                          "connection (docs/security.md)")
            return _decided(verdicts, asked, False)
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


def _decided(verdicts: list[bool | None], indexes: list[int], verdict: bool | None) -> list[bool | None]:
    for index in indexes:
        verdicts[index] = verdict
    return verdicts


def tables_unusable(tables: SocketTables | None = None) -> str | None:
    """Why the owner check cannot work here, or None when it can: a loopback connection of this process, made for
    the test, must be found in the kernel's tables as this uid's. A lookup that fails for now says nothing."""
    tables = tables or SocketTables()
    try:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            with socket.create_connection(listener.getsockname()[:2]) as client:
                entry = tables.find(client.getsockname()[:2], listener.getsockname()[:2])
    except LookupFailed:
        return None
    except TablesUnavailable as exc:
        return str(exc)
    except OSError:  # no loopback to test it on: nothing could reach a loopback store either
        return None
    finally:
        tables.close()
    if entry is None or not entry.owner_known or entry.uid != os.getuid():
        return "the kernel's socket tables do not show this process's own loopback connection as its own"
    return None



def takes_loopback(bind_addr: str) -> bool:
    """Whether a store listening on `bind_addr` can be reached from a loopback address (the uid rule's domain)."""
    if is_loopback(bind_addr):
        return True
    try:
        return ipaddress.ip_address(bind_addr.strip("[]")).is_unspecified
    except ValueError:
        return False


def ensure_owner_check(bind_addr: str, backend: str) -> None:
    """Refuse, before the store listens, a job whose store (ddpboot's, reachable from loopback) could not tell its
    owner's connections from other users'; PlanError saying why and what to do."""
    if backend != "python" or not takes_loopback(bind_addr):
        return
    why = tables_unusable()
    if why is not None:
        raise PlanError(
            f"the job's store on {bind_addr} cannot tell which user a local connection comes from here ({why}), so "
            "it cannot keep this machine's other users out of the job's rendezvous. Run where sock_diag netlink "
            "(NETLINK_SOCK_DIAG) or /proc/net/tcp can be read, or give --store torch: torch's own store server, "
            "which checks no user (every local user can then use it)."
        )
