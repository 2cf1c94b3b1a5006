"""Cross-job GPU locks: one flock per GPU UUID, held by the launcher for the life of the job.

The kernel releases a flock when its last file descriptor closes, so a SIGKILLed launcher frees its GPUs at once.
Descriptors are close-on-exec and never passed to workers, so no worker holds a lock by accident.

The lock directory is shared by every user of the machine (default /tmp/ddpboot-locks, created 1777 like /tmp;
DDPBOOT_LOCK_DIR overrides). It is refused when it is a symlink, not writable, or owned by another user unless it
is a sticky world-writable directory (where nobody can remove another's lock file).

A lock file records its holder's user, pid, start time and host, readable by every user of the machine (that is
what `ddpboot gpus` shows them). It records nothing of the holder's command line: argv can carry secrets (tokens,
passwords) that other users must not read. Lock files written by older versions may hold a `command` field; it is
ignored.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import getpass
import json
import os
import socket
import stat
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddpboot.errors import DdpbootError

LOCK_DIR_VAR = "DDPBOOT_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/ddpboot-locks"


class LockDirError(DdpbootError):
    """The lock directory is unsafe or unusable."""


class GpusLockedError(DdpbootError):
    """GPUs that were asked for are held by another job."""

    def __init__(self, message: str, holders: Mapping[str, Holder]) -> None:
        super().__init__(message)
        self.holders = dict(holders)


@dataclass(frozen=True)
class Holder:
    """Who holds a GPU: written into the lock file by the holder (no command line: see the module docstring)."""

    user: str = "?"
    pid: int = 0
    since: float = 0.0
    host: str = ""

    @property
    def started(self) -> str:
        """The holder's start time, local and to the second (`?` when unknown)."""
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)) if self.since else "?"

    def describe(self) -> str:
        return f"{self.user} (pid {self.pid}, since {self.started})"


def lock_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env.get(LOCK_DIR_VAR) or DEFAULT_LOCK_DIR)


def prepare_lock_dir(path: Path) -> Path:
    """Create the directory if needed (1777, shared) and refuse one that is unsafe."""
    if not path.exists() and not path.is_symlink():
        try:
            path.mkdir(parents=True, exist_ok=True)
            if _owned_by_me(path):
                os.chmod(path, 0o1777)
        except OSError as exc:
            raise LockDirError(
                f"cannot create the GPU lock directory {path}: {exc.strerror}. Set {LOCK_DIR_VAR} to a directory "
                "you can write, shared by everyone who uses these GPUs."
            ) from None
    check_lock_dir(path)
    return path


def _owned_by_me(path: Path) -> bool:
    return path.lstat().st_uid == os.geteuid()


def check_lock_dir(path: Path) -> None:
    try:
        st = path.lstat()
    except OSError as exc:
        raise LockDirError(
            f"GPU lock directory {path}: {exc.strerror}. Set {LOCK_DIR_VAR} to a usable directory."
        ) from None
    if stat.S_ISLNK(st.st_mode):
        raise LockDirError(
            f"GPU lock directory {path} is a symbolic link; ddpboot refuses it (another user could redirect the "
            f"locks). Remove it, or set {LOCK_DIR_VAR} to a real directory."
        )
    if not stat.S_ISDIR(st.st_mode):
        raise LockDirError(f"GPU lock directory {path} is not a directory. Remove it or set {LOCK_DIR_VAR}.")
    shared = bool(st.st_mode & stat.S_ISVTX) and (st.st_mode & 0o777) == 0o777
    if st.st_uid not in (os.geteuid(), 0) and not shared:
        raise LockDirError(
            f"GPU lock directory {path} belongs to another user (uid {st.st_uid}) and is not a sticky shared "
            f"directory (mode {stat.filemode(st.st_mode)}), so its owner could remove your locks. Ask them (or root) "
            f"to `chmod 1777 {path}`, or set {LOCK_DIR_VAR} to a directory that is safe."
        )
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        raise LockDirError(
            f"GPU lock directory {path} is world-writable without the sticky bit (mode {stat.filemode(st.st_mode)}): "
            f"anyone could delete a running job's locks. Fix it with `chmod 1777 {path}`."
        )
    if not os.access(path, os.W_OK | os.X_OK):
        raise LockDirError(
            f"GPU lock directory {path} is not writable by you ({getpass.getuser()}). Ask its owner to "
            f"`chmod 1777 {path}`, or set {LOCK_DIR_VAR} to a directory shared by everyone who uses these GPUs."
        )


def _lock_path(directory: Path, uuid: str) -> Path:
    return directory / f"gpu-{uuid}.lock"


def _open(path: Path) -> int:
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, 0o666)
    except PermissionError:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
    with contextlib.suppress(OSError):
        if os.fstat(fd).st_uid == os.geteuid():
            os.fchmod(fd, 0o666)  # whoever comes next may record themselves as holder
    return fd


def _read_holder(path: Path) -> Holder:
    try:
        data = json.loads(path.read_text() or "{}")
        return Holder(  # an older file's "command" field is not read
            str(data.get("user", "?")),
            int(data.get("pid", 0)),
            float(data.get("since", 0.0)),
            str(data.get("host", "")),
        )
    except (OSError, ValueError, TypeError):
        return Holder()


def me() -> Holder:
    """This process as a holder."""
    return Holder(getpass.getuser(), os.getpid(), time.time(), socket.gethostname())


class GpuLocks:
    """The locks a job holds. Release explicitly, with `with`, or by exiting (the kernel drops them)."""

    def __init__(self, fds: dict[str, int], directory: Path) -> None:
        self.fds = fds
        self.directory = directory

    @property
    def uuids(self) -> tuple[str, ...]:
        return tuple(self.fds)

    def release(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = {}

    def __enter__(self) -> GpuLocks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def acquire(uuids: Iterable[str], directory: Path, holder: Holder | None = None) -> GpuLocks:
    """Lock every GPU in `uuids` or none: on any conflict, release what was taken and raise GpusLockedError.

    Locks are tried without blocking in one fixed (sorted) order, so two jobs wanting overlapping sets never
    deadlock: one gets everything, the other gets nothing and can choose again.
    """
    holder = holder or me()
    wanted = sorted(set(uuids))
    taken: dict[str, int] = {}
    held_by: dict[str, Holder] = {}
    for uuid in wanted:
        path = _lock_path(directory, uuid)
        try:
            fd = _open(path)
        except OSError as exc:
            for f in taken.values():
                os.close(f)
            raise LockDirError(f"cannot open the lock file {path}: {exc.strerror}.") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            held_by[uuid] = _read_holder(path)
            continue
        taken[uuid] = fd
    if held_by:
        for fd in taken.values():
            os.close(fd)
        names = "; ".join(f"{u} held by {h.describe()}" for u, h in held_by.items())
        raise GpusLockedError(f"GPUs are in use by another ddpboot job: {names}.", held_by)
    record = json.dumps(holder.__dict__).encode()
    for fd in taken.values():
        with contextlib.suppress(OSError):  # a read-only lock file (made by another user) keeps its old record
            os.ftruncate(fd, 0)
            os.pwrite(fd, record, 0)
    return GpuLocks(taken, directory)


def current_holders(uuids: Iterable[str], directory: Path) -> dict[str, Holder]:
    """Which of these GPUs are locked right now, and by whom (for display and for planning around them)."""
    out: dict[str, Holder] = {}
    if not directory.is_dir():
        return out
    for uuid in uuids:
        path = _lock_path(directory, uuid)
        if not path.exists():
            continue
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
        except OSError:
            continue
        try:
            # A shared probe never blocks a holder; it fails only while someone holds the exclusive lock.
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            out[uuid] = _read_holder(path)
        finally:
            os.close(fd)
    return out
