"""Why a path the user gave cannot be used, in the words `ls` and `cd` would make true: it does not exist, it is a
symbolic link to a missing file, a loop of symbolic links, or a directory on the way to it may not be searched by
this user; the current directory, which may have been deleted under the shell; and a temporary directory too deep
for the unix sockets of Python's multiprocessing. Each answer is a clause for a UsageError (preflight.py), or a
note, that names the path, what is there and what to do.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from ddpboot.errors import UsageError

MAX_LINKS = 40  # the kernel's own limit on the symbolic links one lookup follows (ELOOP beyond it)


def current_directory() -> Path:
    """The current directory; one that was deleted (or moved) after the shell entered it is an error: every rank
    would start in it, and `ddpboot` could not even name the script's directory."""
    try:
        return Path.cwd()
    except FileNotFoundError:
        try:
            gone = os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
        except OSError:
            gone = "(unknown)"
        near = next((p for p in Path(gone).parents if p.is_dir()), Path("/")) if gone.startswith("/") else None
        into = f" (e.g. `cd {near}`)" if near is not None else ""
        raise UsageError(f"the current directory {gone} no longer exists: it was deleted or moved after your shell "
                         f"entered it, and every rank would start in it. cd to a directory that exists{into} and run "
                         "ddpboot again.") from None


def link_chain(path: Path) -> list[str]:
    """`a`, `b`, `a`: the symbolic links from `path` as each points to the next, until one is not a link, one
    repeats, or MAX_LINKS."""
    chain = [str(path)]
    seen = {os.path.abspath(path)}
    here = path
    for _ in range(MAX_LINKS):
        try:
            target = os.readlink(here)
        except OSError:
            break
        here = Path(os.path.join(os.path.dirname(here), target))
        chain.append(target)
        key = os.path.abspath(here)
        if key in seen:
            break
        seen.add(key)
    return chain


def unsearchable(path: Path) -> Path | None:
    """The first directory on the way to `path` that this user may not search (no x permission), if any."""
    for parent in reversed(Path(os.path.abspath(path)).parents):
        if parent.is_dir() and not os.access(parent, os.X_OK):
            return parent
    return None


def _mode(path: Path) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return ""
    try:
        import pwd

        owner = pwd.getpwuid(st.st_uid).pw_name
    except (KeyError, ImportError):
        owner = str(st.st_uid)
    return f" (its mode is {stat.filemode(st.st_mode)}, owner {owner})"


def why_unusable(path: Path) -> str | None:
    """None when `path` can be looked at (stat works); else what is wrong, as a clause after the path's name
    (`is a loop of symbolic links (a -> b -> a)`), with what to do."""
    try:
        os.stat(path)
        return None
    except OSError as exc:
        code = exc.errno
    if code == errno.ELOOP:
        return (f"is a loop of symbolic links ({' -> '.join(link_chain(path))}), which leads to no file. Point one "
                "of them at the file, or give the file's own path")
    if code == errno.EACCES:
        blocked = unsearchable(path)
        where = f"the directory {blocked}{_mode(blocked)}" if blocked is not None else "a directory on its way"
        return (f"cannot be reached: you may not search {where}, so not even its existence can be checked. Ask its "
                "owner for search permission (chmod o+x, or a group you are in), or put the file elsewhere")
    if os.path.islink(path):
        return (f"is a symbolic link to a missing file ({path} -> {os.readlink(path)}). Point it at the file, or give "
                "the file's own path")
    if code == errno.ENOTDIR:
        return "does not exist: a part of its path is a file, not a directory"
    return None if code != errno.ENOENT else "does not exist"


AF_UNIX_PATH_MAX = 107  # bytes of a unix socket's path on Linux (sun_path is 108 with its terminating NUL)
MP_SOCKET_DEPTH = len("/pymp-XXXXXXXX/listener-XXXXXXXX")  # where multiprocessing puts its sockets below the tmp dir


def temp_dir_note(env: Mapping[str, str]) -> str | None:
    """A note when the ranks' temporary directory (TMPDIR, TEMP or TMP, the first set, as tempfile reads them) is
    too long for the sockets Python's multiprocessing makes below it: a DataLoader worker that passes a tensor back
    (torch shares its storage through multiprocessing's resource sharer) or a multiprocessing Manager then fails
    with `OSError: AF_UNIX path too long`, and the rank waits for its batch for good (measured: both ranks of a
    job with a 99-byte TMPDIR hung in their first batch under ddpboot and under torchrun alike)."""
    name = next((n for n in ("TMPDIR", "TEMP", "TMP") if env.get(n)), None)
    if name is None or not env[name].startswith("/"):
        return None
    base = env[name].rstrip("/") or "/"
    size = len(os.fsencode(base))
    if size + MP_SOCKET_DEPTH <= AF_UNIX_PATH_MAX:
        return None
    return (f"{name}={base} is {size} bytes long: Python's multiprocessing puts its sockets "
            f"{MP_SOCKET_DEPTH} bytes below it (pymp-*/listener-*), over the {AF_UNIX_PATH_MAX} bytes a unix "
            "socket's path may have, so a DataLoader with workers or a multiprocessing Manager in a rank fails "
            "with `AF_UNIX path too long` (a DataLoader then waits for its batch for good). Set TMPDIR to a "
            f"directory of at most {AF_UNIX_PATH_MAX - MP_SOCKET_DEPTH} bytes, e.g. TMPDIR=/tmp")
