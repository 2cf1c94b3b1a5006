"""Running a rank's target as python runs it, the one way for both ways a Python rank starts: exec'd (`python -u -c
LAUNCH WORDS`, launch/bootstrap.py) and forked by the fast-start or warm process (faststart/forked.py). Standard
library only, importing nothing of ddpboot: an exec'd rank runs this file's source, carried in its environment
(bootstrap.py), and a forked one loads it from this file, so that neither rank carries ddpboot.

`TargetKind` is what a rank runs, and owns its command line: `words` (what python is given after `-u`), `shown`
(the command as torchrun runs it: what `--dry-run` and the failure report show). `prepare` then sets the process up
as `python -u WORDS` would have it:

- `__main__` holds exactly what `python SCRIPT` gives it (`__file__` absolute, a SourceFileLoader, `__cached__`
  None, and `__file__` gone again once the script's code has run); a directory or a zip file runs its `__main__.py`
  as python does (runpy, with sys.path[0] the directory or zip itself, under -P too); `--run-path` is torchrun's
  `runpy.run_path(SCRIPT, run_name="__main__")` under `python -u -c`;
- sys.argv, sys.path[0] (the script's real directory; the working directory under -m; '' for `--run-path`'s `-c`;
  none under -P, PYTHONSAFEPATH) and sys.orig_argv as `python -u WORDS` would have them;
- an uncaught exception: its traceback starts at the script (this file's frames are dropped before sys.excepthook
  prints it), and the rank ends as the interpreter would (exit code 1, or death by SIGINT for a KeyboardInterrupt),
  after the usual finalisation (`run_execd`: the interpreter's own; `run_forked`: `finish`, the same steps).
"""

from __future__ import annotations

import contextlib
import os
import sys
from enum import Enum

TYPE_CHECKING = False  # typing is not imported at run time: a rank's python need not have loaded it
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType, TracebackType
    from typing import Any, NoReturn

# ddpboot/contract.py's STACKS_VAR, written again (this file imports nothing of ddpboot): `SIGNO:PATH`, faulthandler
# appends every thread's stack to PATH on signal SIGNO (the launcher's stack dumps; contract.register_stacks).
STACKS_VAR = "DDPBOOT_STACKS"
# ddpboot/contract.py's phases_file, written again: the file beside TORCHELASTIC_ERROR_FILE where a rank appends the
# marks of its start-up (`NAME UNIX_TIME` lines, observe/startup.py reads them).
PHASES_SUFFIX = ".phases"
# torchrun's --run-path: runpy.run_path in a fresh interpreter, as __main__ (what the rank's command shows).
RUN_PATH_CODE = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


class TargetKind(str, Enum):
    """What every rank runs (launch/spec.py Target.kind), with the words of its command line."""

    SCRIPT = "script"  # python -u SCRIPT ARGS; a directory or zip file with a __main__.py runs that
    MODULE = "module"  # python -u -m MODULE ARGS
    RUN_PATH = "run_path"  # torchrun's --run-path: python -u -c RUN_PATH_CODE SCRIPT ARGS
    BINARY = "binary"  # --no-python: the program itself

    def __str__(self) -> str:
        return str(self.value)

    @property
    def is_python(self) -> bool:
        return self is not TargetKind.BINARY

    def words(self, name: str, args: Sequence[str]) -> list[str]:
        """What the rank's python is given after `-u` (after the bootstrap's `-c` code, for an exec'd rank): `-m
        MODULE ARGS` for a module, `NAME ARGS` otherwise (a binary: its whole command)."""
        return ["-m", name, *args] if self is TargetKind.MODULE else [name, *args]

    def target_of(self, words: Sequence[str]) -> tuple[str, list[str]]:
        """`words`'s name and arguments: the inverse of `words`."""
        name, *args = words[1:] if self is TargetKind.MODULE else words
        return name, args

    def shown(self, python: str, name: str, args: Sequence[str]) -> list[str]:
        """The rank's command as torchrun runs it (`python -u SCRIPT ARGS`): what `--dry-run` and the failure report
        show; a Python rank runs exactly this, through the bootstrap or forked."""
        if self is TargetKind.BINARY:
            return self.words(name, args)
        code = ["-c", RUN_PATH_CODE] if self is TargetKind.RUN_PATH else []
        return [python, "-u", *code, *self.words(name, args)]


def absolute(name: str, cwd: str | None = None) -> str:
    """A script's path as python makes it absolute: joined to the working directory, not normalised."""
    return name if os.path.isabs(name) else os.path.join(os.getcwd() if cwd is None else cwd, name)


def main_importer(path: str) -> object | None:
    """The importer python runs a script path's `__main__.py` from (CPython's pymain_get_importer): a directory's or
    a zip file's; None for a plain file, or for none at all. Kept in sys.path_importer_cache, as python keeps it."""
    cache = sys.path_importer_cache
    if path not in cache:
        cache[path] = None
        for hook in sys.path_hooks:
            try:
                cache[path] = hook(path)
                break
            except ImportError:
                pass
    return cache[path]


def path0(kind: str, name: str, cwd: str | None = None) -> str:
    """sys.path[0] as python sets it for this target (without -P): the script's real directory, or a directory or
    zip file itself; the working directory for a module; '' (`-c`'s) for `--run-path`."""
    if kind == TargetKind.MODULE:
        return os.getcwd() if cwd is None else cwd
    if kind == TargetKind.RUN_PATH:
        return ""
    full = absolute(name, cwd)
    return full if main_importer(full) is not None else os.path.dirname(os.path.realpath(full))


def safe_path() -> bool:
    """-P or PYTHONSAFEPATH (Python 3.11): python puts no sys.path[0] before a script's or a module's code."""
    return bool(getattr(sys.flags, "safe_path", False))


def set_path0(path: str) -> None:
    """sys.path[0] as python sets it at start, in place of what `-c` put there; nothing under -P (safe_path), where
    `-c` put nothing. The fast-start process starts so too, and its ranks inherit its path."""
    if not safe_path():
        sys.path[0] = path


def _nothing() -> None:
    pass


def prepare(kind: str, name: str, args: Sequence[str], main: dict[str, Any]
            ) -> tuple[Callable[[], object], Callable[[], None]]:
    """Make this process `python -u WORDS` for the target (the module docstring): sys.argv, sys.path[0],
    sys.orig_argv, `main` (the __main__ module's namespace). Returns (run, done): run() runs the target's code;
    done() is what python does once a script's code has ended (its `__file__` and `__cached__` removed)."""
    kind = TargetKind(kind)
    orig: list[str] | None = getattr(sys, "orig_argv", None)
    sys.argv = [name, *args]
    done = _nothing
    if kind is TargetKind.MODULE:
        import runpy

        sys.argv = ["-m", *args]
        set_path0(path0(kind, name))
        run: Callable[[], object] = lambda: runpy._run_module_as_main(name)  # type: ignore[attr-defined]  # noqa: E731
    elif kind is TargetKind.RUN_PATH:
        import runpy

        orig = None  # torchrun's own `python -u -c CODE SCRIPT ARGS`
        set_path0(path0(kind, name))
        run = lambda: runpy.run_path(name, run_name="__main__")  # noqa: E731
    else:
        run, done = _script(name, main)
    if orig and "-c" in orig:  # the interpreter and its options, then the target's words
        sys.orig_argv = [*orig[: orig.index("-c")], *kind.words(name, args)]
    return run, done


def _script(name: str, main: dict[str, Any]) -> tuple[Callable[[], object], Callable[[], None]]:
    full = absolute(name)
    if main_importer(full) is not None:  # a directory or a zip file: its __main__.py, on sys.path even under -P
        import runpy

        if safe_path():
            sys.path.insert(0, full)
        else:
            sys.path[0] = full
        return (lambda: runpy._run_module_as_main("__main__", False)), _nothing  # type: ignore[attr-defined]
    set_path0(path0(TargetKind.SCRIPT, name))
    try:
        with open(full, "rb") as f:
            source = f.read()
    except OSError as e:
        prog = (getattr(sys, "orig_argv", None) or [sys.executable])[0]
        print(f"{prog}: can't open file {full!r}: [Errno {e.errno}] {e.strerror}", file=sys.stderr)
        raise SystemExit(2) from None
    set_file = "__file__" not in main
    loader = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", full)
    main.update(__file__=full, __cached__=None, __loader__=loader)

    def done() -> None:
        if set_file:
            main.pop("__file__", None)
            main.pop("__cached__", None)

    return (lambda: exec(compile(source, full, "exec", dont_inherit=True), main)), done


def from_the_target(tb: TracebackType | None) -> TracebackType | None:
    """A traceback without this file's frames at its start: it starts where python's would, at the script (at runpy's
    frames, for a module or a directory)."""
    own = from_the_target.__code__.co_filename
    while tb is not None and tb.tb_frame.f_code.co_filename == own:
        tb = tb.tb_next
    return tb


def register_stacks(value: str) -> None:
    """faulthandler on STACKS_VAR's `SIGNO:PATH` (the launcher's stack dumps read every rank so, without py-spy or
    ptrace); nothing when the value is not one. faulthandler keeps the file open (close-on-exec) until the end."""
    signo, _, path = value.partition(":")
    if signo.isdigit() and path:
        with contextlib.suppress(Exception):
            import faulthandler

            f = open(path, "a", encoding="utf-8")  # noqa: SIM115 -- faulthandler writes to it until the rank ends
            faulthandler.register(int(signo), file=f, all_threads=True, chain=False)


def record_phases(error_file: str) -> None:
    """The start-up's marks, appended to the phases file beside `error_file` (none without one): `up` now, `torch`
    once torch is imported, `cuda_start` and `cuda` around its first CUDA context (torch.cuda._lazy_init), `pg_start`
    and `pg` around init_process_group. The wrappers step aside after their first call."""
    if not error_file:
        return
    from time import time as clock

    path = error_file + PHASES_SUFFIX

    def mark(name: str) -> None:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, f"{name} {clock():.6f}\n".encode())
            finally:
                os.close(fd)

    mark("up")
    if "torch" in sys.modules:  # a forked rank: its parent imported torch, which is there from its start
        mark("torch")
        _torch_loaded(sys.modules["torch"], mark)
    else:
        def loaded(torch: ModuleType) -> None:
            mark("torch")
            _torch_loaded(torch, mark)

        sys.meta_path.insert(0, _AfterImport("torch", loaded))


class _AfterImport:
    """A meta path finder that calls `then(module)` once module `name` has been executed, then leaves."""

    def __init__(self, name: str, then: Callable[[ModuleType], object]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
                  ) -> ModuleSpec | None:
        if name != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        import importlib.util

        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run, then = loader.exec_module, self.then

        def exec_module(module: ModuleType) -> None:
            run(module)
            with contextlib.suppress(Exception):
                then(module)

        loader.exec_module = exec_module
        return spec


def _torch_loaded(torch: ModuleType, mark: Callable[[str], None]) -> None:
    """Wrap torch.cuda._lazy_init and init_process_group (torch.distributed's and distributed_c10d's names)."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and hasattr(cuda, "_lazy_init"):
        _first_call("cuda", mark, [cuda], "_lazy_init", lambda: not cuda.is_initialized())
    dist = sys.modules.get("torch.distributed")
    if dist is not None and hasattr(dist, "init_process_group"):
        c10d = sys.modules.get("torch.distributed.distributed_c10d")
        _first_call("pg", mark, [dist, *([c10d] if c10d is not None else [])], "init_process_group")


def _first_call(phase: str, mark: Callable[[str], None], homes: list[ModuleType], name: str,
                pending: Callable[[], bool] = lambda: True) -> None:
    """`NAME` of each of `homes` (where it is the same function) marks `PHASE_start` and, once it returned,
    `PHASE` around its first call, if that call is `pending`; the first call puts the original back."""
    import functools

    original = getattr(homes[0], name)
    homes = [m for m in homes if getattr(m, name, None) is original]

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        for m in homes:
            setattr(m, name, original)
        if not pending():
            return original(*args, **kwargs)
        mark(f"{phase}_start")
        result = original(*args, **kwargs)
        mark(phase)
        return result

    functools.update_wrapper(wrapper, original)
    for m in homes:
        setattr(m, name, wrapper)


def run_execd(kind: str) -> None:
    """An exec'd rank (`python -u -c LAUNCH WORDS`, sys.argv `["-c", *WORDS]`): the stacks signal, then the target
    in the interpreter's own __main__. The interpreter itself ends the rank as it would have (SystemExit untouched; an
    uncaught exception re-raised, printed from the script's frame by a sys.excepthook that steps aside again)."""
    register_stacks(os.environ.get(STACKS_VAR, ""))
    record_phases(os.environ.get("TORCHELASTIC_ERROR_FILE", ""))
    name, args = TargetKind(kind).target_of(sys.argv[1:])
    main = sys.modules["__main__"].__dict__
    done = _nothing
    try:
        run, done = prepare(kind, name, args, main)
        run()
        done()
    except SystemExit:
        raise
    except BaseException as e:
        tb = from_the_target(e.__traceback__)
        hook = sys.excepthook

        def once(t: type[BaseException], v: BaseException, _: object) -> None:
            sys.excepthook = hook
            v.__traceback__ = sys.last_traceback = tb
            hook(t, v, tb)
            done()

        sys.excepthook = once
        raise


def fresh_main() -> ModuleType:
    """A __main__ module as the interpreter makes one at start, before any code has run in it."""
    main = type(sys)("__main__")
    main.__dict__.update(__builtins__=sys.modules["builtins"], __annotations__={},
                         __loader__=sys.modules["_frozen_importlib"].BuiltinImporter)
    return main


def run_forked(kind: str, name: str, args: Sequence[str]) -> NoReturn:
    """A forked rank (its process prepared by faststart/forked.py, its environment in place): the stacks signal, the
    target in a fresh __main__, then the rank ends as the interpreter would (`finish`), never returning into the
    frames of the process that forked it."""
    register_stacks(os.environ.get(STACKS_VAR, ""))
    record_phases(os.environ.get("TORCHELASTIC_ERROR_FILE", ""))
    main = fresh_main()
    sys.modules["__main__"] = main
    done = _nothing
    try:
        run, done = prepare(kind, name, args, main.__dict__)
        run()
        done()
    except SystemExit as exc:
        finish(exit_code(exc))
    except BaseException as exc:
        tb = exc.__traceback__ = from_the_target(exc.__traceback__)
        # What python does for an uncaught exception before printing it (atexit handlers may look at them).
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        if sys.version_info >= (3, 12):
            sys.last_exc = exc
        with contextlib.suppress(Exception):
            sys.excepthook(type(exc), exc, tb)
        done()
        finish(1, interrupted=isinstance(exc, KeyboardInterrupt))
    finish(0)


def exit_code(exc: SystemExit) -> int:
    """CPython's handling of SystemExit's argument."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def finish(code: int, interrupted: bool = False) -> NoReturn:
    """The interpreter's exit sequence, without finalising the frames below the target (the fast-start process's):
    non-daemon threads joined, atexit handlers, stdio flushed, exit (death by SIGINT after a KeyboardInterrupt)."""
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
        import signal

        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)
