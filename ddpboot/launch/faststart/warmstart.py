"""Starting the warm process (warm.py says what it is): one launch at a time (`Lock`), detached from the launcher
(`start`), awaited until it listens. Never imports torch."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ddpboot.errors import DdpbootError
from ddpboot.launch.faststart import BOOT, FastStartError
from ddpboot.launch.faststart.warmfiles import beside, clear_exit
from ddpboot.launch.faststart.zygote import MAX_MSG

SERVER = Path(__file__).with_name("warmserver.py")
# What the warm process's own environment must not carry: a job's per-run variables (a leftover search reads a
# process's environment to find a job's processes: the warm process belongs to no job).
PER_JOB = ("TORCHELASTIC_ERROR_FILE", "DDPBOOT_STACKS", "TORCHELASTIC_RUN_ID")
READY_TIMEOUT = 600.0  # the first warm launch waits this long at most for torch's import
LOCK_POLL = 0.05
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37

_libc = ctypes.CDLL(None, use_errno=True)


class WarmError(DdpbootError):
    """No warm process can serve this launch (an unsafe directory, a warm process that cannot start): the launch
    goes on cold, and the message says why."""


class Lock:
    """flock on the directory's lock file while one launch starts the warm process (others wait, then connect);
    polled, so that the wait obeys Ctrl-C."""

    def __init__(self, path: Path, tick: Callable[[], None]) -> None:
        self.path = path
        self.tick = tick
        self.fd = -1

    def __enter__(self) -> Lock:
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return self
            except BlockingIOError:
                self.tick()
                time.sleep(LOCK_POLL)

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def start(python: str, key: Mapping[str, Any], env: Mapping[str, str], preloads: Sequence[str], path0: str,
          path: Path, idle: float, tick: Callable[[], None]) -> None:
    """Start the warm process, detached (not the launcher's descendant: it outlives this launch, and no clean-up
    of the job's processes may take it), and wait until it listens."""
    conf = {"socket": str(path), "key": dict(key), "preload": list(preloads),
            "path0": path0, "idle": idle}
    server_env = {k: v for k, v in env.items() if k not in PER_JOB}
    argv = [python, "-u", "-c", BOOT, str(SERVER), json.dumps(conf)]
    clear_exit(path)
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        _spawn_detached(argv, server_env, child.fileno(), Path(beside(path, ".log")))
        child.close()
        _await_ready(parent, tick)
    finally:
        child.close()
        parent.close()


def _spawn_detached(argv: list[str], env: Mapping[str, str], ready_fd: int, log: Path) -> None:
    """fork → setsid → spawn (exec) → exit: the warm process is reparented away from the launcher, to init or the
    nearest subreaper above it; the launcher's own subreaper flag is off meanwhile."""
    from ddpboot.launch.procs.spawn import SpawnError, spawn

    flag = ctypes.c_int(0)
    was_reaper = _libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0 and flag.value == 1
    if was_reaper:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
    err_r, err_w = os.pipe()
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the intermediate child
            code = 0
            try:
                os.close(err_r)
                os.setsid()
                null = os.open(os.devnull, os.O_RDONLY)
                os.dup2(null, 0)
                out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
                spawn(argv, env, out, out, death_signal=0, pass_fd=ready_fd)
            except SpawnError as exc:
                os.write(err_w, str(exc).encode())
                code = 1
            except BaseException as exc:
                os.write(err_w, repr(exc).encode())
                code = 1
            os._exit(code)
        os.close(err_w)
        err_w = -1
        with open(err_r, "rb") as f:
            failure = f.read().decode(errors="replace")
        os.waitpid(pid, 0)
    finally:
        if err_w >= 0:
            os.close(err_w)
        if was_reaper:
            _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    if failure:
        raise WarmError(f"cannot start the warm process: {failure}")


def _await_ready(sock: socket.socket, tick: Callable[[], None]) -> dict[str, Any]:
    deadline = time.monotonic() + READY_TIMEOUT
    sock.settimeout(0.25)
    while True:
        try:
            data = sock.recv(MAX_MSG)
        except TimeoutError:
            tick()
            if time.monotonic() > deadline:
                raise WarmError(f"the warm process was not ready after {READY_TIMEOUT:.0f} s") from None
            continue
        except OSError as exc:
            if exc.errno != errno.EINTR:
                data = b""
            else:
                continue
        if not data:
            raise WarmError("the warm process exited before it was ready (its log is beside its socket)")
        msg: dict[str, Any] = json.loads(data)
        if msg.get("op") == "error":
            raise FastStartError(f"the warm process could not import what it preloads: {msg['error']}")
        if msg.get("op") == "ready":
            return msg
