"""/proc read for real processes: this one, its threads, and a child with a space and a parenthesis in its name, a
variable in its environment and its arguments."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ddpboot.procfs import (
    TASKS,
    cmdline,
    environ_value,
    environ_values,
    listed_children,
    listed_pids,
    owner,
    pids,
    read_stat,
)
from tests.support import wait_for


def test_this_process() -> None:
    me = read_stat(os.getpid())
    assert me is not None and me.ppid == os.getppid() and me.state in ("R", "S")
    assert me.rss > 0 and me.cpu > 0 and me.start > 0
    assert read_stat(0) is None and read_stat(-1) is None


def test_a_name_with_a_parenthesis_and_a_process_that_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import ctypes, sys; ctypes.CDLL(None).prctl(15, b'a) b', 0, 0, 0);"
                              " sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while (st := read_stat(child.pid)) is not None and st.comm != "a) b" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert st is not None and st.comm == "a) b" and st.ppid == os.getpid()
    finally:
        child.communicate(b"")
    assert read_stat(child.pid) is None


def test_this_processs_threads_are_read_as_processes() -> None:
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        tids = pids(TASKS)
        assert threading.get_native_id() in tids and t.native_id in tids
        st = read_stat(t.native_id or 0, TASKS)
        assert st is not None and st.ppid == os.getppid()  # a thread's parent is its process's
    finally:
        stop.set()
        t.join()


def test_a_childs_owner_arguments_and_environment(tmp_path: Path) -> None:
    env = {**os.environ, "DDPBOOT_PROCFS_PROBE": f"{tmp_path}/mark"}
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "an argument"],
                             stdin=subprocess.PIPE, env=env)
    try:
        argv = [sys.executable, "-c", "import sys; sys.stdin.read()", "an argument"]
        wait_for(lambda: cmdline(child.pid) == argv, 30, "the child's exec")
        assert child.pid in pids() and owner(child.pid) == os.getuid()
        assert environ_value(child.pid, "DDPBOOT_PROCFS_PROBE") == f"{tmp_path}/mark"
        assert environ_value(child.pid, "DDPBOOT_PROCFS_PROB") is None  # a name, not a prefix
        assert environ_values("DDPBOOT_PROCFS_PROBE", os.getuid()) == {child.pid: f"{tmp_path}/mark"}
        assert environ_values("DDPBOOT_PROCFS_PROBE", os.getuid() + 1) == {}
    finally:
        child.communicate(b"")
    assert owner(child.pid) is None and cmdline(child.pid) is None
    assert environ_value(child.pid, "DDPBOOT_PROCFS_PROBE") is None


def test_a_table_that_cannot_be_listed_is_scanned_as_empty(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        pids(tmp_path / "gone")
    assert listed_pids(tmp_path / "gone") == []
    (tmp_path / "12").mkdir()
    (tmp_path / "self").mkdir()
    assert listed_pids(tmp_path) == [12] == pids(tmp_path)


def test_the_children_the_kernel_lists_a_zombie_and_a_threads_child_included(tmp_path: Path) -> None:
    started: list[subprocess.Popen[bytes]] = []
    t = threading.Thread(target=lambda: started.append(subprocess.Popen(["sleep", "60"])))  # a child of a thread
    t.start()
    t.join()
    zombie = subprocess.Popen(["true"])
    try:
        wait_for(lambda: (st := read_stat(zombie.pid)) is not None and st.state == "Z", 30, "the child's exit")
        mine = listed_children(os.getpid())
        scanned = {pid for pid in pids() if (st := read_stat(pid)) is not None and st.ppid == os.getpid()}
        assert mine is not None and {started[0].pid, zombie.pid} <= mine and mine == scanned
        assert listed_children(started[0].pid) == set()
        assert listed_children(2**22 + 1) is None  # no such process
        assert listed_children(os.getpid(), tmp_path) is None  # a /proc without the lists: the caller scans
    finally:
        started[0].kill()
        started[0].wait()
        zombie.wait()


def test_peak_memory_cgroups_and_the_cpu_time_limit_of_a_child() -> None:
    import resource

    from ddpboot.procfs import cgroups, cpu_limit, peak_rss

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (50, 70))

    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(64 << 20); sys.stdin.read()"],
                             stdin=subprocess.PIPE, preexec_fn=limit)
    try:
        assert wait_for(lambda: (peak_rss(child.pid) or 0) > 64 << 20, 30, "the child's 64 MiB")
        assert cpu_limit(child.pid) == (50.0, 70.0)
        assert cgroups(child.pid) == cgroups(os.getpid()) and cgroups(child.pid)
    finally:
        child.stdin.close()  # type: ignore[union-attr]
        child.wait()
    assert peak_rss(child.pid) is None and cgroups(child.pid) is None and cpu_limit(child.pid) is None
    assert cpu_limit(os.getpid()) is not None
