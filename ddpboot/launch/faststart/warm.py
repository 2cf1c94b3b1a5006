"""Warm launches, the launcher's side (`ddpboot --warm`, `DDPBOOT_WARM=1`): the ranks are forked by this user's warm
process on this node, which imported torch (and `--preload` modules) once and is kept between launches. Its own side
is zygote.py's warm mode: the first warm launch starts it, detached; each later launch connects to its socket and
gets a session, a fork of it that takes the launch's cwd, umask, limits, priority, CPUs, environment and stdio and
then serves this launch exactly as a fast-start process does (`WarmSession` is a `FastStartProcess`).

Nothing stale: the warm process is keyed (`warm_key`) by the interpreter (its path and file), the files it runs
(`RUNS`), the uid, groups, namespaces and cgroup, the preloads, and the environment variables read while Python
starts and torch is imported (`IMPORT_VARS`) as the user set them (not the OMP_NUM_THREADS ddpboot sets per rank:
each rank applies its own, zygote.py); it also stamps every file it imported and the site directories they came
from. A launch whose key differs, or that finds a stamp changed, is answered "stale": that warm process exits
(launches it serves go on) and this launch starts a fresh one.

Security: the socket lives in a 0700 directory of the user's (`$XDG_RUNTIME_DIR/ddpboot`, else `/tmp/ddpboot-UID`;
`DDPBOOT_WARM_DIR` overrides), is 0600, and each side checks the other's uid (SO_PEERCRED).

Never imports torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import resource
import signal
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpboot.launch import pymain
from ddpboot.launch.faststart import FORKED, ZYGOTE, FastStartProcess, python_path0, warmfiles
from ddpboot.launch.faststart.warmfiles import peer, read_exit, stamp
from ddpboot.launch.faststart.warmstart import SERVER, Lock, WarmError, start
from ddpboot.launch.faststart.zygote import MAX_MSG
from ddpboot.launch.procs.groups import NotOurGroup, signal_group
from ddpboot.launch.procs.procstat import group_still_ours
from ddpboot.launch.spec import Target

DIR_VAR = "DDPBOOT_WARM_DIR"
# The variables that Python reads as it starts (PYTHON*, the locale, TZ, HOME for the user site directory), the
# dynamic linker (LD_*), and torch and its OpenMP/BLAS libraries while torch is imported. Any change of one starts
# a fresh warm process. Others (CUDA_VISIBLE_DEVICES, NCCL_*, RANK, ...) are read by torch later, in the rank.
IMPORT_PREFIXES = ("PYTHON", "LD_", "LC_", "TORCH", "PYTORCH", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
IMPORT_VARS = ("LANG", "LANGUAGE", "TZ", "HOME", "VIRTUAL_ENV", "CONDA_PREFIX")
NOT_IMPORT = ("TORCHELASTIC_",)  # the launcher's own per-job variables, read by no import
# The files the warm process runs (their contents are in its key): a new ddpboot starts a fresh one.
RUNS = (SERVER, ZYGOTE, FORKED, Path(pymain.__file__), Path(warmfiles.__file__))


def warm_dir(env: Mapping[str, str]) -> Path:
    if env.get(DIR_VAR):
        return Path(env[DIR_VAR])
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.stat(runtime).st_uid == os.getuid():
        return Path(runtime) / "ddpboot"
    return Path(f"/tmp/ddpboot-{os.getuid()}")


def _host() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def socket_path(env: Mapping[str, str]) -> Path:
    """One warm process per user and node: the node's name is in the socket's (a directory shared between nodes
    holds one socket each)."""
    return warm_dir(env) / f"warm-{_host()}.sock"


def ensure_dir(path: Path) -> Path:
    """The socket's directory, created 0700; refused unless it is ours and no one else may enter it."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path):
        raise WarmError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise WarmError(f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); set {DIR_VAR} to a "
                        "directory of yours")
    if st.st_mode & 0o077:
        raise WarmError(f"{path} may be entered by others (mode {st.st_mode & 0o777:o}); chmod 700 it")
    return path


def import_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that the key holds (IMPORT_PREFIXES, IMPORT_VARS)."""
    return {k: v for k, v in sorted(env.items())
            if (k.startswith(IMPORT_PREFIXES) or k in IMPORT_VARS) and not k.startswith(NOT_IMPORT)}


def _namespaces() -> dict[str, str]:
    out = {}
    for ns in ("mnt", "pid", "net", "user", "ipc", "uts", "cgroup"):
        with contextlib.suppress(OSError):
            out[ns] = os.readlink(f"/proc/self/ns/{ns}")
    return out


def _cgroup() -> str:
    try:
        return Path("/proc/self/cgroup").read_text()
    except OSError:
        return ""


def warm_key(python: str, env: Mapping[str, str], preloads: Sequence[str], path0: str) -> dict[str, Any]:
    """What a warm process must have been started with to serve this launch (the module docstring)."""
    real = os.path.realpath(python)
    return {
        "interpreter": [python, real, stamp(real)],  # a venv's python is a link: its path names the venv
        "ddpboot": hashlib.sha256(b"".join(f.read_bytes() for f in RUNS)).hexdigest(),
        "user": [os.getuid(), os.getgid(), sorted(os.getgroups())],
        "namespaces": _namespaces(),
        "cgroup": _cgroup(),
        "preloads": [list(preloads), path0 if preloads else ""],
        "env": import_env(env),
    }


def _rlimits() -> dict[str, list[int]]:
    out = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            with contextlib.suppress(OSError, ValueError):
                out[name] = list(resource.getrlimit(getattr(resource, name)))
    return out


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _connect(path: Path) -> socket.socket | None:
    """A connection to the warm process, or None when there is none (no socket, or nobody listening)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError as exc:
        sock.close()
        raise WarmError(f"cannot connect to {path}: {exc.strerror or exc}") from None
    if peer(sock)[1] != os.getuid():
        sock.close()
        raise WarmError(f"{path} is served by another user's process")
    return sock


def _ask(sock: socket.socket, req: Mapping[str, Any], fds: Sequence[int] = (), timeout: float | None = 10.0
         ) -> dict[str, Any] | None:
    """Send one request, read one answer (None: the warm process closed the connection without one)."""
    sock.settimeout(timeout)
    try:
        socket.send_fds(sock, [json.dumps(req).encode()], list(fds))
        data = sock.recv(MAX_MSG)
    except (BrokenPipeError, ConnectionResetError):
        return None
    except TimeoutError:
        raise WarmError("the warm process did not answer within "
                        f"{timeout:.0f} s (`ddpboot warm stop` ends it)") from None
    if not data:
        return None
    answer: dict[str, Any] = json.loads(data)
    return answer


def request(env: Mapping[str, str], op: str) -> dict[str, Any] | None:
    """`status` or `stop` of this user's warm process on this node; None when there is none."""
    sock = _connect(socket_path(env))
    if sock is None:
        return None
    with sock:
        return _ask(sock, {"op": op})


def last_exit(env: Mapping[str, str]) -> dict[str, Any] | None:
    """Why the last warm process exited, as it wrote it (None: it never said: it was killed, or never ran)."""
    return read_exit(socket_path(env))


@dataclass(eq=False)
class WarmSession(FastStartProcess):
    """A session of the warm process: a `FastStartProcess` whose process is not the launcher's child (so it is not
    reaped here, and the ranks it forked are not the launcher's to reap if it dies: `lost` reports them)."""

    warm_pid: int = 0
    warm_pidfd: int | None = None
    sock_path: Path | None = None
    launches: int = 0

    def lost(self) -> list[tuple[int, int]]:
        """Once the session has gone: its ranks still unreported, killed (their parent died, so they die too,
        PR_SET_PDEATHSIG, and their groups with them), each as a death by SIGKILL."""
        if not self.gone:
            return []
        out = []
        for pid in sorted(self.running):
            if group_still_ours(pid, self.starts.get(pid)):  # a rank reaped by now: its number may be another's
                with contextlib.suppress(OSError, NotOurGroup):
                    signal_group(pid, signal.SIGKILL)
            out.append((pid, int(signal.SIGKILL)))
        self.running.clear()
        return out

    def warm_died(self) -> bool:
        """Whether the warm process died (killed, crashed) rather than exited on its own (stopped, idle, stale)."""
        if self.warm_pidfd is None:
            return False
        import select

        poller = select.poll()
        poller.register(self.warm_pidfd, select.POLLIN)
        if not poller.poll(0):
            return False  # still running
        said = read_exit(self.sock_path) if self.sock_path else None
        return said is None or said.get("pid") != self.warm_pid

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()
        if self.warm_pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.warm_pidfd)
            self.warm_pidfd = None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):
        return None


def ignored_signals(forwarded: Sequence[int]) -> list[int]:
    """The signals this launcher ignores and does not forward: an exec'd rank inherits them ignored (spawn.py resets
    the forwarded ones, and SIGPIPE and SIGXFSZ, which Python ignores for itself)."""
    skip = {int(signal.SIGKILL), int(signal.SIGSTOP), int(signal.SIGPIPE), int(signal.SIGXFSZ), *map(int, forwarded)}
    return sorted(int(s) for s in signal.valid_signals()
                  if int(s) not in skip and signal.getsignal(s) == signal.SIG_IGN)


def open_session(python: str, target: Target, cwd: Path, env: Mapping[str, str], preloads: Sequence[str],
                 idle: float, say: Callable[[str], None], tick: Callable[[], None], signals: Sequence[int] = (),
                 key_env: Mapping[str, str] | None = None) -> WarmSession:
    """A session of this user's warm process, started first if there is none, replaced if it is stale. `say`: the
    launcher's lines; `tick`: called at least twice a second while waiting (a stop signal ends the wait); `env`: what
    a fresh warm process imports with, and the session's environment; `key_env`: what the warm process is keyed by
    (the user's own, before ddpboot set OMP_NUM_THREADS for the ranks; default `env`); `signals`: those the
    launcher forwards (its ranks start with them at their defaults, as exec'd ranks do)."""
    ensure_dir(warm_dir(env))
    path = socket_path(env)
    path0 = python_path0(target, cwd)
    key = warm_key(python, env if key_env is None else key_env, preloads, path0)
    req = {"op": "session", "key": key, "cwd": str(cwd), "umask": _umask(), "rlimits": _rlimits(),
           "nice": os.getpriority(os.PRIO_PROCESS, 0), "cpus": sorted(os.sched_getaffinity(0)), "env": dict(env),
           "ignored": ignored_signals(signals), "idle": idle}
    for attempt in range(3):
        session = _try_session(path, req, path0, say)
        if session is not None:
            return session
        if attempt == 2:
            break
        with Lock(Path(warmfiles.beside(path, ".lock")), tick):
            session = _try_session(path, req, path0, say)  # another launch may have started one meanwhile
            if session is not None:
                return session
            start(python, key, env, preloads, path0, path, idle, tick)
    raise WarmError("the warm process it started answered stale twice (see the lines above)")


def _try_session(path: Path, req: Mapping[str, Any], path0: str, say: Callable[[str], None]) -> WarmSession | None:
    sock = _connect(path)
    if sock is None:
        said = read_exit(path)
        if path.exists() and said is None:
            say(f"note: warm: the warm process of {path} is gone without saying why (killed?); starting a fresh "
                "one")
        return None
    try:
        answer = _ask(sock, req, (0, 1, 2), timeout=30.0)
    except BaseException:
        sock.close()
        raise
    if answer is None or answer.get("op") != "ready":
        sock.close()
        if answer is None:
            say("note: warm: the warm process closed the connection without an answer (it died?); starting a "
                "fresh one")
        elif answer.get("op") == "stale":
            say(f"note: warm: a fresh warm process, since {answer.get('why')}")
        else:
            raise WarmError(f"the warm process refused this launch: {answer.get('why', answer)}")
        return None  # the fresh one's socket replaces this path (zygote.py binds elsewhere, then renames)
    sock.settimeout(None)
    warm = answer.get("warm", {})
    session = WarmSession(pid=int(answer["pid"]), sock=sock, path0=path0, info=answer,
                          warm_pid=int(warm.get("pid", 0)), sock_path=path, launches=int(warm.get("launches", 0)))
    session.warm_pidfd = _pidfd(session.warm_pid) if session.warm_pid else None
    return session
