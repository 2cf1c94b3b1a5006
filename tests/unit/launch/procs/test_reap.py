"""Reaping without waiting, on real children of a process of its own (waitpid(-1) in the test process would take
other tests' children): each exited child once, with its status; a running one left alone."""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r"""
import json, os, subprocess, sys, time
from ddpboot.launch.procs.reap import exited

running = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
quick = [subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"]).pid for code in (3, 4)]
seen, deadline = {}, time.monotonic() + 30
while not all(pid in seen for pid in quick) and time.monotonic() < deadline:
    seen.update(exited())
    time.sleep(0.01)
left_now = list(exited())
running.stdin.close()
while running.pid not in seen and time.monotonic() < deadline:
    seen.update(exited())
    time.sleep(0.01)
print(json.dumps({"codes": [os.waitstatus_to_exitcode(seen.get(pid, -1)) if pid in seen else None for pid in quick],
                  "left_now": left_now, "running": os.waitstatus_to_exitcode(seen.get(running.pid, 1 << 8)),
                  "after": list(exited())}))
"""


def test_each_exited_child_is_reaped_once_and_a_running_one_is_left() -> None:
    res = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["codes"] == [3, 4]  # both reaped, each with its own exit code
    assert out["left_now"] == []  # the running child was not reaped, and nothing else was left
    assert out["running"] == 0  # reaped once it ended (stdin closed)
    assert out["after"] == []  # no child at all: the scan ends
