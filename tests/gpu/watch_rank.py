"""A rank for the GPU watch test: takes 256 MiB on its own GPU, writes OUT/ready, waits for OUT/release."""

import os
import time
from pathlib import Path

import torch

torch.cuda.set_device(0)
held = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
out = Path(os.environ["WATCH_OUT"])
(out / "ready").write_text(str(os.getpid()))
deadline = time.monotonic() + 120
while not (out / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.05)
