"""A rank that leaves in a given way after ddpboot.init(); which of destroy/abort its exit path called is noted.

Usage: exit_path.py OUTDIR MODE [LEAVER]
MODE: clean (falls off the end), exit0 (sys.exit(0)), exit3 (sys.exit(3)), raise (uncaught exception),
builtin_exit (exit(4)), argparse (a bad argument: argparse's exit 2). LEAVER: "all" (every rank leaves that way
after a barrier, the default) or a rank number: that rank leaves that way while the others wait in an all_reduce
it never joins (the others end when the launcher stops them). Writes OUTDIR/rankN.calls (one line per call of
destroy_process_group / _abort_process_group, in order) and OUTDIR/rankN.left (time.time() as it begins to leave).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

import ddpboot

out, mode = Path(sys.argv[1]), sys.argv[2]
leaver = sys.argv[3] if len(sys.argv) > 3 else "all"
rank = int(os.environ["RANK"])
calls = out / f"rank{rank}.calls"


def noting(name: str, fn):  # type: ignore[no-untyped-def]
    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        with calls.open("a") as f:
            f.write(name + "\n")
        return fn(*args, **kwargs)

    return wrapper


dist.destroy_process_group = noting("destroy", dist.destroy_process_group)
c10d._abort_process_group = noting("abort", c10d._abort_process_group)

ctx = ddpboot.init()
t = torch.ones(1, device=ctx.device)
dist.all_reduce(t)
if leaver == "all":
    dist.barrier()
elif rank != int(leaver):
    dist.all_reduce(t)  # waits for the leaver, which never comes
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    sys.exit(0)

(out / f"rank{rank}.left").write_text(f"{time.time():.6f}\n")
if mode == "exit0":
    sys.exit(0)
elif mode == "exit3":
    sys.exit(3)
elif mode == "raise":
    raise RuntimeError("the script failed")
elif mode == "builtin_exit":
    exit(4)
elif mode == "argparse":
    argparse.ArgumentParser(prog="exit_path").parse_args(["--no-such-option"])
