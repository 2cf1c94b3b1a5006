"""The guardian: a small process forked from the launcher before any worker. It serves the store and makes sure
that nothing outlives the launcher.

Why a separate process: if the launcher is killed with SIGKILL (OOM killer, `kill -9`, a scheduler), nothing in it
runs any more. Its workers die with it through PR_SET_PDEATHSIG, but their children (data-loader workers, a shell's
subprocesses) would live on holding GPUs. The guardian holds one end of a socketpair whose other end only the
launcher has; end-of-file on it means the launcher is gone, and the guardian then SIGKILLs every worker process group
it was told about and every process of this user that still carries the job's mark (a path in its run directory,
see leftovers.py: a rank's daemon that left its group), removes the job's temporary directory and exits. It also
holds, by inheritance, the GPU locks the launcher took, so they are released only after the workers are dead.

It is forked (not exec'd): the launcher has not imported torch and runs no thread, so the fork is cheap (no
interpreter start-up, no imports) and safe. It ignores the signals a terminal or a scheduler sends to the launcher's
process group; its life is tied to the socketpair.

Control messages, one per line, launcher → guardian: `+PGID:START` (a worker group exists; START, its leader's start
time, tells the group from a later process given the same number: procstat.group_still_ours), `-PGID` (it is gone:
never signal that number again, the pid may be reused), `reset` (empty the store for the next attempt; answered `ok`),
`joined` (whether any rank has joined the rendezvous since the start; answered `yes`, `no`, or `unknown` for torch's
own store), `quit` (the launcher is done and has stopped every group itself).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import shutil
import signal
import socket
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpboot.contract import HELPER_IGNORED_SIGNALS
from ddpboot.launch.procs import leftovers
from ddpboot.launch.procs.groups import NotOurGroup, signal_group
from ddpboot.launch.procs.procstat import group_still_ours
from ddpboot.launch.spec import StoreBackend
from ddpboot.tcpstore.address import listening_sockets
from ddpboot.tcpstore.allow import AllowList
from ddpboot.tcpstore.server import StoreServer

PR_SET_NAME = 15


class GuardianError(RuntimeError):
    """The guardian did not answer (it died, or the store could not start)."""


class Guardian:
    """The launcher's handle on its guardian process."""

    def __init__(self, pid: int, ctl: socket.socket) -> None:
        self.pid = pid
        self.ctl = ctl

    def _send(self, line: str) -> None:
        try:
            self.ctl.sendall(line.encode() + b"\n")
        except OSError as exc:
            raise GuardianError(f"the guardian process (pid {self.pid}) is gone: {exc}") from None

    def add(self, pgid: int, start: int | None) -> None:
        self._send(f"+{pgid}:{'' if start is None else start}")

    def remove(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def _ask(self, line: str, what: str, timeout: float) -> bytes:
        self._send(line)
        self.ctl.settimeout(timeout)
        try:
            return self.ctl.recv(16).strip()
        except OSError as exc:
            raise GuardianError(f"the guardian (pid {self.pid}) did not {what}: {exc}") from None
        finally:
            self.ctl.settimeout(None)

    def reset(self, timeout: float = 120.0) -> None:
        """Empty the store before the next attempt starts (waits for the answer, so no new key is lost)."""
        answer = self._ask("reset", "reset the store", timeout)
        if answer != b"ok":
            raise GuardianError(f"the guardian (pid {self.pid}) did not reset the store (answer {answer!r})")

    def joined(self, timeout: float = 10.0) -> bool | None:
        """Whether any rank joined the rendezvous since the start; None when the store cannot tell (torch's own)."""
        return {b"yes": True, b"no": False}.get(self._ask("joined", "answer", timeout))

    def quit(self) -> None:
        with contextlib.suppress(GuardianError):
            self._send("quit")
        self.ctl.close()


def start_guardian(
    listener: socket.socket, backend: StoreBackend, tempdir: Path | None, allowed_hosts: AllowList | None = None,
    run_dir: Path | None = None,
) -> Guardian:
    """Fork the guardian; it serves the store on `listener` (which the launcher may then close), to connections
    from `allowed_hosts` only when given (ddpboot's store only: the caller refuses it with torch's). `tempdir` is
    removed when the launcher is gone; `run_dir` marks the job's processes (default: `tempdir`)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; observed through the store and the orphan tests
        code = 1
        try:
            mine.close()
            code = _main(theirs, listener, StoreChoice(backend, allowed_hosts), tempdir, run_dir or tempdir)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    theirs.close()
    return Guardian(pid, mine)


@dataclass(frozen=True)
class StoreChoice:
    """Which server the guardian runs, and for ddpboot's the addresses it serves (None: every address)."""

    backend: StoreBackend
    allowed_hosts: AllowList | None = None


class _TorchStore:
    """`--store torch`: torch's own TCPStore server on the launcher's socket, imported here, not in the launcher."""

    def __init__(self, listener: socket.socket) -> None:
        if len(listening_sockets(listener)) > 1:  # torch's server would leave the group's other queues unserved
            raise ValueError("torch's store serves one listening socket, not a SO_REUSEPORT group")
        self.listener = listener
        self.store: Any = None
        self.start()

    def start(self) -> None:
        from datetime import timedelta

        import torch.distributed as dist

        host, port = self.listener.getsockname()[:2]
        self.store = dist.TCPStore(  # type: ignore[attr-defined]
            host, port, is_master=True, master_listen_fd=os.dup(self.listener.fileno()),
            wait_for_workers=False, timeout=timedelta(minutes=30),
        )

    def reset(self) -> None:
        self.store = None  # stops that server; the listening socket itself stays (we gave it a duplicate)
        self.start()


class _Stores:
    """The store the guardian serves: ddpboot's Python server on the guardian's selector, or torch's own."""

    def __init__(self, listener: socket.socket, choice: StoreChoice, sel: selectors.BaseSelector) -> None:
        self.python: StoreServer | None = None
        self.torch: _TorchStore | None = None
        if choice.backend == StoreBackend.PYTHON:
            self.python = StoreServer(listener, allowed_hosts=choice.allowed_hosts)
            self.python.register(sel)
        else:
            self.torch = _TorchStore(listener)

    def reset(self) -> None:
        if self.python is not None:
            self.python.reset()
        if self.torch is not None:
            self.torch.reset()

    def close(self) -> None:
        if self.python is not None:
            self.python.close()

    def timeout(self) -> float | None:
        """Seconds until ddpboot's server has work though nothing is ready (StoreServer.timeout)."""
        return self.python.timeout() if self.python is not None else None

    def idle(self) -> None:
        """The timeout passed with nothing ready: ddpboot's server does what it was for."""
        if self.python is not None:
            self.python.handle()

    def joined(self) -> bytes:
        if self.python is None:
            return b"unknown"
        return b"yes" if self.python.joined else b"no"


class _Control:
    """The launcher's control messages (see the module docstring); `done` once the guardian must exit."""

    def __init__(self, ctl: socket.socket, stores: _Stores, tempdir: Path | None, run_dir: Path | None) -> None:
        self.ctl = ctl
        self.stores = stores
        self.tempdir = tempdir
        self.run_dir = run_dir
        self.groups: dict[int, int | None] = {}  # pgid → its leader's start time
        self.pending = b""
        self.done = False

    def read(self) -> None:
        try:
            data = self.ctl.recv(4096)
        except OSError:
            data = b""
        if not data:
            self.launcher_gone()
            return
        self.pending += data
        while b"\n" in self.pending and not self.done:
            line, self.pending = self.pending.split(b"\n", 1)
            self.command(line.decode())

    def launcher_gone(self) -> None:
        """Nothing of the job may outlive the launcher."""
        for pgid, start in self.groups.items():
            if group_still_ours(pgid, start):
                with contextlib.suppress(OSError, NotOurGroup):
                    signal_group(pgid, signal.SIGKILL)
        if self.run_dir is not None:
            _kill_marked(self.run_dir)
        if self.tempdir is not None:
            shutil.rmtree(self.tempdir, ignore_errors=True)
        self.done = True

    def command(self, cmd: str) -> None:
        if cmd.startswith("+"):
            pgid, _, start = cmd[1:].partition(":")
            self.groups[int(pgid)] = int(start) if start else None
        elif cmd.startswith("-"):
            self.groups.pop(int(cmd[1:]), None)
        elif cmd == "reset":
            self.stores.reset()
            self.ctl.sendall(b"ok\n")
        elif cmd == "joined":
            self.ctl.sendall(self.stores.joined() + b"\n")
        elif cmd == "quit":
            self.stores.close()
            self.done = True


def _kill_marked(run_dir: Path, rounds: int = 5) -> None:
    """SIGKILL every process of ours that carries the job's mark, again while new ones appear (one may have forked
    between the table's reading and the signal)."""
    for _ in range(rounds):
        table = leftovers.snapshot()
        found = [table[pid] for pid in leftovers.marked(table, run_dir, os.getuid()) if pid != os.getpid()]
        if not found:
            return
        leftovers.end(found, 0.0, first=signal.SIGKILL)


def _main(
    ctl: socket.socket, listener: socket.socket, choice: StoreChoice, tempdir: Path | None, run_dir: Path | None
) -> int:
    for sig in HELPER_IGNORED_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    with contextlib.suppress(Exception):
        ctypes.CDLL(None).prctl(PR_SET_NAME, b"ddpboot-guard", 0, 0, 0)
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ, None)
    stores = _Stores(listener, choice, sel)
    control = _Control(ctl, stores, tempdir, run_dir)
    while not control.done:
        ready = sel.select(stores.timeout())
        if not ready:
            stores.idle()
        for key, events in ready:
            if key.data is not None:
                key.data.handle(key, events)
            else:
                control.read()
            if control.done:
                break
    return 0
