"""A rank that leaves a daemon behind: fork(), setsid(), fork() (the classic double fork), the grandchild's output
on /dev/null and the rank's environment kept; the grandchild writes `PID START` (its start time, /proc/PID/stat
field 22: a pid reused later is not the daemon) to OUT/daemon<RANK>.pid and sleeps; the rank's own pid is in
OUT/rank<RANK>.pid.
With `--stay` the rank itself then waits (for a test that kills the launcher); otherwise it exits 0 at once.
With `--clear-env` the daemon drops its environment before sleeping (what ddpboot cannot mark).
With `--no-exec` the daemon sleeps in the rank's own interpreter instead of exec'ing one: a forked rank's (fast
start, warm) then shows the fast-start process's environment in /proc, not the rank's: it carries no mark.
With `--ignore-term` the daemon ignores SIGTERM (it ends only with SIGKILL); with `--catch-term` it writes
OUT/term<RANK> on SIGTERM and goes on (without exec)."""

import os
import signal
import sys
import time

out = os.environ["LAUNCH_TEST_OUT"]
rank = os.environ["RANK"]
with open(f"{out}/rank{rank}.pid", "w") as f:
    f.write(str(os.getpid()))
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if "--ignore-term" in sys.argv:  # before it is known to exist, and across exec
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open("/proc/self/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
        tmp = f"{out}/daemon{rank}.pid.tmp"
        with open(tmp, "w") as f:
            f.write(f"{os.getpid()} {start}")
        os.rename(tmp, f"{out}/daemon{rank}.pid")
        if "--catch-term" in sys.argv:  # SIGTERM noted in OUT/term<RANK>, and the daemon goes on
            signal.signal(signal.SIGTERM, lambda *_: open(f"{out}/term{rank}", "w").close())
        if "--no-exec" in sys.argv or "--catch-term" in sys.argv:
            for _ in range(300):
                time.sleep(1)
            os._exit(0)
        env = {} if "--clear-env" in sys.argv else dict(os.environ)
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", "leftover-daemon"], env)
    os._exit(0)
os.wait()
if "--stay" in sys.argv:
    while True:
        time.sleep(60)
