"""A process named by its pid and start time: signalled only while both match (a real child process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ddpboot.launch.procs.procstat import (
    group_still_ours,
    is_process,
    open_process,
    signal_if_same,
    start_of,
)


def test_a_pid_and_its_start_time_name_one_process() -> None:
    """A record whose start time is not the process's now (its pid reused) is never that process: not signalled."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        start = start_of(child.pid)
        assert start is not None and is_process(child.pid, start)
        assert not is_process(child.pid, start + 1) and not is_process(child.pid, None)
        assert open_process(child.pid, start + 1) is None
        fd = open_process(child.pid, start)
        assert fd is not None and fd >= 0
        os.close(fd)
        assert not signal_if_same(child.pid, start + 1, signal.SIGTERM) and child.poll() is None
        assert group_still_ours(child.pid, start) and not group_still_ours(child.pid, start + 1)
        assert signal_if_same(child.pid, start, signal.SIGTERM)
        assert child.wait(timeout=30) == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert not is_process(child.pid, start) and not signal_if_same(child.pid, start, signal.SIGTERM)
    assert group_still_ours(child.pid, start)  # gone: whatever group still holds the number is the one it led
