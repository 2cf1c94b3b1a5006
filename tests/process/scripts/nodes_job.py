"""A rank of a multi-node test job (gloo, CPU): joins with ddpboot.init(), all-reduces once, writes
NODES_OUT/rank<R>.json (its place and the sum), prints `rank R of W says NODES_SAY` when that is set, then: the
rank named by NODES_FAIL_RANK writes the time into NODES_OUT/failed and exits with NODES_FAIL_CODE at once
(os._exit: a crash); every other rank sleeps NODES_SLEEP seconds (0: none) and exits 0."""

import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import ddpboot

ctx = ddpboot.init()
total = torch.ones(1)
dist.all_reduce(total)
out = Path(os.environ["NODES_OUT"])
report = {"rank": ctx.rank, "world_size": ctx.world_size, "node_rank": ctx.node_rank, "local_rank": ctx.local_rank,
          "local_world_size": ctx.local_world_size, "group_rank": os.environ.get("GROUP_RANK"),
          "group_world_size": os.environ.get("GROUP_WORLD_SIZE"), "host": socket.gethostname(), "sum": total.item(),
          "launcher": ctx.launcher, "pid": os.getpid()}
(out / f"rank{ctx.rank}.json").write_text(json.dumps(report))
if os.environ.get("NODES_SAY"):
    print(f"rank {ctx.rank} of {ctx.world_size} says {os.environ['NODES_SAY']}", flush=True)
if str(ctx.rank) == os.environ.get("NODES_FAIL_RANK"):
    (out / "failed").write_text(repr(time.time()))
    print(f"rank {ctx.rank} fails now", file=sys.stderr, flush=True)
    os._exit(int(os.environ.get("NODES_FAIL_CODE", "3")))
time.sleep(float(os.environ.get("NODES_SLEEP", "0")))
