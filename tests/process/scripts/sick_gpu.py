"""A rank whose GPU, in the simulated inventory, turns sick while it runs: nearly full memory, a thermal slowdown
and Xid 79 (the inventory file is DDPBOOT_FAKE_GPUS, rewritten beside and renamed); then it waits for OUT/release.
(An ECC count that grows needs the launcher's first look to come before it: tested on the decisions alone.)"""

import json
import os
import time
from pathlib import Path

path = Path(os.environ["DDPBOOT_FAKE_GPUS"])
out = Path(os.environ["LAUNCH_TEST_OUT"])
deadline = time.monotonic() + 60
gpus = json.loads(path.read_text())
gpus[0].update(memory_used=gpus[0]["memory_total"] * 97 // 100, slowdowns=["sw_thermal"], xids=[79])
tmp = path.with_suffix(".tmp")
tmp.write_text(json.dumps(gpus))
tmp.rename(path)
while not (out / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
