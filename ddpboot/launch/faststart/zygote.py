"""Fast start, the zygote's side: import torch once per node, then fork one child per rank and run the script in it
exactly as `python -u SCRIPT ARGS` would. Standard library only: this file runs in its own interpreter, started by
the launcher (launch/faststart/__init__.py) as `python -u -c ... zygote.py`, and imports nothing of ddpboot itself;
what it preloads (`--preload`; the pytest plugin preloads its own ddpboot.testing modules) the ranks inherit.

The zygote stays fork-safe: no Python threads, no CUDA (torch is imported, never initialised), no store (the
launcher's guardian serves it). It also ignores every catchable signal: SLURM's slurmstepd signals every process
of a step, and a zygote killed by the time-limit SIGTERM would take its ranks with it (they die with their parent,
PR_SET_PDEATHSIG) before they could checkpoint. It ends when the launcher closes the control socket, or with the
launcher (PR_SET_PDEATHSIG=SIGKILL, set by the launcher's spawn).

Control socket (fd 3, AF_UNIX SOCK_SEQPACKET, one JSON message per packet):
  zygote → launcher  {"op": "ready", "pid", "import_s", "threads", "modules", "torch"} or {"op": "error", "error"}
  launcher → zygote  {"op": "spawn", "id", "kind", "name", "args", "env", "cpus", "mems", "path0"} with the rank's
                     stdout and stderr pipe ends as SCM_RIGHTS
  zygote → launcher  {"op": "started", "id", "pid"}, later {"op": "exit", "pid", "status"} (the raw wait status)

In each child, before the script: a new session, PR_SET_PDEATHSIG (SIGKILL when the zygote dies), the dispositions
and empty signal mask a fresh `python` starts with, stdout/stderr onto the launcher's pipes, every other inherited
descriptor closed, the rank's CPU affinity and environment (os.environ replaced), torch's thread count from
OMP_NUM_THREADS (libgomp read the variable once, when the zygote imported torch), numpy's global random state
reseeded (Python's `random` reseeds itself after fork), then sys.argv, sys.path[0] and a fresh `__main__`. At the
end, what the interpreter does at exit: non-daemon threads joined, atexit handlers, stdio flushed, the exit code of
SystemExit or 1 with the traceback for an uncaught exception (KeyboardInterrupt: death by SIGINT, as python does).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import gc
import json
import os
import selectors
import signal
import socket
import sys
import time
import types
from typing import Any

CTL_FD = 3  # where the launcher's spawn(pass_fd=...) puts the control socket
MAX_MSG = 1 << 22  # the largest control message, either way (the launcher's side imports it from here)
# This file imports nothing of ddpboot (it runs as its own program, and its ranks must not carry ddpboot), so the
# little it shares with ddpboot/launch/procs/spawn.py (this prctl option, _max_fd) is written again here.
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _send(sock: socket.socket, msg: dict[str, Any]) -> None:
    sock.sendmsg([json.dumps(msg).encode()])


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def _ignore_signals() -> None:
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


def _fresh_dispositions(initial: dict[int, Any]) -> None:
    """What a new `python` process has: the dispositions the zygote itself started with (it was exec'd exactly as an
    exec'd rank would be: whatever was ignored before stays ignored, SIGINT raises KeyboardInterrupt, SIGPIPE and
    SIGXFSZ ignored by Python at start-up); nothing blocked."""
    for sig, handler in initial.items():
        with contextlib.suppress(OSError, ValueError, RuntimeError, TypeError):
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])


# ddpboot/contract.py's STACKS_VAR and its register_stacks, written again (this file imports nothing of ddpboot):
# `SIGNO:PATH`, faulthandler appends every thread's stack to PATH on signal SIGNO (the launcher's stack dumps).
STACKS_VAR = "DDPBOOT_STACKS"
_stacks_files: list[Any] = []


def _register_stacks(value: str) -> None:
    signo, _, path = value.partition(":")
    if signo.isdigit() and path:
        with contextlib.suppress(OSError, ValueError, RuntimeError):
            f = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- faulthandler writes to it until the rank ends
            faulthandler.register(int(signo), file=f, all_threads=True, chain=False)
            _stacks_files.append(f)


def _prefer_nodes(nodes: list[int]) -> None:
    """The rank's memory preferred from `nodes` (launch/procs/mempolicy.py says why; this process imports nothing of
    ddpboot): MPOL_PREFERRED_MANY, or MPOL_PREFERRED on the first node on a kernel without it."""
    number = {"x86_64": 238, "aarch64": 237, "ppc64le": 260}.get(os.uname().machine)
    if number is None:
        return
    for mode, chosen in ((5, nodes), (1, [min(nodes)])):
        words = max(chosen) // 64 + 1
        mask = (ctypes.c_ulong * words)()
        for n in chosen:
            mask[n // 64] |= 1 << (n % 64)
        if _libc.syscall(number, mode, mask, ctypes.c_ulong(words * 64 + 1)) == 0:
            return
    raise OSError(ctypes.get_errno(), "set_mempolicy failed")


def _show_command(req: dict[str, Any]) -> None:
    """The rank's command line as ps, top and py-spy show it: `python -u SCRIPT ARGS` (`-m MODULE` for a module),
    written over the zygote's own in this process's memory (as setproctitle does: words joined by spaces, cut to
    the room the zygote's command line had). Without it every rank would show the zygote's command line."""
    words = [getattr(sys, "orig_argv", [sys.executable])[0], "-u", *(["-m"] if req["kind"] == "module" else []),
             req["name"], *req["args"]]
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


def _exit_code(exc: SystemExit) -> int:
    """CPython's handling of SystemExit's argument."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _finish(code: int, interrupted: bool = False) -> None:
    """The interpreter's exit sequence, without finalising the zygote's frames: non-daemon threads, atexit,
    flush, exit."""
    threading = sys.modules.get("threading")
    if threading is not None:
        with contextlib.suppress(Exception):
            threading._shutdown()  # type: ignore[attr-defined]
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            code = 120 if code == 0 else code
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _run_target(req: dict[str, Any]) -> None:
    """Run the rank's target as __main__; never returns."""
    kind, name, args = req["kind"], req["name"], list(req["args"])
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    try:
        if kind == "module":
            import runpy

            sys.argv = ["-m", *args]
            sys.path[0] = req["path0"]
            sys.modules["__main__"] = main
            runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]
        elif kind == "run_path":
            import runpy

            sys.argv = [name, *args]
            sys.path[0] = req["path0"]
            runpy.run_path(name, run_name="__main__")
        else:
            sys.argv = [name, *args]
            sys.path[0] = req["path0"]
            path = os.path.abspath(name)
            if os.path.isdir(path) or not os.path.isfile(path):  # a directory or zip with __main__.py
                import runpy

                sys.modules["__main__"] = main
                runpy.run_path(path, run_name="__main__")
            else:
                from importlib.machinery import SourceFileLoader

                with open(path, "rb") as f:
                    source = f.read()
                main.__dict__.update(__file__=path, __cached__=None, __spec__=None, __package__=None,
                                     __loader__=SourceFileLoader("__main__", path))
                sys.modules["__main__"] = main
                code = compile(source, path, "exec", dont_inherit=True)
                exec(code, main.__dict__)
    except SystemExit as exc:
        _finish(_exit_code(exc))
    except BaseException as exc:
        tb = exc.__traceback__
        # Drop the zygote's own frames: the traceback starts where python's would, at the script.
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        exc.__traceback__ = tb
        # What python does for an uncaught exception before printing it (atexit handlers may look at them).
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        if sys.version_info >= (3, 12):
            sys.last_exc = exc
        with contextlib.suppress(Exception):
            sys.excepthook(type(exc), exc, tb)
        _finish(1, interrupted=isinstance(exc, KeyboardInterrupt))
    _finish(0)


def _child(req: dict[str, Any], out_fd: int, err_fd: int, zygote: int, keep_closed: list[Any],
           initial: dict[int, Any]) -> None:
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
                _prefer_nodes(req["mems"])
        os.environ.clear()
        os.environ.update(req["env"])
        _register_stacks(req["env"].get(STACKS_VAR, ""))
        _show_command(req)
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
    _run_target(req)


def main() -> None:
    ctl = socket.socket(fileno=CTL_FD)
    path0, preload = sys.argv[1], [m for m in sys.argv[2].split(",") if m]
    sys.argv = [sys.argv[0]]
    sys.path[0] = path0
    initial = _dispositions()
    _ignore_signals()
    t0 = time.monotonic()
    torch_version = _import_preloads(ctl, preload)
    import_s = time.monotonic() - t0
    gc.collect()
    gc.freeze()  # what the ranks inherit stays shared: no collector pass touches (copies) the imported objects
    _send(ctl, {"op": "ready", "pid": os.getpid(), "import_s": import_s, "threads": _threads(),
                "modules": len(sys.modules), "torch": torch_version})
    _Server(ctl, initial).serve()


def _import_preloads(ctl: socket.socket, preload: list[str]) -> str | None:
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
        _send(ctl, {"op": "error", "error": f"{type(exc).__name__}: {exc}"})
        os._exit(1)
    return torch_version


class _Server:
    """The serving loop: spawn requests from the launcher, SIGCHLD (through a wake-up pipe) for the ranks' exits."""

    def __init__(self, ctl: socket.socket, initial: dict[int, Any]) -> None:
        self.ctl = ctl
        self.initial = initial
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.sel = selectors.DefaultSelector()
        self.sel.register(ctl, selectors.EVENT_READ, "ctl")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        self.me = os.getpid()
        self.children: set[int] = set()

    def serve(self) -> None:
        while True:
            for key, _ in self.sel.select():
                if key.data == "wake":
                    self._drain_wakeups()
                else:
                    self._request()
            self._reap()

    def _drain_wakeups(self) -> None:
        try:
            while os.read(self.wake_r, 512):
                pass
        except BlockingIOError:
            pass

    def _request(self) -> None:
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.ctl, MAX_MSG, 2)
        except InterruptedError:
            return
        if not data:  # the launcher is done (or gone): the ranks' parent goes, and they with it
            for fd in fds:
                os.close(fd)
            os._exit(0)
        req = json.loads(data)
        if req.get("op") != "spawn" or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return
        pid = os.fork()
        if pid == 0:
            self.sel.close()
            _child(req, fds[0], fds[1], self.me, [self.ctl, _Fd(self.wake_r), _Fd(self.wake_w)], self.initial)
        for fd in fds:
            os.close(fd)
        self.children.add(pid)
        _send(self.ctl, {"op": "started", "id": req["id"], "pid": pid})

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            self.children.discard(pid)
            _send(self.ctl, {"op": "exit", "pid": pid, "status": status})


class _Fd:
    """A raw descriptor with a close() like the socket's, for the child's clean-up list."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


if __name__ == "__ddpboot_zygote__":
    main()
