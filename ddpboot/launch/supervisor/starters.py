"""How a worker process is started: fork + exec (`ExecStarter`), or forked by the fast-start zygote
(`FastStartStarter`, ddpboot/launch/faststart/). The supervisor talks to a `Starter` and never asks which one it has.

A rank started by exec is the launcher's child: its exit comes through waitpid. A rank forked by the zygote is the
zygote's child: the zygote reaps it and reports its wait status over the control socket, which the loop watches.
"""

from __future__ import annotations

import contextlib
import os
import selectors
from collections.abc import Sequence
from typing import Protocol

from ddpboot.launch.env import exec_command
from ddpboot.launch.faststart import FastStartError, FastStartProcess
from ddpboot.launch.logs import Console
from ddpboot.launch.procs.spawn import spawn
from ddpboot.launch.spec import Target
from ddpboot.launch.supervisor.workers import Worker, describe_status

ZYGOTE_KEY = "zygote"  # the selector's data for the zygote's control socket


class Starter(Protocol):
    def start(self, worker: Worker, stdout: int, stderr: int) -> int:
        """Start the worker with its stdout/stderr on these descriptors; its pid (and process group id)."""
        ...

    def exits(self) -> list[tuple[int, int]]:
        """(pid, wait status) of workers that exited and are not the launcher's children to reap."""
        ...

    def has_exits(self) -> bool:
        """Exits already read and waiting to be taken (the loop must not block)."""
        ...

    def child_exited(self, pid: int, status: int) -> bool:
        """A child that is not a worker was reaped: True when it was this starter's own process."""
        ...

    def close(self) -> None:
        """Stop watching the starter's descriptors."""
        ...


class ExecStarter:
    """fork + exec of each worker's own command line (ddpboot/launch/procs/spawn.py); a Python target's through the
    rank bootstrap (launch/env.py exec_command). Each starts with the forwarded `signals` at their default
    disposition."""

    def __init__(self, target: Target, python: str, signals: Sequence[int] = ()) -> None:
        self.target = target
        self.python = python
        self.signals = tuple(signals)

    def start(self, worker: Worker, stdout: int, stderr: int) -> int:
        argv, env = exec_command(self.target, self.python, worker.slot.local_rank, worker.env)
        return spawn(argv, env, stdout, stderr, cpus=worker.slot.cpus, mem_nodes=worker.slot.mem_nodes,
                     reset_signals=self.signals)

    def exits(self) -> list[tuple[int, int]]:
        return []

    def has_exits(self) -> bool:
        return False

    def child_exited(self, pid: int, status: int) -> bool:
        return False

    def close(self) -> None:
        pass


class FastStartStarter:
    """Ranks forked by the zygote, which has imported torch once for all of them."""

    def __init__(
        self, process: FastStartProcess, target: Target, sel: selectors.BaseSelector, console: Console
    ) -> None:
        self.process = process
        self.target = target
        self.sel = sel
        self.console = console
        sel.register(process.sock, selectors.EVENT_READ, ZYGOTE_KEY)

    def start(self, worker: Worker, stdout: int, stderr: int) -> int:
        return self.process.fork_rank(self.target, worker.slot.local_rank, worker.env, stdout, stderr,
                                     cpus=worker.slot.cpus, mem_nodes=worker.slot.mem_nodes)

    def exits(self) -> list[tuple[int, int]]:
        exits = self.process.poll()
        if self.process.gone:
            lost = self.process.lost()
            if lost:
                self.console.message(f"ddpboot: error: the warm launch's process (pid {self.process.pid}) died; "
                                     "its ranks are killed with it")
            exits += lost
            self.close()
        return exits

    def has_exits(self) -> bool:
        return bool(self.process.exits)

    def child_exited(self, pid: int, status: int) -> bool:
        if pid != self.process.pid:
            return False
        # Its ranks die with it (PR_SET_PDEATHSIG) and come to us, their subreaper, to be reaped.
        self.process.gone = True
        self.console.message(f"ddpboot: error: the fast-start process (pid {pid}) died: "
                             f"{describe_status(status)}; its ranks are killed with it")
        return True

    def close(self) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(self.process.sock)


def choose_starter(
    fast_start: FastStartProcess | None, target: Target, sel: selectors.BaseSelector, console: Console,
    signals: Sequence[int] = (), python: str = "",
) -> Starter:
    """The zygote once it is ready (its imports overlapped the launcher's own start-up and the nodes' check-in);
    exec when there is none or it cannot start, and then the message says why. `signals`: those the launcher
    forwards, which an exec'd rank starts with at their defaults (the zygote was started so, launch/runner.py);
    `python`: the interpreter an exec'd Python rank runs."""
    if fast_start is None:
        return ExecStarter(target, python, signals)
    try:
        info = fast_start.wait_ready()
    except FastStartError as exc:
        console.message(f"ddpboot: fast start unavailable: {exc}; starting every rank with exec instead")
        return ExecStarter(target, python, signals)
    if os.environ.get("DDPBOOT_DEBUG"):
        console.message(f"ddpboot: fast start: zygote pid {info['pid']} imported torch {info['torch']} in "
                        f"{info['import_s']:.2f} s ({info['modules']} modules, {info['threads']} threads)")
    return FastStartStarter(fast_start, target, sel, console)
