"""The GPU health ledger: GPUs a job saw failing, remembered across jobs, one file per GPU UUID beside the GPU locks.

The GPU watch (launch/observe/gpuwatch.py) marks a GPU when it reports what means its hardware is failing (`FAILING`:
a critical Xid, uncorrected ECC errors that grew during the job). Later jobs' automatic choice treats a marked GPU
as not free (`--gpus` naming it still runs, with one warning), `ddpboot gpus` shows the mark (why, when, which job
and user), and `ddpboot gpus --clear GPU` removes it; nothing else does (a counter that stops growing is no proof
of health: a GPU that fell off the bus reads nothing at all).

The files are as safe as the locks' (selection/locks.py): the same directory, checked the same way (no symlink, not
writable by others unless sticky); `gpu-UUID.failing`, written whole (beside, then renamed) and never followed
through a symlink, mode 0644: every user reads it, only its writer (or root) replaces or removes it, the sticky
directory seeing to that. Marking a GPU thus needs the shared directory's rights, and a user cannot clear or
overwrite another user's mark.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import socket
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from ddpboot.selection.gpu import Inventory
from ddpboot.selection.locks import lock_dir

FAILING = {48: "a double-bit ECC error", 79: "the GPU has fallen off the bus", 94: "a contained ECC error",
           95: "an uncontained ECC error"}
"""The Xids that mean the GPU itself is failing (NVIDIA's Xid list); an application's own error (13, 31, 43) does
not."""
MAX_BYTES = 4096  # a mark is a few hundred bytes


@dataclass(frozen=True)
class Mark:
    """Why a GPU is out: written by the job that saw it."""

    reason: str  # "Xid 79 (the GPU has fallen off the bus)"
    since: float  # unix time
    run_id: str  # the job that saw it
    user: str
    host: str
    label: str = ""  # the GPU's index when it was marked

    @property
    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since)) if self.since else "?"

    def describe(self) -> str:
        return f"{self.reason}, seen by job {self.run_id} of {self.user} at {self.when}"


def xid_reason(xid: int) -> str | None:
    """The mark's reason for a critical Xid; None for one that does not mean the GPU is failing."""
    return f"Xid {xid} ({FAILING[xid]})" if xid in FAILING else None


def _path(directory: Path, uuid: str) -> Path:
    return directory / f"gpu-{uuid}.failing"


def mark(directory: Path, uuid: str, reason: str, run_id: str, label: str = "") -> bool:
    """Record `uuid` as failing (the directory prepared as the locks' is); False when it could not be written
    (another user's mark is there already, the directory refuses): the job goes on either way."""
    record = Mark(reason, time.time(), run_id, getpass.getuser(), socket.gethostname(), label)
    tmp = directory / f".gpu-{uuid}.failing.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(json.dumps(asdict(record)))
        os.rename(tmp, _path(directory, uuid))
        return True
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return False


def _read(path: Path) -> Mark | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError:
        return Mark("a mark that cannot be read", 0.0, "?", "?", "")
    with os.fdopen(fd, "rb") as f:
        data = f.read(MAX_BYTES + 1)
    try:
        got = json.loads(data) if len(data) <= MAX_BYTES else {}
        return Mark(str(got["reason"]), float(got["since"]), str(got["run_id"]), str(got["user"]), str(got["host"]),
                    str(got.get("label", "")))
    except (ValueError, TypeError, KeyError, AttributeError):
        return Mark("a damaged mark", 0.0, "?", "?", "")  # still out: what was written meant failing


def failing(uuids: Iterable[str], directory: Path) -> dict[str, Mark]:
    """The marked GPUs among `uuids` (a damaged or unreadable mark still counts: it was written as failing)."""
    if not directory.is_dir():
        return {}
    return {u: m for u in uuids if (m := _read(_path(directory, u))) is not None}


def failing_gpus(inventory: Inventory, env: Mapping[str, str]) -> dict[str, str]:
    """The GPUs of this machine marked failing in the ledger of `env`'s lock directory, uuid → why (what the
    planner takes as not free)."""
    return {u: m.describe() for u, m in failing([u.uuid for u in inventory.units()], lock_dir(env)).items()}


def clear(directory: Path, uuid: str) -> Mark | None:
    """Remove the mark of `uuid`; the mark removed (None: there was none). PermissionError when another user's
    mark is in a sticky directory."""
    path = _path(directory, uuid)
    found = _read(path)
    if found is None:
        return None
    path.unlink()
    return found
