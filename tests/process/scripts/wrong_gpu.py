"""A rank that shows up, in the simulated inventory's process lists, on a GPU that is not its own (what a stray
`.cuda(1)` does), and puts the test's own process (a stranger to the job) on its own GPU; then waits for OUT/release.

argv: STRANGER_PID. The inventory file is DDPBOOT_FAKE_GPUS (rewritten beside and renamed: the launcher rereads it).
"""

import json
import os
import sys
import time
from pathlib import Path

from ddpboot.selection.inventory import fake_uuid

path = Path(os.environ["DDPBOOT_FAKE_GPUS"])
mine = set(os.environ["DDPBOOT_GPU_UUIDS"].split(","))
gpus = json.loads(path.read_text())
for gpu in gpus:
    if gpu.get("uuid", fake_uuid(gpu["index"])) in mine:
        gpu["processes"] = [{"pid": int(sys.argv[1]), "used_memory": 300 << 20}]
    else:
        gpu["processes"] = [{"pid": os.getpid(), "used_memory": 500 << 20}]
tmp = path.with_suffix(".tmp")
tmp.write_text(json.dumps(gpus))
tmp.rename(path)
release = Path(os.environ["LAUNCH_TEST_OUT"]) / "release"
deadline = time.monotonic() + 60
while not release.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
