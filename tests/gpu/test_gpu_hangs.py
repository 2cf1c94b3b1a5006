"""The destroy-in-finally NCCL hang on 2 GPUs, diagnosed by ddpboot: the job ends at --stall-timeout with every
rank's stack in the run directory and a summary line per rank naming a torch.distributed call
(scripts/gpu-hang-diag.sh is the longer version, with the on-demand dump and the faulthandler backend)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ddpboot.contract import STACKS_END_LINE
from tests.support import REPO, clean_env, ddpboot_exe

pytestmark = pytest.mark.gpu

JOB = """
import sys, torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
rank, t = dist.get_rank(), torch.ones(1, device="cuda")
try:
    dist.all_reduce(t); torch.cuda.synchronize()
    if rank == 1:
        sys.exit(3)
    dist.all_reduce(t); torch.cuda.synchronize()  # rank 0 waits for rank 1, which is leaving
finally:
    dist.destroy_process_group()
"""


def test_the_destroy_in_finally_hang_ends_at_the_stall_timeout_with_every_stack(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi on this machine: GPU tests need NVIDIA GPUs and their driver")
    gpus = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60).stdout.count("GPU ")
    if gpus < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {gpus}")
    job = tmp_path / "hang.py"
    job.write_text(JOB)
    logs = tmp_path / "logs"
    env = clean_env(NCCL_NVLS_ENABLE="0")
    out = subprocess.run([*ddpboot_exe(), "--nproc", "2", "--log-dir", str(logs), "--stall-timeout", "20",
                          "--shutdown-timeout", "5", str(job)], env=env, capture_output=True, text=True,
                         timeout=400, cwd=REPO)
    assert "no progress for 20 s" in out.stderr, out.stderr[-4000:]
    summary = [line for line in out.stderr.splitlines() if line.startswith("ddpboot:   rank ")]
    assert len(summary) == 2, out.stderr[-4000:]
    assert any(w in summary[0] for w in ("all_reduce", "destroy_process_group", "wait")), summary
    (text,) = logs.glob("*/stacks-*.txt")
    assert text.read_text().rstrip().splitlines()[-1].startswith(STACKS_END_LINE)
    assert "--- rank 0 " in text.read_text() and "--- rank 1 " in text.read_text()
