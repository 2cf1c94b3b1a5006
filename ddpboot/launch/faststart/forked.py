"""Fast start, a rank's side: what runs in the child the zygote (zygote.py) forked, before and after the script.
Standard library only, loaded by zygote.py from this file, not imported as part of ddpboot: the ranks must not
carry ddpboot.

Before the script: a new session, PR_SET_PDEATHSIG (SIGKILL when the zygote dies), the dispositions and empty signal
mask a fresh `python` starts with, stdout/stderr onto the launcher's pipes, every other inherited descriptor closed,
the rank's CPU affinity and environment (os.environ replaced), torch's thread count from OMP_NUM_THREADS (libgomp
read the variable once, when the zygote imported torch), numpy's global random state reseeded (Python's `random`
reseeds itself after fork), then sys.argv, sys.path[0] and a fresh `__main__`. At the end, what the interpreter
does at exit: non-daemon threads joined, atexit handlers, stdio flushed, the exit code of SystemExit or 1 with the
traceback for an uncaught exception (KeyboardInterrupt: death by SIGINT, as python does).
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import os
import signal
import sys
import types
from typing import Any

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


def run_rank(req: dict[str, Any], out_fd: int, err_fd: int, zygote: int, keep_closed: list[Any],
             initial: dict[int, Any]) -> None:
    """In the child the zygote just forked: prepare the rank's process (the module docstring), run its target;
    never returns. `zygote`: the parent's pid; `keep_closed`: its descriptors, as objects with close()."""
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
