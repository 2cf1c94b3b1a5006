"""Both launch patterns on all eight of the test cluster's emulated nodes, 2 ranks per node (16 ranks):

- one ddpboot per node: `sbatch -N8 --ntasks-per-node=1`, `srun --ntasks-per-node=1 --ntasks=$SLURM_NNODES ddpboot
  --nproc 2 job.py`;
- one task per rank, no launcher: `sbatch -N8 --ntasks-per-node=2`, `srun python job.py` (16 tasks).

Each rank joins the one gloo group through `ddpboot.init()` and all-reduces 1 + its rank; every rank must report the
same sum, from its own node. The job is tiny (no training) so that 16 ranks on a 2-core machine stay quick.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.slurm.helpers import NODES, slurm

pytestmark = pytest.mark.slurm
BIN = Path(sys.executable).parent
NPROC = 2
WORLD = NPROC * len(NODES)
JOB = """\
import os
import torch
import torch.distributed as dist
import ddpboot

ctx = ddpboot.init()
t = torch.tensor([float(ctx.rank + 1)])
dist.all_reduce(t)
print(f"rank {ctx.rank} of {ctx.world_size} node {ctx.node_rank} on {os.environ['SLURMD_NODENAME']} "
      f"launcher {ctx.launcher} sum {t.item():.0f}", flush=True)
"""
LINE = re.compile(r"^(?:\[rank\d+\]: )?rank (\d+) of (\d+) node (\d+) on (n\d+) launcher (\w+) sum (\d+)$", re.M)


def run_job(tmp_path: Path, tasks_per_node: int, step: str) -> tuple[int, str]:
    (tmp_path / "job.py").write_text(JOB)
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N{len(NODES)} --ntasks-per-node={tasks_per_node} -t 3 -J ddpboot-test -o {tmp_path}/out.txt\n"
        f"export PATH={BIN}:$PATH OMP_NUM_THREADS=1\n"
        f"{step} {tmp_path}/job.py\n"
    )
    out = slurm("sbatch", "--wait", str(script), cwd=tmp_path, timeout=240)
    text = (tmp_path / "out.txt").read_text() if (tmp_path / "out.txt").exists() else ""
    return out.returncode, text + out.stderr


@pytest.mark.parametrize(
    ("pattern", "tasks_per_node", "step"),
    [
        ("ddpboot", 1, f'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" ddpboot --nproc {NPROC}'),
        ("slurm", NPROC, "srun python"),
    ],
)
def test_sixteen_ranks_on_eight_nodes_join_one_group(
    tmp_path: Path, pattern: str, tasks_per_node: int, step: str
) -> None:
    code, out = run_job(tmp_path, tasks_per_node, step)
    assert code == 0, out
    seen = {int(m[0]): m for m in LINE.findall(out)}
    assert sorted(seen) == list(range(WORLD)), out
    for rank, (_, world, node, host, launcher, total) in seen.items():
        assert (int(world), launcher, int(total)) == (WORLD, pattern, WORLD * (WORLD + 1) // 2), out
        assert int(node) == rank // NPROC and host == NODES[rank // NPROC], out  # ranks fill the nodes in order
