"""The flight recorder dumps this torch writes (gloo records its collectives as NCCL does), pickle and JSON, read
back by ddpboot.launch.observe.stacks.flight.py; the dumps of torch's format written by hand are read in
tests/unit/launch/observe/stacks/test_flight.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddpboot.launch.observe.stacks.flight import PREFIX, read_dir

REAL = """
import os, sys, datetime, torch, torch.distributed as dist
from torch._C._distributed_c10d import _dump_fr_trace, _dump_fr_trace_json
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
t = torch.ones(3)
dist.all_reduce(t); dist.broadcast(t, 0)
side = dist.new_group([0], group_desc="side")
dist.all_reduce(t, group=side)
open(sys.argv[1] + "0", "wb").write(_dump_fr_trace())
open(sys.argv[1] + "1", "wb").write(_dump_fr_trace_json())
"""


def test_torch_s_own_dumps_are_read(tmp_path: Path) -> None:
    """The dumps this torch writes (gloo records its collectives as NCCL does), pickle and JSON."""
    pytest.importorskip("torch")
    env = {**os.environ, "TORCH_FR_BUFFER_SIZE": "100"}
    job = tmp_path / "job.py"
    job.write_text(REAL)
    subprocess.run([sys.executable, str(job), str(tmp_path / PREFIX)], env=env, check=True, timeout=120,
                   capture_output=True)
    flight = read_dir(tmp_path)
    assert flight is not None and flight.problems == ()
    for rank in (0, 1):
        groups = flight.ranks[rank].groups
        assert [(c.seq, c.op, c.state) for c in groups["0"].calls] == [(1, "all_reduce", "returned"),
                                                                       (2, "broadcast", "returned")]
        assert groups["0"].label() == "process group 0 (default_pg)"
        side = next(g for name, g in groups.items() if name != "0")
        assert side.desc == "side" and [c.op for c in side.calls] == ["all_reduce"]
    assert [c.at for c in flight.ranks[0].groups["0"].calls] == ["job.py:6", "job.py:6"]  # the pickle's stacks
