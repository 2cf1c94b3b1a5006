"""A worker for the shared-server tests: records what it was given, then holds its GPUs until told to stop.

argv: DIR TAG. Writes DIR/TAG.RANK.json ({uuids, cpus, omp}); exits when DIR/release.TAG or DIR/release exists
(or after 60 s, so that nothing can outlive a broken test for long).
"""

import json
import os
import sys
import time
from pathlib import Path

out, tag = Path(sys.argv[1]), sys.argv[2]
rank = os.environ["RANK"]
record = {
    "uuids": os.environ.get("DDPBOOT_GPU_UUIDS", ""),
    "cpus": sorted(os.sched_getaffinity(0)),
    "omp": os.environ.get("OMP_NUM_THREADS"),
}
tmp = out / f".{tag}.{rank}.tmp"
tmp.write_text(json.dumps(record))
tmp.rename(out / f"{tag}.{rank}.json")
deadline = time.monotonic() + 60
while not (out / f"release.{tag}").exists() and not (out / "release").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
