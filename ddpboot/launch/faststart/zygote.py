"""Fast start, the zygote's side: import torch once per node, then fork one child per rank and run the script in it
exactly as `python -u SCRIPT ARGS` would. Standard library only: this file runs in its own interpreter, started by
the launcher (launch/faststart/__init__.py) as `python -u -c ... zygote.py`, and imports nothing of ddpboot itself;
what it preloads (`--preload`; the pytest plugin preloads its own ddpboot.testing modules) the ranks inherit.

The zygote stays fork-safe: no Python threads, no CUDA (torch is imported, never initialised), no store (the
launcher's guardian serves it). It also ignores every catchable signal: SLURM's slurmstepd signals every process
of a step, and a zygote killed by the time-limit SIGTERM would take its ranks with it (they die with their parent,
PR_SET_PDEATHSIG) before they could checkpoint.

Nothing outlives it: once serving, it is a child subreaper, so whatever a rank leaves running (a daemon made by
`fork(); setsid(); fork()`, with or without exec) becomes its child, where the launcher's leftover search finds it
(launch/procs/leftovers.py). It ends when the launcher closes the control socket (or is gone: the socket's end, or
LAUNCHER_GONE, the death signal the launcher's spawn sets), and then SIGKILLs every process below it first (`_end`):
a `kill -9` of the launcher leaves nothing of the ranks behind, whatever their environment says.

Control socket (fd 3, AF_UNIX SOCK_SEQPACKET, one JSON message per packet):
  zygote → launcher  {"op": "ready", "pid", "import_s", "threads", "modules", "torch"} or {"op": "error", "error"}
  launcher → zygote  {"op": "spawn", "id", "kind", "name", "args", "env", "cpus", "mems"} with the rank's stdout
                     and stderr pipe ends as SCM_RIGHTS
  zygote → launcher  {"op": "started", "id", "pid"}, later {"op": "exit", "pid", "status"} (the raw wait status)

In each child, before the script, forked.py prepares the rank's process as a fresh `python` would start
(`forked.prepare_rank`), and the script then runs as an exec'd rank runs it (launch/pymain.py `run_forked`).

The warm process (warmserver.py) is a zygote too: it loads this file and serves each launch with `Server`.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import importlib.util
import json
import os
import selectors
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

CTL_FD = 3  # where the launcher's spawn(pass_fd=...) puts the control socket
MAX_MSG = 1 << 22  # the largest control message, either way (the launcher's side imports it from here)
# This file imports nothing of ddpboot (it runs as its own program, and its ranks must not carry ddpboot), so the
# little it shares with ddpboot/launch/procs/spawn.py (this prctl option) is written again here.
PR_SET_CHILD_SUBREAPER = 36
# The zygote's death signal (the launcher's spawn sets it): the launcher died. Not SIGKILL, so that the zygote can end
# its ranks and every orphan of theirs first; a real-time signal that nobody else sends (ranks' stacks use RTMIN+3).
LAUNCHER_GONE = signal.SIGRTMIN + 4
END_TIMEOUT = 30.0  # seconds `_end` keeps killing and reaping what is below it at most (a process stuck in the kernel)

_libc = ctypes.CDLL(None, use_errno=True)


HERE = os.path.dirname(__file__)


def load_file(path: str, name: str, **uses: Any) -> Any:
    """A standard-library file of ddpboot's, loaded as a module `name` of its own (not as part of ddpboot: the ranks
    must not carry ddpboot), as this file is run. `uses`: the modules it names that were loaded so before it."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    module.__dict__.update(uses)
    spec.loader.exec_module(module)
    return module


if TYPE_CHECKING:
    from ddpboot.launch import pymain
    from ddpboot.launch.faststart import forked as forked
    from ddpboot.launch.procs import reap as reap
else:  # run from its file, as this one is: nothing of ddpboot is imported
    pymain = load_file(os.path.join(os.path.dirname(HERE), "pymain.py"), "__ddpboot_pymain__")
    reap = load_file(os.path.join(os.path.dirname(HERE), "procs", "reap.py"), "__ddpboot_reap__")
    forked = load_file(os.path.join(HERE, "forked.py"), "__ddpboot_forked__",
                       mempolicy=load_file(os.path.join(os.path.dirname(HERE), "procs", "mempolicy.py"),
                                           "__ddpboot_mempolicy__"))


def start(path0: str) -> None:
    """What the zygote (and the warm process) does first: sys.argv its own file's alone, sys.path[0] as a rank's
    python has it at start (none under -P), and no trace left of how it was run (runpy's cache entry for its
    file: a rank's fresh python has none), so that the ranks inherit the start a fresh `python` has."""
    sys.argv = [sys.argv[0]]
    sys.path_importer_cache.pop(sys.argv[0], None)
    pymain.set_path0(path0)


def send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendmsg([json.dumps(msg).encode()])


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def ignore_signals() -> None:
    for sig in signal.valid_signals():
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            continue
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            signal.signal(sig, signal.SIG_IGN)


def _dispositions() -> dict[int, Any]:
    out = {}
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            with contextlib.suppress(OSError, ValueError):
                out[int(sig)] = signal.getsignal(sig)
    return out


def main() -> None:
    ctl = socket.socket(fileno=CTL_FD)
    path0, preload = sys.argv[1], [m for m in sys.argv[2].split(",") if m]
    start(path0)
    initial = _dispositions()
    ignore_signals()
    signal.signal(LAUNCHER_GONE, lambda *_: os._exit(0))  # while importing: no rank yet, nothing to end
    t0 = time.monotonic()
    torch_version = import_preloads(ctl, preload)
    import_s = time.monotonic() - t0
    gc.collect()
    gc.freeze()  # what the ranks inherit stays shared: no collector pass touches (copies) the imported objects
    try:
        send(ctl, {"op": "ready", "pid": os.getpid(), "import_s": import_s, "threads": thread_count(),
                    "modules": len(sys.modules), "torch": torch_version})
    except OSError:  # the launcher is gone
        os._exit(0)
    Server(ctl, initial).serve()


def import_preloads(ctl: socket.socket, preload: list[str]) -> str | None:
    """Import torch (if installed) and the `--preload` modules; torch's version. On failure, say so and exit."""
    try:
        import importlib

        torch_version = None
        try:
            import torch

            torch_version = torch.__version__
        except ImportError:
            pass
        for mod in preload:
            importlib.import_module(mod)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            send(ctl, {"op": "error", "error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    return torch_version


class Server:
    """The serving loop: spawn requests from the launcher, SIGCHLD (through a wake-up pipe) for the ranks' exits, the
    launcher's end. A child subreaper: what the ranks leave running is its child, reaped here, ended by `_end`."""

    def __init__(self, ctl: socket.socket, initial: dict[int, Any]) -> None:
        self.ctl = ctl
        self.initial = initial
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(LAUNCHER_GONE, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.sel = selectors.DefaultSelector()
        self.sel.register(ctl, selectors.EVENT_READ, "ctl")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.me = os.getpid()
        self.children: set[int] = set()

    def serve(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data == "wake":
                    if LAUNCHER_GONE in wakeups(self.wake_r):
                        self._end()
                else:
                    self._request()
            self._reap()

    def _request(self) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.ctl, MAX_MSG, 2)
        except InterruptedError:
            return
        except OSError:  # ECONNRESET: the launcher died with a message unread
            data, fds = b"", []
        if not data:  # the launcher is done (or gone)
            for fd in fds:
                os.close(fd)
            self._end()
        req = json.loads(data)
        if req.get("op") != "spawn" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return
        pid = os.fork()
        if pid == 0:
            self.sel.close()
            forked.prepare_rank(req, fds[0], fds[1], self.me, [self.ctl, _Fd(self.wake_r), _Fd(self.wake_w)],
                                self.initial, pymain.TargetKind(req["kind"]).words(req["name"], req["args"]))
            pymain.run_forked(req["kind"], req["name"], req["args"])
        for fd in fds:
            os.close(fd)
        self.children.add(pid)
        self._tell({"op": "started", "id": req["id"], "pid": pid})

    def _tell(self, msg: dict[str, Any]) -> None:
        try:
            send(self.ctl, msg)
        except OSError:  # the launcher is gone
            self._end()

    def _reap(self) -> None:
        """Every exited child (a rank, or an orphan it left and this process adopted); a rank's exit is reported."""
        for pid, status in reap.exited():
            if pid in self.children:
                self.children.discard(pid)
                self._tell({"op": "exit", "pid": pid, "status": status})

    def _end(self) -> None:
        """Exit, after SIGKILL to every process below this one: the ranks, and whatever they left running, which a
        subreaper has adopted (killing a child makes its own children ours: again until none is left). Each is an
        unreaped child of ours when signalled, so its pid cannot name another process. Never returns."""
        with contextlib.suppress(OSError):
            self.ctl.close()
        deadline = time.monotonic() + END_TIMEOUT
        while time.monotonic() < deadline:
            for pid in _children(self.me):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            try:
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass
            except ChildProcessError:
                break  # nothing below us any more
            time.sleep(0.005)
        os._exit(0)


def wakeups(fd: int) -> set[int]:
    """The signals a wake-up pipe (signal.set_wakeup_fd, non-blocking) has received since it was last read."""
    seen: set[int] = set()
    try:
        while data := os.read(fd, 512):
            seen.update(data)
    except BlockingIOError:
        pass
    return seen


def _children(pid: int) -> list[int]:
    """The live processes whose parent is `pid`, from /proc (zombies need no signal, only reaping)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and fields[0] != b"Z" and int(fields[1]) == pid:
            found.append(int(name))
    return found


class _Fd:
    """A raw descriptor with a close() like the socket's, for the child's clean-up list."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


if __name__ == "__ddpboot_zygote__":
    main()
