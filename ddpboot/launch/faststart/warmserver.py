"""The warm process (`ddpboot --warm`; the launcher's side is warm.py). Standard library only, like zygote.py, whose
functions it loads from that file, and warmfiles.py, the files both sides name alike (not as modules of ddpboot: the
ranks it forks must not carry ddpboot).

Started detached by the first warm launch as `python -u -c BOOT warmserver.py CONF` (CONF: JSON with the socket's
path, the key the launcher computed, the preloads and their sys.path[0], the idle time). It imports as the zygote
does (never initialising CUDA: a preload that does is refused), says "ready" (or "error") on fd 3 to the launcher
that started it, and serves a 0600 AF_UNIX SOCK_SEQPACKET socket. Each connection from a process of its own uid
(SO_PEERCRED; others are refused) sends one request:
  {"op": "status"}                        → the warm process's state
  {"op": "stop"}                          → it says "stopping" and exits (running launches go on)
  {"op": "session", "key", "cwd", "umask", "rlimits", "nice", "cpus", "env", "ignored", "idle"} with the
  launcher's stdin, stdout and stderr as SCM_RIGHTS  → "stale" (then it exits: a fresh one replaces it) or a
  session: a forked child that takes the launcher's cwd, umask, limits, priority, CPUs, environment and stdio (and
  gives its ranks the dispositions an exec'd rank of that launch starts with: `ignored`, the signals the launcher
  ignores and does not forward), says "ready" and is a zygote on that connection (zygote.py's Server) until the
  launcher closes it or is gone; it then ends every process below it (the ranks, and what they left running: it
  is their subreaper) and exits, without a word on the launch's terminal.
A session is not tied to the warm process: if the warm process dies, running launches go on. It exits after the
idle time without sessions, on SIGTERM, or when replaced; it then writes why to the `.exit` file beside the socket
(warmfiles.py).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import json
import os
import resource
import selectors
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ddpboot.launch.faststart import warmfiles as files
    from ddpboot.launch.faststart import zygote as z
else:  # run from its file, as zygote.py is (loaded here under a name that does not run its main()): nothing of
    # ddpboot is imported; zygote.py's loader then takes warmfiles.py
    _spec = importlib.util.spec_from_file_location("__ddpboot_zygote_lib__", os.path.join(os.path.dirname(__file__),
                                                                                        "zygote.py"))
    z = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(z)
    files = z.load_file(os.path.join(z.HERE, "warmfiles.py"), "__ddpboot_warmfiles__")


def _imported_files(path0: str) -> dict[str, list[int] | None]:
    """What a change of would make the warm process stale: every imported module's file, every site directory
    (site-packages, dist-packages: a package installed or removed there changes its mtime) and each other sys.path
    directory that modules came from, with their .pth files; not the script's own directory (its files change all
    the time; only --preload modules come from it, and their files are stamped)."""
    found = {f for m in list(sys.modules.values()) if isinstance(f := getattr(m, "__file__", None), str)}
    dirs = sorted({p for p in sys.path if p and p != path0 and os.path.isdir(p)}, key=len, reverse=True)
    used = {d for d in dirs if os.path.basename(d.rstrip(os.sep)) in ("site-packages", "dist-packages")}
    for f in found:
        for d in dirs:
            if f.startswith(d.rstrip(os.sep) + os.sep):
                used.add(d)
                break
    for d in used:
        with contextlib.suppress(OSError):
            found.update(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".pth"))
    return {p: files.stamp(p) for p in sorted(found | used)}


def _changed(stamps: dict[str, list[int] | None]) -> str | None:
    for path, stamp in stamps.items():
        if files.stamp(path) != stamp:
            return path
    return None


def _warm_main(conf: dict[str, Any]) -> None:
    ready = socket.socket(fileno=z.CTL_FD)
    path0 = conf["path0"]
    z.start(path0)
    z.ignore_signals()
    t0 = time.monotonic()
    torch_version = z.import_preloads(ready, list(conf["preload"]))
    import_s = time.monotonic() - t0
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        z.send(ready, {"op": "error", "error": "CUDA was initialised while importing the preloads: a warm process "
                     "must not hold a CUDA context (drop that module from --preload)"})
        os._exit(1)
    stamps = _imported_files(path0)
    os.chdir("/")
    gc.collect()
    gc.freeze()
    listen = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    path = conf["socket"]
    tmp = f"{path}.{os.getpid()}"
    old = os.umask(0o077)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        listen.bind(tmp)
        os.rename(tmp, path)
    finally:
        os.umask(old)
    listen.listen(64)
    warm = _Warm(listen, conf, stamps, torch_version)
    z.send(ready, {"op": "ready", "pid": os.getpid(), "import_s": import_s, "torch": torch_version,
                 "modules": len(sys.modules), "files": len(stamps)})
    ready.close()
    warm.serve()


class _Warm:
    """The warm process's loop: connections on the socket, its sessions' exits (SIGCHLD), SIGTERM, the idle time."""

    def __init__(self, listen: socket.socket, conf: dict[str, Any], stamps: dict[str, list[int] | None],
                 torch_version: str | None) -> None:
        self.resource = resource
        self.listen = listen
        self.conf = conf
        self.key = conf["key"]
        self.idle = float(conf["idle"])
        self.path = conf["socket"]
        self.inode = os.stat(self.path).st_ino
        self.files = stamps
        self.torch_version = torch_version
        self.me = os.getpid()
        self.started = time.time()
        self.last = time.monotonic()
        self.launches = 0
        self.sessions: dict[int, dict[str, Any]] = {}
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)
        self.sel = selectors.DefaultSelector()
        self.sel.register(listen, selectors.EVENT_READ, "listen")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")

    def log(self, text: str) -> None:
        with contextlib.suppress(Exception):
            print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ddpboot warm (pid {self.me}): {text}", file=sys.stderr,
                  flush=True)

    def serve(self) -> None:
        self.log(f"ready: torch {self.torch_version}, {len(self.files)} files watched, socket {self.path}")
        while True:
            timeout = None if self.sessions else max(0.0, self.last + self.idle - time.monotonic())
            events = self.sel.select(timeout)
            for key, _ in events:
                if key.data == "wake":
                    if signal.SIGTERM in z.wakeups(self.wake_r):
                        self.quit("stopped by SIGTERM")
                else:
                    self._accept()
            self._reap()
            if not self.sessions and time.monotonic() >= self.last + self.idle:
                self.quit(f"idle for {self.idle:.0f} s")

    def _reap(self) -> None:
        if not self.sessions:
            return
        for pid, _status in z.reap.exited():
            if self.sessions.pop(pid, None) is not None:
                self.last = time.monotonic()
                if not self.sessions:
                    return

    def quit(self, why: str) -> None:
        """Exit: the socket removed (if it is still this process's), why written beside it. Sessions go on."""
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self.inode:
                os.unlink(self.path)
        files.write_exit(self.path, self.me, why)
        self.log(f"exits: {why}")
        os._exit(0)

    def _accept(self) -> None:
        try:
            conn, _ = self.listen.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            conn.settimeout(5.0)
            peer, uid, _gid = files.peer(conn)
            data, fds, _flags, _addr = socket.recv_fds(conn, z.MAX_MSG, 3)  # read first: an unread close resets
            if uid != os.getuid():
                self.log(f"refused a connection from pid {peer}: uid {uid} is not this process's ({os.getuid()})")
                z.send(conn, {"op": "refused", "why": f"the warm process belongs to uid {os.getuid()}"})
                return
            req = json.loads(data) if data else {}
            op = req.get("op")
            if op == "status":
                z.send(conn, self.status())
            elif op == "stop":
                z.send(conn, {"op": "stopping", "pid": self.me, "sessions": sorted(self.sessions)})
                self.quit(f"stopped by `ddpboot warm stop` (pid {peer})")
            elif op == "session" and len(fds) == 3:
                self._session(conn, req, fds, peer)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.log(f"a request failed: {exc!r}")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()

    def status(self) -> dict[str, Any]:
        return {"op": "status", "pid": self.me, "started": self.started, "launches": self.launches,
                "sessions": [{"pid": p, **s} for p, s in sorted(self.sessions.items())], "idle": self.idle,
                "idle_since": None if self.sessions else time.time() - (time.monotonic() - self.last),
                "torch": self.torch_version, "python": sys.executable, "preload": self.conf["preload"],
                "files": len(self.files), "socket": self.path}

    def _stale(self, req: dict[str, Any]) -> str | None:
        theirs = req["key"]
        for name in sorted(set(self.key) | set(theirs)):
            if self.key.get(name) != theirs.get(name):
                if name == "env":
                    mine, other = self.key.get("env", {}), theirs.get("env", {})
                    names = sorted(n for n in set(mine) | set(other) if mine.get(n) != other.get(n))
                    return (f"the launch's {', '.join(names)} differ{'s' if len(names) == 1 else ''} from the warm "
                            "process's (read while Python starts and torch is imported)")
                return f"the launch's {name} changed"
        path = _changed(self.files)
        if path is not None:
            return f"{path} changed since it was imported"
        inf = self.resource.RLIM_INFINITY
        for name, (_soft, hard) in req["rlimits"].items():
            mine = self.resource.getrlimit(getattr(self.resource, name))[1]
            if mine != inf and (hard == inf or hard > mine):
                return f"the launch's hard {name} is above the warm process's"
        return None

    def _session(self, conn: socket.socket, req: dict[str, Any], fds: list[int], peer: int) -> None:
        why = self._stale(req)
        if why is not None:
            z.send(conn, {"op": "stale", "why": why})
            self.quit(f"stale: {why}")
        self.idle = float(req.get("idle", self.idle))
        pid = os.fork()
        if pid == 0:
            self._session_child(conn, req, fds)
        self.launches += 1
        self.sessions[pid] = {"launcher": peer, "since": time.time(), "cwd": req["cwd"]}

    def _session_child(self, conn: socket.socket, req: dict[str, Any], fds: list[int]) -> None:
        """The session: this launch's settings taken, then a zygote on the connection until the launcher closes it
        or is gone (zygote.py's Server ends every process below it, then exits). Never returns: nothing of a
        session may run the warm process's own loop."""
        try:
            self._take_launch(conn, req, fds)
            z.Server(conn, z.forked.python_start(list(req.get("ignored", [])))).serve()
        finally:
            os._exit(0)

    def _take_launch(self, conn: socket.socket, req: dict[str, Any], fds: list[int]) -> None:
        try:
            signal.set_wakeup_fd(-1)
            self.sel.close()
            self.listen.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            z.ignore_signals()
            os.chdir(req["cwd"])
            os.umask(int(req["umask"]))
            for name, (soft, hard) in req["rlimits"].items():
                self.resource.setrlimit(getattr(self.resource, name), (soft, hard))
            if os.getpriority(os.PRIO_PROCESS, 0) != req["nice"]:
                os.setpriority(os.PRIO_PROCESS, 0, int(req["nice"]))
            os.sched_setaffinity(0, req["cpus"])
            os.environ.clear()
            os.environ.update(req["env"])
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            conn.settimeout(None)
        except BaseException as exc:
            with contextlib.suppress(Exception):
                z.send(conn, {"op": "stale", "why": f"it cannot take this launch's settings ({exc})"})
            os._exit(1)
        z.send(conn, {"op": "ready", "pid": os.getpid(), "import_s": 0.0, "threads": z.thread_count(),
                    "modules": len(sys.modules), "torch": self.torch_version,
                    "warm": {"pid": self.me, "launches": self.launches + 1, "started": self.started}})


if __name__ == "__ddpboot_zygote__":
    _warm_main(json.loads(sys.argv[1]))
