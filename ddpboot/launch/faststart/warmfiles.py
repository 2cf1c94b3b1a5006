"""The warm process's files, the one rule for both its ends (the launcher's, warm.py and warmstart.py; its own,
warmserver.py): beside its socket `warm-HOST.sock`, `.exit` (why the last warm process exited, as it wrote it),
`.log` (its output) and `.lock` (held while one launch starts it); the stamp that tells a file changed (what the
warm process is keyed by, and what it watches); the credentials of a connection's other end. Standard library only:
warmserver.py loads it from this file (the ranks the warm process forks must not carry ddpboot).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import time
from typing import Any


def beside(sock: str | os.PathLike[str], suffix: str) -> str:
    """The warm process's file `suffix` (".exit", ".log", ".lock"), named after its socket."""
    return os.path.splitext(os.fspath(sock))[0] + suffix


def exit_file(sock: str | os.PathLike[str]) -> str:
    return beside(sock, ".exit")


def write_exit(sock: str | os.PathLike[str], pid: int, why: str) -> None:
    """Say why the warm process `pid` exits (the warm process's last act); quietly nothing if it cannot."""
    with contextlib.suppress(OSError), open(exit_file(sock), "w", encoding="utf-8") as f:
        json.dump({"pid": pid, "why": why, "at": time.time()}, f)


def read_exit(sock: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Why the last warm process exited, as it wrote it (None: it never said: it was killed, or never ran)."""
    try:
        with open(exit_file(sock), encoding="utf-8") as f:
            found: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        return None
    return found


def clear_exit(sock: str | os.PathLike[str]) -> None:
    """Forget what the last warm process said (a fresh one is starting)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(exit_file(sock))


def stamp(path: str) -> list[int] | None:
    """What changes when a file is written, replaced or installed anew: modification time, size, inode and device;
    None when there is no file."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev]


def peer(sock: socket.socket) -> tuple[int, int, int]:
    """The pid, uid and gid of the process at the other end of a unix socket (SO_PEERCRED)."""
    pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(pid), int(uid), int(gid)
