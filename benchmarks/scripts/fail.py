"""The teardown benchmark's job: rank 1 fails, rank 0 is still running.

    launcher ... scripts/fail.py STAMP_PATH        (the form bench_launch.run_failure starts)

Rank 0 writes STAMP_PATH.ready.<launcher pid> once it is running (and, with BENCH_IGNORE_TERM=1, after setting
SIGTERM to ignored), then sleeps. Rank 1 waits for that file, so that the failure always finds a live sibling, writes
the time to STAMP_PATH and exits with code 3. The benchmark measures from that time to the launcher's exit: with an
obedient sibling that is the launcher's reaction time; with one that ignores SIGTERM it is the shutdown grace the
launcher actually applies before SIGKILL.
"""

from __future__ import annotations

import os
import signal
import sys
import time

stamp = sys.argv[1]
ready = f"{stamp}.ready.{os.getppid()}"  # both ranks are children of the launcher under ddpboot and torchrun
if os.environ["RANK"] == "0":
    if os.environ.get("BENCH_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with open(ready, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)
else:
    deadline = time.monotonic() + 120
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.005)
    with open(stamp, "w") as f:
        f.write(repr(time.time()))
    os._exit(3)
