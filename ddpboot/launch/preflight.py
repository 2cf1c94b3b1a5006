"""Checks made before anything starts: the program exists and can run (paths.py says why a path cannot be used),
and this machine can hold the job (rank count, processes, open files, listen queue).

Each failure is a UsageError (exit 2, nothing started) naming what was asked, what exists and what to do. The
module check finds the module the way `python -m` will, without importing it (importing a package's __init__ in
the launcher could run arbitrary code, or import torch).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ddpboot.errors import UsageError
from ddpboot.launch.paths import why_unusable
from ddpboot.launch.procs.spawn import shebang
from ddpboot.launch.spec import Target

ELF_MAGIC = b"\x7fELF"
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "csh", "tcsh"})


def check_python(env: Mapping[str, str]) -> str:
    """The interpreter the ranks run: PYTHON_EXEC (a path, or a name on PATH) or the launcher's own. One that does
    not exist or cannot run is an error now: found by exec in every rank, it would fail the job at its start."""
    given = env.get("PYTHON_EXEC")
    if not given:
        return sys.executable
    what = f"PYTHON_EXEC={given}"
    found = given if os.sep in given else shutil.which(given, path=env.get("PATH", os.defpath))
    if found is None:
        raise UsageError(f"{what}: no program {given!r} on PATH. Set PYTHON_EXEC to a Python interpreter's path "
                         f"(e.g. PYTHON_EXEC={sys.executable}), or unset it to use {sys.executable}.")
    _check_runnable(Path(found).absolute(), what, f"Set PYTHON_EXEC to a Python interpreter (e.g. {sys.executable}), "
                    "or unset it")
    return str(Path(found).absolute())


def script_interpreter(words: list[str]) -> str | None:
    """The program a `#!` line runs: its first word, or for `#!/usr/bin/env [-S] NAME` the NAME."""
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    return words[0] if words else None


def _starts_elf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == ELF_MAGIC
    except OSError:
        return False


def _refuse_unusable(path: Path, what: str, missing: Callable[[], str]) -> None:
    """UsageError when `path` cannot be used (paths.py says why): `missing()` when it does not exist, else `what`
    and the reason."""
    problem = why_unusable(path)
    if problem == "does not exist":
        raise UsageError(missing())
    if problem is not None:
        raise UsageError(f"{what} {problem}.")


def _check_runnable(path: Path, what: str, todo: str) -> None:
    """A program exec can start: it exists, is a file with the x bit, and its #! interpreter exists."""
    _refuse_unusable(path, f"{what}: {path}", lambda: f"{what}: {path} does not exist. {todo}.")
    if path.is_dir():
        raise UsageError(f"{what}: {path} is a directory, not a program. {todo}.")
    if not os.access(path, os.X_OK):
        raise UsageError(f"{what}: {path} is not executable (no x permission for you). Make it executable "
                         f"(chmod +x {path}), or: {todo[0].lower()}{todo[1:]}.")
    words = shebang(path)
    if words is not None:
        interpreter = words[0] if words else ""
        if not interpreter or not os.path.isfile(interpreter) or not os.access(interpreter, os.X_OK):
            missing = "names no interpreter" if not interpreter else f"names {interpreter}, which " + (
                "does not exist" if not os.path.exists(interpreter) else "is not an executable file")
            raise UsageError(f"{what}: {path} starts with a #! line that {missing}. Fix its first line (e.g. "
                             "#!/usr/bin/env bash), or run it through its interpreter.")


def check_target(target: Target, python: str, env: Mapping[str, str], cwd: Path) -> Target:
    """The target with its name made absolute where that matters (a binary found on PATH); raises UsageError."""
    if target.kind in ("script", "run_path"):
        _check_script(target.name, cwd, "--run-path" if target.kind == "run_path" else "")
        return target
    if target.kind == "module":
        _check_module(target.name, python, env, cwd)
        return target
    return Target(target.kind, _check_binary(target.name, env, cwd), target.args)


def _check_script(name: str, cwd: Path, via: str) -> None:
    if not name.strip():
        raise UsageError("the script name is empty (''). Give the path of the training script, e.g. "
                         "`ddpboot --nproc 2 train.py`; for a module use -m NAME.")
    path = Path(name) if os.path.isabs(name) else cwd / name
    what = f"the script {name!r}" + (f" ({via})" if via else "")
    _refuse_unusable(path, what, lambda: f"{what} does not exist (looked for {path}).{_nearby(path)} "
                     f"{_not_found_todo(name)}")
    if path.is_dir():
        if not (path / "__main__.py").is_file():
            raise UsageError(f"{what} is a directory without __main__.py; give the script inside it.")
        return
    if not os.access(path, os.R_OK):
        raise UsageError(f"{what} exists but is not readable by you ({path}); check its permissions.")
    _check_is_python(path, what)


def _nearby(path: Path, most: int = 8) -> str:
    """The Python files beside a missing script (that exist), as a hint; '…' where there are more."""
    if not path.parent.is_dir():
        return ""
    near = sorted(p.name for p in path.parent.glob("*.py") if p.exists())
    if not near:
        return ""
    more = ", …" if len(near) > most else ""
    return f" Python files there: {', '.join(near[:most])}{more}."


def _not_found_todo(name: str) -> str:
    """What to do about a script name that is no file: a subcommand's typo, a program, or the training script."""
    if os.path.basename(name).startswith("python") and shutil.which(name):
        return (f"{name!r} is the Python interpreter: ddpboot runs the script with Python itself, so drop "
                f"{name!r} (`ddpboot --nproc 2 train.py`), or set PYTHON_EXEC={name} to use that interpreter.")
    if os.sep not in name and shutil.which(name):
        return f"{name!r} is a program on PATH: run it with --no-python (`ddpboot --no-python {name} ...`)."
    return "Give the path of the training script; for a module use -m NAME, for a program --no-python."


def _check_is_python(path: Path, what: str) -> None:
    """A shell script or a compiled program given as the script: Python would stop at its first line with a
    SyntaxError in every rank; say what it is instead."""
    kind = None
    words = shebang(path)
    interpreter = script_interpreter(words) if words else None
    if interpreter is not None and os.path.basename(interpreter) in SHELLS:
        kind = f"a {os.path.basename(interpreter)} script (#!{' '.join(words or ())}), not Python"
    elif _starts_elf(path):
        kind = "a compiled program (ELF), not a Python script"
    if kind is not None:
        raise UsageError(f"{what} is {kind}: Python would stop at its first line in every rank. Run it with "
                         f"--no-python (`ddpboot --no-python ... {path.name}`), which executes it directly.")


def _search_path(python: str, env: Mapping[str, str], cwd: Path) -> list[str]:
    """Where `python -m` looks: the current directory, PYTHONPATH, then the interpreter's own path."""
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return [str(cwd), *extra, *sys.path[1:]]


def is_module_name(name: str) -> bool:
    """Dotted identifiers (mypkg.train), as `python -m` and `import` take them."""
    return all(part.isidentifier() for part in name.split("."))


def _check_module(name: str, python: str, env: Mapping[str, str], cwd: Path) -> None:
    if name.endswith(".py") or os.sep in name:
        stem = name.removesuffix(".py").replace(os.sep, ".").strip(".")
        raise UsageError(
            f"-m {name}: that is a file name, not a module name. Drop -m to run the script, or write -m {stem}."
        )
    if not is_module_name(name):
        raise UsageError(f"-m {name!r} is not a module name (dotted identifiers, e.g. -m mypkg.train).")
    if os.path.realpath(python) != os.path.realpath(sys.executable):
        return  # another interpreter (PYTHON_EXEC): only it knows its modules; it will say so itself
    parts = name.split(".")
    saved = list(sys.path)
    try:
        sys.path[:] = _search_path(python, env, cwd)
        spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else sys.modules[parts[0]].__spec__
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    if spec is None:
        raise UsageError(
            f"-m {name}: no module named {parts[0]!r} in the current directory ({cwd}), PYTHONPATH or the packages "
            f"of {python}. Check the name, run from the directory that contains it, or add it to PYTHONPATH."
        )
    found = parts[0]
    for part in parts[1:]:
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            raise UsageError(f"-m {name}: {found!r} ({spec.origin if spec else '?'}) is a module, not a package, "
                             f"so it has no submodule {part!r}.")
        fullname = f"{found}.{part}"
        spec = importlib.machinery.PathFinder.find_spec(fullname, list(locations))
        if spec is None:
            where = ", ".join(str(x) for x in locations)
            raise UsageError(f"-m {name}: package {found!r} ({where}) has no module {part!r}.")
        found = fullname
    if spec is not None and spec.submodule_search_locations and spec.origin not in (None, "namespace"):
        main = importlib.machinery.PathFinder.find_spec(f"{found}.__main__", list(spec.submodule_search_locations))
        if main is None:
            raise UsageError(f"-m {name} is a package without __main__.py; name the module to run inside it.")


def _check_binary(name: str, env: Mapping[str, str], cwd: Path) -> str:
    if os.sep in name:
        path = Path(name) if os.path.isabs(name) else cwd / name
        _check_runnable(path, f"--no-python {name}", "Give a program to run, or drop --no-python to run a Python "
                        "script")
        return str(path)
    found = shutil.which(name, path=env.get("PATH", os.defpath))
    if found is None:
        raise UsageError(
            f"--no-python: no program {name!r} on PATH ({env.get('PATH', os.defpath)}). Give its path, or drop "
            "--no-python to run a Python script."
        )
    _check_runnable(Path(found), f"--no-python {name}", "Fix the program, or give another")
    return found


RANKS_PER_CORE = 16  # beyond this, ranks mostly wait for a core: start-up alone takes minutes, collectives time out
FDS_PER_RANK = 5
"""Files the launcher holds per rank at most: the read ends of its stdout and stderr pipes (2), its log file with
--log-dir or -t/-r (1), and, while a stack dump runs, the two pipes of its py-spy (2). Measured: 8 ranks with
--log-dir, 32 files open in the launcher before a dump (8 of its own, 3 per rank)."""
LAUNCHER_FILES = 24
"""The launcher's own files: 8 measured (stdin, stdout, stderr, the signalfd, the epoll, the store's socket, the
guardian's pipe, /dev/null), and 16 kept for what it opens besides: NVML's device files (one per GPU and 2), the
fast-start process's socket, a file written or read a moment (status.json, a stacks file)."""
STORE_FILES = 16  # the store server's own (10 measured: stdio, its listeners, epolls, the launcher's pipe)
STORE_CONNECTIONS_PER_RANK = 2
"""Connections one rank holds to the job's store: 1 measured (the default process group's TCPStore client, gloo and
NCCL alike; its PrefixStores share it), and 1 more for a group split off it (`split_group` clones the client)."""
LAUNCHER_PROCS = 1  # the guardian (the store, the orphan killer); one more forks the ranks with --fast-start, --warm
CAP_SYS_ADMIN, CAP_SYS_RESOURCE = 21, 24  # linux/capability.h


def open_files_needed(local_ranks: int, served_ranks: int, nnodes: int = 1) -> int:
    """Files the most loaded of the launcher's processes holds open: the launcher itself (FDS_PER_RANK per local
    rank) or the store server (STORE_CONNECTIONS_PER_RANK per rank it serves, and one per node's check-in)."""
    launcher = local_ranks * FDS_PER_RANK + LAUNCHER_FILES
    store = served_ranks * STORE_CONNECTIONS_PER_RANK + nnodes + STORE_FILES if served_ranks else 0
    return max(launcher, store)


SOMAXCONN = Path("/proc/sys/net/core/somaxconn")


MAX_LISTENERS = 32  # 131,072 connections at the default cap; each costs one file (STORE_FILES)
LISTEN_HEADROOM = 1.5
"""Listen-queue room per connection that may arrive at once: the kernel spreads a SO_REUSEPORT group's connections
by a hash of their addresses, so one queue gets more than its share."""


@dataclass(frozen=True)
class ListenQueue:
    """How this node's store listens: `sockets` (1, or a SO_REUSEPORT group: tcpstore/address.py), and a note when
    even they cannot queue every connection that may arrive at once."""

    sockets: int = 1
    note: str | None = None


def listen_queue(served_ranks: int, nnodes: int, backend: str = "python", somaxconn: Path = SOMAXCONN) -> ListenQueue:
    """net.core.somaxconn caps every listen queue (the store asks for 65535). Connections beyond it are dropped
    during their handshake and retried by the client's kernel a second or more later, which then sets the whole
    job's rendezvous time (benchmarks/RESULTS.md). ddpboot's store then listens on enough sockets of one port that
    their queues hold them all; torch's serves one socket (`--store torch`), and the note names the sysctl."""
    at_once = served_ranks + nnodes  # every rank's first store client, and each node's check-in
    try:
        limit = int(somaxconn.read_text())
    except (OSError, ValueError):
        return ListenQueue()
    if not served_ranks or at_once <= limit or limit <= 0:
        return ListenQueue()
    sockets = 1 if backend == "torch" else min(MAX_LISTENERS, -(-int(at_once * LISTEN_HEADROOM) // limit))
    if sockets * limit >= at_once * LISTEN_HEADROOM:
        return ListenQueue(sockets)
    needed = -(-int(at_once * LISTEN_HEADROOM) // sockets)  # the queue each socket would need
    queues = "one listening socket (--store torch: torch's server)" if sockets == 1 else f"{sockets} listening sockets"
    return ListenQueue(sockets, (
        f"this node's store may get {at_once} connections at once, more than its {queues} can queue: the kernel "
        f"caps each queue at {limit} waiting connections (net.core.somaxconn). Connections beyond that are dropped "
        f"and retried a second or more later, which delays every rank's start. To avoid it, raise the cap on this "
        f"node before starting ddpboot: `sysctl -w net.core.somaxconn={needed}` (as root)."
    ))


def nproc_applies() -> bool:
    """Whether the kernel holds this process to RLIMIT_NPROC: not for root (real uid 0), nor with CAP_SYS_ADMIN or
    CAP_SYS_RESOURCE (kernel/fork.c)."""
    if os.getuid() == 0:
        return False
    try:
        status = Path("/proc/self/status").read_text()
        caps = int(status.split("CapEff:", 1)[1].split()[0], 16)
    except (OSError, IndexError, ValueError):
        return True
    return not caps & (1 << CAP_SYS_ADMIN | 1 << CAP_SYS_RESOURCE)


def tasks_of(uid: int) -> int:
    """The processes (threads, as the kernel counts them for RLIMIT_NPROC) that `uid` runs now, as /proc shows."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
            real = int(status.split("\nUid:", 1)[1].split()[0])
            if real == uid:
                count += int(status.split("\nThreads:", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return count


def _check_processes(ranks: int, forked: bool) -> None:
    import resource

    limit = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if limit == resource.RLIM_INFINITY or not nproc_applies():
        return
    running = tasks_of(os.getuid())
    own = LAUNCHER_PROCS + forked
    needed = ranks + own
    if running + needed <= limit:
        return
    fits = limit - running - own
    fewer = f"Ask for at most {fits} rank{'s' if fits != 1 else ''}, or raise" if fits > 0 else "Raise"
    helpers = "its guardian and the process that forks the ranks" if forked else "its guardian"
    raise UsageError(
        f"--nproc {ranks}: the job needs {needed} processes ({ranks} rank{'s' if ranks != 1 else ''} and {own} of "
        f"the launcher's: {helpers}) besides the {running} you run now (each thread counts, this launcher "
        f"included), but your process limit (ulimit -u, RLIMIT_NPROC) is {limit}. {fewer} the limit before "
        f"starting ddpboot (`ulimit -u {running + needed + 16 * ranks}` leaves each rank room for 16 threads; torch "
        "starts several)."
    )


def check_rank_count(ranks: int, oversubscribe: bool, forked: bool = False) -> None:
    """Refuse a rank count this machine cannot run: more processes than RLIMIT_NPROC allows (the ranks, the
    launcher's own, `forked`: one more that forks the ranks, and those the user runs already; only where the kernel
    applies the limit), or (unless
    `oversubscribe`) more than RANKS_PER_CORE ranks per usable core. The open-file limit is checked once the plan
    says how many ranks this node runs and its store serves (ensure_open_files, before the store listens)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    _check_processes(ranks, forked)
    if not oversubscribe and ranks > RANKS_PER_CORE * cores:
        raise UsageError(
            f"--nproc {ranks}: {ranks} ranks on {cores} usable CPU core{'s' if cores != 1 else ''} is more than "
            f"{RANKS_PER_CORE} per core, where start-up alone takes minutes and collectives time out. Ask for at "
            f"most {RANKS_PER_CORE * cores} ranks, or add --oversubscribe to start them anyway."
        )


def ensure_open_files(local_ranks: int, served_ranks: int, nnodes: int = 1, apply: bool = True) -> None:
    """Make the soft RLIMIT_NOFILE hold open_files_needed(): raise it up to the hard limit without a word (the
    store's server and the workers inherit it; only with `apply`: a plan or a dry run checks and changes nothing),
    or raise a UsageError with the numbers and what to raise when even the hard limit is too low. `served_ranks`:
    the job's ranks on every node where this node serves the store, else 0."""
    import resource

    needed = open_files_needed(local_ranks, served_ranks, nnodes)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    if hard == resource.RLIM_INFINITY or needed <= hard:
        if apply:
            resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))
        return
    asked = f"--nproc {local_ranks}" + (f" on {nnodes} nodes" if nnodes > 1 else "")
    if served_ranks and needed > local_ranks * FDS_PER_RANK + LAUNCHER_FILES:
        what = (f"this node's store serves all {served_ranks} ranks and needs about {needed} open files "
                f"({STORE_CONNECTIONS_PER_RANK} connections per rank, 1 per node, {STORE_FILES} of its own)")
        fits = f"at most {max((hard - STORE_FILES - nnodes) // STORE_CONNECTIONS_PER_RANK, 0)} ranks in all"
    else:
        what = (f"the launcher needs up to {FDS_PER_RANK} open files per rank (its output pipes, its log file, "
                f"py-spy's pipes during a stack dump) and {LAUNCHER_FILES} of its own (8 measured, the rest kept "
                f"for NVML's device files and the files it opens a moment), {needed} in all")
        fits = f"at most {max((hard - LAUNCHER_FILES) // FDS_PER_RANK, 0)} ranks"
    fewer = f"Ask for {fits}, or raise" if not fits.startswith("at most 0 ") else "Raise"
    raise UsageError(
        f"{asked}: {what}, but the open-file limit (ulimit -n, RLIMIT_NOFILE) is {soft} (hard limit {hard}). "
        f"{fewer} the hard limit to at least {needed}: `ulimit -Hn {needed}` as root before "
        f"starting ddpboot, LimitNOFILE={needed} in a systemd unit, or a `nofile` line in /etc/security/limits.conf."
    )
