"""/proc/PID/stat, read for a real process (this one, and a child with a space and a parenthesis in its name)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from ddpboot.launch.procs.procstat import read_stat


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
