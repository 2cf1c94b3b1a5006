"""A rank that leaves a daemon behind: fork(), setsid(), fork() (the classic double fork), the grandchild's output
on /dev/null and the rank's environment kept; the grandchild writes its pid to OUT/daemon<RANK>.pid and sleeps.
With `--stay` the rank itself then waits (for a test that kills the launcher); otherwise it exits 0 at once.
With `--clear-env` the daemon drops its environment before sleeping (what ddpboot cannot mark)."""

import os
import sys
import time

out = os.environ["LAUNCH_TEST_OUT"]
rank = os.environ["RANK"]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        tmp = f"{out}/daemon{rank}.pid.tmp"
        with open(tmp, "w") as f:
            f.write(str(os.getpid()))
        os.rename(tmp, f"{out}/daemon{rank}.pid")
        env = {} if "--clear-env" in sys.argv else dict(os.environ)
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(300)", "leftover-daemon"], env)
    os._exit(0)
os.wait()
if "--stay" in sys.argv:
    while True:
        time.sleep(60)
