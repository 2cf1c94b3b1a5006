"""Start one worker: fork + exec, in its own session, tied to the launcher's life. Linux only.

Why not subprocess.Popen: the supervisor reaps every child with `waitpid(-1)` (it is a child subreaper, so orphaned
grandchildren come to it too), which would steal exit statuses from Popen objects; and the child must set
PR_SET_PDEATHSIG before exec, which Popen only allows through preexec_fn. The launcher never starts a thread, so
running Python between fork and exec is safe here (the reason preexec_fn is discouraged does not apply).

In the child, before exec: a new session (the worker and everything it starts form one process group that the
launcher signals with killpg, and terminal signals do not reach it behind the launcher's back), PR_SET_PDEATHSIG
(SIGKILL when the launcher dies, e.g. kill -9; the guardian then kills the rest of the group), an empty signal mask
and default dispositions (the launcher blocks the signals it reads through a signalfd, and Python ignores SIGPIPE;
both would otherwise be inherited across exec) for SIGPIPE, SIGXFSZ and the signals the launcher forwards
(`reset_signals`: a background job of a non-interactive shell starts with SIGINT and SIGQUIT ignored, and an
ignored signal stays ignored across exec, so a forwarded Ctrl-C would never reach the rank), stdout/stderr onto
the launcher's pipes, the plan's CPU affinity, and every other inherited descriptor closed.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

from ddpboot.errors import DdpbootError
from ddpboot.launch.procs.mempolicy import prefer_nodes

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_libc = ctypes.CDLL(None, use_errno=True)


class SpawnError(DdpbootError):
    """A program could not be started (exec failed): nothing of it ran. `errno` is exec's error number, `program`
    the path exec was given; the message says why, with the #! interpreter where that is what is missing."""

    def __init__(self, program: str, errno_: int, text: str) -> None:
        super().__init__(f"cannot start {program}: {text} ({errno.errorcode.get(errno_, errno_)})"
                         f"{exec_failure_hint(program, errno_)}.")
        self.program = program
        self.errno = errno_

    @property
    def shell_code(self) -> int:
        """The exit code a shell gives a command it could not run: 127 for not found, 126 for found but not
        runnable (permission, format, a loop of #! interpreters)."""
        return 127 if self.errno == errno.ENOENT else 126


def shebang(path: str | os.PathLike[str]) -> list[str] | None:
    """The words of a file's `#!` line (the interpreter first); None without one or when it cannot be read."""
    try:
        with open(path, "rb") as f:
            head = f.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    return os.fsdecode(head[2:].split(b"\n", 1)[0]).split()


def exec_failure_hint(program: str, errno_: int) -> str:
    """What exec's error means for this program: ENOENT for a file that exists is its #! interpreter missing."""
    if errno_ == errno.ENOENT and os.path.isfile(program):
        words = shebang(program)
        if words:
            return f": its #! line names {words[0]}, which does not exist"
    if errno_ == errno.ENOEXEC:
        return ": not a binary the kernel can run (a script needs a #! line)"
    if errno_ == errno.EAGAIN:
        return ": your process limit (ulimit -u) is reached, counting every process and thread of yours"
    if errno_ == errno.ELOOP:
        return ": its #! interpreters name each other too deeply (the kernel follows 4)"
    return ""


def prctl(option: int, value: int) -> None:
    if _libc.prctl(option, value, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def become_subreaper() -> None:
    """Orphaned descendants (a worker's children whose parent died) are reparented to us, not to init: we reap
    them (no zombies) and their pids cannot be reused while a worker's process group still names them."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def _max_fd() -> int:
    try:
        return int(os.sysconf("SC_OPEN_MAX"))
    except (ValueError, OSError):
        return 65536


def spawn(
    argv: Sequence[str],
    env: Mapping[str, str],
    stdout: int,
    stderr: int,
    cpus: Sequence[int] = (),
    death_signal: int = signal.SIGKILL,
    pass_fd: int | None = None,
    mem_nodes: Sequence[int] = (),
    reset_signals: Sequence[int] = (),
) -> int:
    """Start `argv` (argv[0] must be a path) and return its pid, which is also its process group id. `pass_fd`, if
    given, is the one descriptor besides 0-2 that the program inherits, as its fd 3. `mem_nodes`: the NUMA nodes
    its memory is preferred from (procs/mempolicy.py). `reset_signals`: signals it starts with at their default
    disposition, whatever the launcher inherited (the ones the launcher forwards)."""
    parent = os.getpid()
    err_r, err_w = os.pipe()  # close-on-exec: EOF with no data means exec succeeded
    env_b = {k.encode(): v.encode() for k, v in env.items()}
    try:
        pid = os.fork()
    except OSError as exc:  # EAGAIN: the process limit (ulimit -u) is reached
        os.close(err_r)
        os.close(err_w)
        raise SpawnError(argv[0], exc.errno or 0, f"fork failed: {exc.strerror}") from None
    if pid == 0:  # pragma: no cover - runs in the child, observed through the worker's behaviour
        setup = _ChildSetup(argv, env_b, stdout, stderr, cpus, death_signal, pass_fd, parent, mem_nodes, reset_signals)
        _child(setup, err_r, err_w)
    os.close(err_w)
    failure = _read_all(err_r)
    if failure:
        os.waitpid(pid, 0)
        num, _, text = failure.decode(errors="replace").partition(":")
        raise SpawnError(argv[0], int(num or 0), text)
    return pid


def _read_all(fd: int) -> bytes:
    """Everything until end-of-file; closes `fd`."""
    try:
        chunks = []
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


@dataclass(frozen=True)
class _ChildSetup:
    argv: Sequence[str]
    env: dict[bytes, bytes]
    stdout: int
    stderr: int
    cpus: Sequence[int]
    death_signal: int
    pass_fd: int | None
    parent: int  # the launcher's pid
    mem_nodes: Sequence[int] = ()
    reset_signals: Sequence[int] = ()


def _child(setup: _ChildSetup, err_r: int, err_w: int) -> NoReturn:  # pragma: no cover - runs in the child
    """Prepare the forked child and exec the program; on failure, write `errno:text` to `err_w` and exit 127."""
    code = 127
    try:
        os.close(err_r)
        os.setsid()
        prctl(PR_SET_PDEATHSIG, setup.death_signal)
        if os.getppid() != setup.parent:  # the launcher died before prctl took effect
            os._exit(code)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        # What Python ignores for itself (as Popen restores), and what the launcher forwards (module docstring).
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, *setup.reset_signals):
            signal.signal(sig, signal.SIG_DFL)
        os.dup2(setup.stdout, 1)
        os.dup2(setup.stderr, 2)
        if setup.cpus:
            os.sched_setaffinity(0, setup.cpus)
        if setup.mem_nodes:
            with contextlib.suppress(OSError):  # a preference: the launcher said once if the kernel refuses it
                prefer_nodes(setup.mem_nodes)
        err_w = _close_inherited(setup.pass_fd, err_w)
        os.execve(setup.argv[0], list(setup.argv), setup.env)
    except OSError as exc:
        os.write(err_w, f"{exc.errno or 0}:{exc.strerror or exc}".encode())
    except BaseException as exc:
        os.write(err_w, f"0:{exc!r}".encode())
    finally:
        os._exit(code)


def _close_inherited(pass_fd: int | None, err_w: int) -> int:  # pragma: no cover - runs in the child
    """Close every descriptor above 2 except `err_w` (close-on-exec) and `pass_fd` (made fd 3, inheritable);
    returns where `err_w` is now."""
    low = 3
    if pass_fd is not None:
        if err_w <= 3:
            err_w = fcntl.fcntl(err_w, fcntl.F_DUPFD_CLOEXEC, 4)
        if pass_fd == 3:
            os.set_inheritable(3, True)
        else:
            os.dup2(pass_fd, 3)  # the copy is inheritable
        low = 4
    os.closerange(low, err_w)
    os.closerange(err_w + 1, _max_fd())
    return err_w
