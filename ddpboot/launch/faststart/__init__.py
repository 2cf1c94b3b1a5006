"""Fast start, the launcher's side: start the fast-start process (`FastStartProcess`, running zygote.py), ask it for
one child per rank, learn their exits. The process is called the zygote in the code that runs in it: like Android's
zygote, it imports once and every rank is a fork of it.

The zygote imports torch (and `--preload` modules) once per node while the launcher finishes its own start-up; each
rank is then a fork of it instead of a fresh interpreter that imports torch again. The ranks are the zygote's
children, so their exit statuses come over the control socket; if the zygote itself dies, its ranks die with it
(PR_SET_PDEATHSIG) and, the launcher being their subreaper, are reaped by the launcher as usual.

Never imports torch; the launcher stays single-threaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpboot.errors import DdpbootError
from ddpboot.launch.env import substitute_local_rank
from ddpboot.launch.faststart.zygote import LAUNCHER_GONE, MAX_MSG
from ddpboot.launch.procs.procstat import start_of
from ddpboot.launch.procs.spawn import spawn
from ddpboot.launch.pymain import TargetKind, path0
from ddpboot.launch.spec import Target

ZYGOTE = Path(__file__).with_name("zygote.py")
FORKED = ZYGOTE.with_name("forked.py")  # what the zygote runs in each rank it forks
BOOT = "import runpy, sys; del sys.argv[0]; runpy.run_path(sys.argv[0], run_name='__ddpboot_zygote__')"


class FastStartError(DdpbootError):
    """The zygote could not start or died: the launcher falls back to exec (or fails the attempt)."""


def python_path0(target: Target, cwd: Path) -> str:
    """sys.path[0] as a rank's python sets it (launch/pymain.py): where the zygote imports the preloads from."""
    return path0(target.kind, target.name, str(cwd))


def supports(target: Target) -> bool:
    return TargetKind(target.kind).is_python


@dataclass(eq=False)
class FastStartProcess:
    pid: int
    sock: socket.socket
    path0: str
    info: dict[str, Any] | None = None
    exits: list[tuple[int, int]] = field(default_factory=list)  # (pid, wait status) not yet taken
    gone: bool = False
    running: set[int] = field(default_factory=set)  # ranks forked and not yet reported as exited
    starts: dict[int, int | None] = field(default_factory=dict)  # each rank's start time (procstat), by pid
    _next: int = 0

    @classmethod
    def start(cls, python: str, target: Target, cwd: Path, env: Mapping[str, str],
              preload: Sequence[str] = (), signals: Sequence[int] = ()) -> FastStartProcess:
        """Start the zygote as an exec'd rank starts (`signals`, the forwarded ones, at their defaults: its ranks
        start with the dispositions it started with). It outlives the launcher only to end its ranks and what they
        left (zygote.py): the launcher's death reaches it as LAUNCHER_GONE, not SIGKILL."""
        path0 = python_path0(target, cwd)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = spawn([python, "-u", "-c", BOOT, str(ZYGOTE), path0, ",".join(preload)], env, 1, 2,
                        pass_fd=child.fileno(), reset_signals=signals, death_signal=LAUNCHER_GONE)
        except BaseException:
            parent.close()
            raise
        finally:
            child.close()
        return cls(pid, parent, path0)

    # --- messages ------------------------------------------------------------------------------------

    def _recv(self, block: bool) -> dict[str, Any] | None:
        """One message; None when the zygote has gone (EOF) or, non-blocking, when nothing is waiting."""
        try:
            data = self.sock.recv(MAX_MSG, 0 if block else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return None
        except (ConnectionResetError, OSError):
            data = b""
        if not data:
            self.gone = True
            return None
        msg: dict[str, Any] = json.loads(data)
        return msg

    def _take(self, msg: dict[str, Any]) -> None:
        if msg.get("op") == "exit":
            self.running.discard(int(msg["pid"]))
            self.starts.pop(int(msg["pid"]), None)
            self.exits.append((int(msg["pid"]), int(msg["status"])))

    def wait_ready(self) -> dict[str, Any]:
        """Block until the zygote has imported torch and the preloads; raises FastStartError if it could not."""
        while self.info is None:
            msg = self._recv(block=True)
            if msg is None:
                raise FastStartError("the fast-start process exited before it was ready (its messages are above)")
            if msg.get("op") == "error":
                raise FastStartError(f"the fast-start process could not import what it preloads: {msg['error']}")
            if msg.get("op") == "ready":
                self.info = msg
        return self.info

    def fork_rank(self, target: Target, local_rank: int, env: Mapping[str, str], stdout: int, stderr: int,
                  cpus: Sequence[int] = (), mem_nodes: Sequence[int] = ()) -> int:
        """A new rank process running `target` as __main__; returns its pid (its process group id too). `cpus` and
        `mem_nodes` bind it as spawn() binds an exec'd rank."""
        self.wait_ready()
        self._next += 1
        req = {"op": "spawn", "id": self._next, "kind": target.kind, "name": target.name,
               "args": substitute_local_rank(target.args, local_rank), "env": dict(env), "cpus": list(cpus),
               "mems": list(mem_nodes)}
        try:
            socket.send_fds(self.sock, [json.dumps(req).encode()], [stdout, stderr])
        except OSError as exc:
            self.gone = True
            raise FastStartError(f"the fast-start process is gone ({exc})") from None
        while True:
            msg = self._recv(block=True)
            if msg is None:
                raise FastStartError("the fast-start process exited while starting a rank")
            if msg.get("op") == "started" and msg.get("id") == self._next:
                pid = int(msg["pid"])
                self.running.add(pid)
                self.starts[pid] = start_of(pid)
                return pid
            self._take(msg)

    def poll(self) -> list[tuple[int, int]]:
        """Exits reported since the last call (non-blocking)."""
        while not self.gone:
            msg = self._recv(block=False)
            if msg is None:
                break
            self._take(msg)
        out, self.exits = self.exits, []
        return out

    def lost(self) -> list[tuple[int, int]]:
        """Ranks whose exits will never be reported, once the process has gone: none here (they die with the zygote,
        and the launcher, their subreaper, reaps them); a warm session's are not the launcher's (warm.py)."""
        return []

    def close(self) -> None:
        """Let the zygote go (it exits when the socket closes) and reap it."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
