"""Fast start, a rank's side: what runs in the child the zygote (zygote.py) forked, before the script (`prepare_rank`).
Standard library only, loaded by zygote.py from this file, not imported as part of ddpboot: the ranks must not carry
ddpboot.

Before the script: a new session, PR_SET_PDEATHSIG (SIGKILL when the zygote dies), the dispositions and empty signal
mask a fresh `python` starts with, stdout/stderr onto the launcher's pipes, every other inherited descriptor closed,
the rank's CPU affinity and environment (os.environ replaced), its command line as ps shows it, torch's thread count
from OMP_NUM_THREADS (libgomp read the variable once, when the zygote imported torch), numpy's global random state
reseeded (Python's `random` reseeds itself after fork). Then the zygote runs the script as an exec'd rank runs it
(launch/pymain.py `run_forked`: the stacks signal, sys.argv, sys.path[0], a fresh `__main__`, and at the end what
the interpreter does at exit).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddpboot.launch.procs import mempolicy
# else: zygote.py loads launch/procs/mempolicy.py from its file and gives it to this one as `mempolicy`

# ddpboot/launch/procs/spawn.py's prctl option, written again (this file imports nothing of ddpboot).
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def python_start(ignored: list[int]) -> dict[int, Any]:
    """The dispositions `python` starts with when exec'd with `ignored` ignored: those stay ignored, SIGINT raises
    KeyboardInterrupt, SIGPIPE and SIGXFSZ are ignored (Python's own), every other signal has its default (a warm
    session's ranks start so: as its launch's exec'd ranks do)."""
    out: dict[int, Any] = {}
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            continue
        if sig in ignored or sig in (signal.SIGPIPE, signal.SIGXFSZ):
            out[int(sig)] = signal.SIG_IGN
        else:
            out[int(sig)] = signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL
    return out


def _fresh_dispositions(initial: dict[int, Any]) -> None:
    """What a new `python` process has: the dispositions the zygote itself started with (it was exec'd exactly as an
    exec'd rank would be: whatever was ignored before stays ignored, SIGINT raises KeyboardInterrupt, SIGPIPE and
    SIGXFSZ ignored by Python at start-up); nothing blocked."""
    for sig, handler in initial.items():
        with contextlib.suppress(OSError, ValueError, RuntimeError, TypeError):
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


def _show_command(words: list[str]) -> None:
    """The rank's command line as ps, top and py-spy show it: `python -u WORDS` (pymain.TargetKind.words), written
    over the zygote's own in this process's memory (as setproctitle does: words joined by spaces, cut to the room the
    zygote's command line had). Without it every rank would show the zygote's command line."""
    words = [getattr(sys, "orig_argv", [sys.executable])[0], "-u", *words]
    with contextlib.suppress(OSError, ValueError, IndexError):
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end (proc(5): fields 48 and 49)
        title = " ".join(words).encode(errors="replace")[: end - start - 2]
        # A last byte that is not NUL tells the kernel to show the command line up to its first NUL, the title's.
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(title + b"\0" * (end - start - len(title) - 1) + b" ")


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def prepare_rank(req: dict[str, Any], out_fd: int, err_fd: int, zygote: int, keep_closed: list[Any],
                 initial: dict[int, Any], words: list[str]) -> None:
    """In the child the zygote just forked: prepare the rank's process (the module docstring), or exit 127 if it
    cannot. `zygote`: the parent's pid; `keep_closed`: its descriptors, as objects with close(); `words`: what the
    rank's python is given after `-u` (its command line as ps shows it)."""
    code = 127
    try:
        os.setsid()
        if _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0 or os.getppid() != zygote:
            os._exit(code)
        signal.set_wakeup_fd(-1)
        for obj in keep_closed:  # the zygote's own descriptors, closed through their objects
            obj.close()
        _fresh_dispositions(initial)
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        os.closerange(3, _max_fd())
        if req["cpus"]:
            os.sched_setaffinity(0, req["cpus"])
        if req.get("mems"):
            with contextlib.suppress(OSError):  # a preference: the launcher said once if the kernel refuses it
                mempolicy.prefer_nodes(req["mems"])
        os.environ.clear()
        os.environ.update(req["env"])
        _show_command(words)
        torch = sys.modules.get("torch")
        threads = req["env"].get("OMP_NUM_THREADS", "")
        if torch is not None and threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))
        np = sys.modules.get("numpy")
        if np is not None:
            np.random.seed()
    except BaseException as exc:
        try:
            os.write(2, f"ddpboot fast start: cannot prepare the rank's process: {exc!r}\n".encode())
        finally:
            os._exit(code)
