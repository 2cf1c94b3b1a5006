"""A torchrun-style elastic worker: small all_reduce steps until it has run ELASTIC_STEPS of them in a world of
ELASTIC_TARGET_WORLD ranks; in a smaller world it keeps stepping until its launcher stops it (or ELASTIC_DEADLINE
seconds pass: exit 3, so that a broken test fails instead of hanging).

ELASTIC_TARGET_WORLD and ELASTIC_STEPS may differ per attempt (TORCHELASTIC_RESTART_COUNT): `4,2` means 4 in
attempt 0 and 2 from then on. Files in ELASTIC_OUT: `running-r<RESTART>-w<WORLD>-rank<RANK>.json` after its first
step in a world, and `final-rank<RANK>.json` when done. ELASTIC_FAIL=RESTART:RANK makes that rank crash (exit 7, no
teardown) right after init_process_group in that attempt.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
        "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "MASTER_ADDR",
        "MASTER_PORT", "DDPBOOT_LOCAL_RANK")


def write(path: Path, data: dict[str, object]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    tmp.rename(path)  # readers never see a half-written file


def per_restart(name: str, default: str, restart: int) -> str:
    """`4` for every attempt, or `4,2`: 4 in attempt 0, 2 from attempt 1 on."""
    values = os.environ.get(name, default).split(",")
    return values[min(restart, len(values) - 1)]


def main() -> int:
    out = Path(os.environ["ELASTIC_OUT"])
    restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
    target = int(per_restart("ELASTIC_TARGET_WORLD", "4", int(restart)))
    steps = int(per_restart("ELASTIC_STEPS", "5", int(restart)))
    deadline = time.monotonic() + float(os.environ.get("ELASTIC_DEADLINE", "60"))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if os.environ.get("ELASTIC_FAIL") == f"{restart}:{rank}":
        sys.stdout.flush()
        os._exit(7)
    env = {k: os.environ.get(k) for k in KEYS}
    expected = world * (world + 1) / 2
    done = 0
    while True:
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t)
        if t.item() != expected:
            print(f"rank {rank}: all_reduce gave {t.item()}, expected {expected}", file=sys.stderr)
            return 5
        done += 1
        if done == 1:
            write(out / f"running-r{restart}-w{world}-rank{rank}.json", {"rank": rank, "world": world, "env": env})
        if world == target and done >= steps:
            break
        if time.monotonic() > deadline:
            print(f"rank {rank}: {done} steps in a world of {world} and not done by the deadline", file=sys.stderr)
            return 3
        if world != target or steps > 1000:
            time.sleep(0.05)  # a world that waits to be stopped: keep stepping, slowly
    write(out / f"final-rank{rank}.json",
          {"rank": rank, "world": world, "steps": done, "all_reduce": t.item(), "env": env,
           "parent": Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace")})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
