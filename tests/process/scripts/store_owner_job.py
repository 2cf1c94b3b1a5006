"""A job for tests/process/test_store_owner.py: every rank joins the process group through the job's store, writes
LAUNCH_TEST_OUT/rank<RANK>.json (its store address, pid and uid), then holds in place until the test creates
STORE_OWNER_GO. Rank 0 then records which of the keys named in STORE_OWNER_KEYS exist in the store (keys the test
tried to write from outside), and the ranks meet in a last barrier before exiting 0."""

import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from ddpboot.tcpstore.client import StoreClient

dist.init_process_group("gloo")
dist.barrier()
out = Path(os.environ["LAUNCH_TEST_OUT"])
rank = dist.get_rank()
report = {
    "rank": rank,
    "pid": os.getpid(),
    "uid": os.getuid(),
    "master_addr": os.environ["MASTER_ADDR"],
    "master_port": int(os.environ["MASTER_PORT"]),
}
(out / f"rank{rank}.json.tmp").write_text(json.dumps(report))
(out / f"rank{rank}.json.tmp").rename(out / f"rank{rank}.json")

go = Path(os.environ["STORE_OWNER_GO"])
deadline = time.monotonic() + 120
while not go.exists():
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.05)

if rank == 0:
    # ddpboot's client reads keys as they were written on the wire (torch's Python TCPStore adds a "/" prefix).
    keys = [k for k in os.environ.get("STORE_OWNER_KEYS", "").split(",") if k]
    with StoreClient(report["master_addr"], report["master_port"]) as store:
        (out / "keys.json").write_text(json.dumps({k: store.check([k]) for k in keys}))
dist.barrier()
dist.destroy_process_group()
