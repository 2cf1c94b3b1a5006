"""What init() registers to run at interpreter exit: the exit mark for ddpboot's launcher, then the process group is
ended: destroyed on a clean exit, aborted on a failing one (an uncaught exception, a non-zero exit code)."""

from __future__ import annotations

import builtins
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

import torch.distributed as dist

from ddpboot.contract import ERROR_FILE_VAR, LOCAL_RANK_VAR, exit_mark
from ddpboot.procfs import TASKS, pids, read_stat
from ddpboot.worker.context import end_group

_PEER_GONE = ("/gloo/", "Connection closed by peer", "Connection reset by peer", "NCCL")
"""Text of the errors gloo and NCCL raise in a collective whose peer went away."""


class ExitRecorder:
    """The exit code the script asked for, seen on its way out.

    At interpreter exit an uncaught exception is still visible (sys.last_value), but a `SystemExit` is not: by then
    python has taken its code and cleared it. So `sys.exit`, `exit` and `quit` are wrapped to note the code before
    raising as usual (argparse's errors go through sys.exit too). A `raise SystemExit(n)` written out in the script
    is not seen; docs/guide.md says what that means."""

    def __init__(self) -> None:
        self.code: int | None = None

    def install(self) -> None:
        sys.exit = self._wrap(sys.exit)
        for name in ("exit", "quit"):
            quitter = getattr(builtins, name, None)
            if quitter is not None:
                setattr(builtins, name, self._wrap(quitter))

    def _wrap(self, fn: Callable[..., Any]) -> Callable[..., NoReturn]:
        if getattr(fn, "_ddpboot_recorder", None) is self:
            return fn  # installed already

        def recording(code: object = None) -> NoReturn:
            if threading.current_thread() is threading.main_thread():  # elsewhere it only ends that thread
                self.code = exit_status(code)
            fn(code)
            raise SystemExit(code)  # pragma: no cover - fn raised already

        recording._ddpboot_recorder = self  # type: ignore[attr-defined]
        recording.__doc__ = fn.__doc__
        return recording


def exit_status(code: object) -> int:
    """The process exit status python gives `SystemExit(code)`: None is 0, an int is itself, anything else
    (a message) is printed and gives 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return int(code)
    return 1


RECORDER = ExitRecorder()


def leaving_with_failure() -> bool:
    """Whether this process is exiting with a failure: an uncaught exception (KeyboardInterrupt included), or
    sys.exit / exit / quit with a non-zero code."""
    if getattr(sys, "last_exc", None) is not None or getattr(sys, "last_value", None) is not None:
        return True
    return RECORDER.code not in (None, 0)


def shutdown_at_exit() -> None:
    """At interpreter exit: announce the exit, then end the process group.

    The mark (written before anything is torn down) tells ddpboot's launcher that this rank was leaving first:
    ending the group while another rank still waits in a collective makes that rank fail at once, often before this
    process has finished exiting, and the launcher must then wait for this rank's own exit code instead of blaming
    the rank that merely lost its peer. A failing exit aborts the group instead of destroying it, so that a peer
    waiting in a collective cannot hold this rank (and so the whole job) until the collective's timeout."""
    error_file = os.environ.get(ERROR_FILE_VAR)
    if error_file and os.environ.get(LOCAL_RANK_VAR) is not None and not _failed_collective():
        with contextlib.suppress(OSError):
            exit_mark(error_file).write_text(f"{time.time():.6f}\n")
    end_group(abort=leaving_with_failure())
    settle_threads()


SETTLE_TIMEOUT = 1.0
"""The longest the exit path waits for other threads of the rank to go quiet (seconds)."""


def settle_threads(timeout: float = SETTLE_TIMEOUT, poll: float = 0.002, quiet_polls: int = 3) -> bool:
    """Let the rank's other threads finish what they are doing before the interpreter tears itself down.

    Why: gloo runs collectives on threads of its own. When one finishes the last collective a little late (a busy
    core), it drops its reference to the collective's tensors while python is already finalizing; that needs the
    GIL, python 3.11 and 3.12 end a thread that asks for the GIL during finalization by unwinding it, the unwinding
    crosses a C++ destructor, and the process dies in std::terminate ("terminate called without an active
    exception", exit 134) after the script's last line ran. Destroying the process group does not stop those
    threads while a DDP model still holds the group.

    So, with the GIL released (sleeping), wait until no other thread of this process is runnable for a few polls
    in a row (the kernel's per-thread state in /proc/self/task), at most `timeout` seconds. True when they went
    quiet; False at the timeout or where /proc is not there."""
    me = threading.get_native_id()
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        time.sleep(poll)  # releases the GIL: a thread waiting for it gets it now
        states = _thread_states(exclude=me)
        if states is None:
            return False
        quiet = 0 if "R" in states else quiet + 1
        if quiet >= quiet_polls:
            return True
    return False


def _thread_states(exclude: int) -> list[str] | None:
    """The scheduler state letter (R running, S sleeping, ...) of every thread of this process but `exclude`."""
    try:
        tids = pids(TASKS)
    except OSError:
        return None
    stats = (read_stat(tid, TASKS) for tid in tids if tid != exclude)
    return [st.state for st in stats if st is not None]  # None: the thread ended


def _failed_collective() -> bool:
    """Whether the interpreter is exiting because a collective failed (a peer went away): such a rank is not
    leaving of its own accord, so it writes no at-exit mark; the rank whose leaving broke the collective is the root
    cause (it exited first, or marked itself before tearing the group down)."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)  # set for an uncaught exception
    if exc is None:
        return False
    if isinstance(exc, dist.DistError):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in _PEER_GONE)
