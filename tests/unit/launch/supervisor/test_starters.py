"""Exec vs fast start: the supervisor asks a Starter, and only the Starter knows which one it is."""

from __future__ import annotations

import contextlib
import os
import selectors
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ddpboot.launch.faststart import FastStartError, FastStartProcess
from ddpboot.launch.logs import Console, RankStream
from ddpboot.launch.spec import Std, Target
from ddpboot.launch.supervisor.starters import ExecStarter, FastStartStarter, choose_starter
from ddpboot.launch.supervisor.workers import Worker
from ddpboot.selection.planner import RankSlot

TARGET = Target("script", "train.py", ("--lr", "1"))


class FakeZygote(FastStartProcess):
    """A zygote that answers from a script: what it was asked to fork, the exits it reports."""

    def __init__(self, sock: socket.socket, ready: bool = True) -> None:
        super().__init__(pid=999_999, sock=sock, path0="")
        self.ready = ready
        self.forked: list[tuple[Any, ...]] = []
        self.reports: list[tuple[int, int]] = []

    def wait_ready(self) -> dict[str, Any]:
        if not self.ready:
            raise FastStartError("it could not import torch")
        return {"pid": self.pid, "torch": None, "import_s": 0.0, "modules": 1, "threads": 1}

    def fork_rank(self, target: Target, local_rank: int, env: Any, stdout: int, stderr: int,
                  cpus: Any = (), mem_nodes: Any = ()) -> int:
        self.forked.append((target, local_rank, dict(env), stdout, stderr, tuple(cpus), tuple(mem_nodes)))
        return 4321

    def poll(self) -> list[tuple[int, int]]:
        out, self.reports = self.reports, []
        return out


@pytest.fixture
def sock() -> Iterator[socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    yield a
    a.close()
    b.close()


class Said:
    """A console whose messages are kept in a pipe (small ones: it never fills)."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        self.console = Console(self.w, self.w)

    def text(self) -> str:
        os.close(self.w)
        with os.fdopen(self.r, "rb") as f:
            return f.read().decode()


@pytest.fixture
def said() -> Iterator[Said]:
    s = Said()
    yield s
    for fd in (s.r, s.w):
        with contextlib.suppress(OSError):
            os.close(fd)


def worker(local_rank: int = 1, cpus: tuple[int, ...] = (2, 3)) -> Worker:
    slot = RankSlot(rank=5, local_rank=local_rank, gpus=(), cuda_visible_devices="", device="cpu", cpus=cpus)
    stream = RankStream(5, Std.OUT, None, None)
    return Worker(slot, ["/bin/true"], {"RANK": "5"}, Path("rank5.error.json"), stream, stream)


def test_no_zygote_means_exec(sock: socket.socket, said: Said) -> None:
    starter = choose_starter(None, TARGET, selectors.DefaultSelector(), said.console)
    assert isinstance(starter, ExecStarter)
    assert starter.exits() == [] and not starter.has_exits() and not starter.child_exited(1, 0)


def test_a_zygote_that_cannot_start_falls_back_to_exec(sock: socket.socket,
                                                       said: Said) -> None:
    sel = selectors.DefaultSelector()
    starter = choose_starter(FakeZygote(sock, ready=False), TARGET, sel, said.console)
    assert isinstance(starter, ExecStarter)
    assert sel.get_map() == {}  # nothing to watch
    assert said.text() == ("ddpboot: fast start unavailable: it could not import torch; starting every rank with "
                           "exec instead\n")


def test_the_zygote_forks_the_rank_with_its_environment_and_cores(sock: socket.socket,
                                                                  said: Said) -> None:
    sel = selectors.DefaultSelector()
    zygote = FakeZygote(sock)
    starter = choose_starter(zygote, TARGET, sel, said.console)
    assert isinstance(starter, FastStartStarter)
    assert sel.get_key(sock).data == "zygote"  # the loop wakes on its reports
    assert starter.start(worker(), 11, 12) == 4321
    assert zygote.forked == [(TARGET, 1, {"RANK": "5"}, 11, 12, (2, 3), ())]


def test_the_zygotes_reports_are_the_ranks_exits(sock: socket.socket, said: Said) -> None:
    sel = selectors.DefaultSelector()
    zygote = FakeZygote(sock)
    starter = FastStartStarter(zygote, TARGET, sel, said.console)
    zygote.exits.append((4321, 256))
    assert starter.has_exits()
    zygote.reports = [(4321, 256)]
    assert starter.exits() == [(4321, 256)]
    assert not starter.child_exited(12345, 0)  # some other child: not the zygote
    assert starter.child_exited(zygote.pid, 9)  # the zygote died (SIGKILL)
    assert zygote.gone and "the fast-start process (pid 999999) died: killed by SIGKILL" in said.text()
    assert starter.exits() == [] and sel.get_map() == {}  # once gone, its socket is no longer watched


def test_exec_starts_the_workers_own_command(tmp_path: Path) -> None:
    out = tmp_path / "out"
    w = worker(cpus=())
    fd = os.open(out, os.O_WRONLY | os.O_CREAT)
    try:
        pid = ExecStarter(Target("binary", "/bin/sh", ("-c", "echo started $RANK")), "").start(w, fd, fd)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert status == 0 and out.read_text() == "started 5\n"
