"""A straggler of an NCCL job named while it runs: rank 1 sleeps on its GPU (torch.cuda._sleep, a kernel that spins
on the GPU's clock) before each all_reduce, so the host threads of both ranks spin alike in their synchronize and
only the collectives' durations (NCCL's flight recorder, DDPBOOT_STRAGGLER_NCCL=1 with --log-dir) tell rank 1 apart;
ranks that sleep alike are never named.

On 2 GPUs: one rank each. On one GPU both ranks share it: the simulated inventory gives the launcher a second GPU,
and each rank sets CUDA_VISIBLE_DEVICES back to the real one and a distinct NCCL_HOSTID before torch starts (NCCL
refuses two ranks of one host on one GPU), so NCCL joins them by its socket transport on loopback."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ddpboot.selection.inventory import load_inventory
from tests.support import REPO, clean_env, ddpboot_exe, finish, gpu_count, stderr_until

pytestmark = pytest.mark.gpu

JOB = """
import os, sys, time
from pathlib import Path
rank = int(os.environ["RANK"])
if os.environ.get("STRAGGLER_TEST_GPU"):  # one GPU for both ranks
    os.environ["CUDA_VISIBLE_DEVICES"] = os.environ["STRAGGLER_TEST_GPU"]
    os.environ["NCCL_HOSTID"] = f"ddpboot-straggler-test-{rank}"
import torch, torch.distributed as dist
torch.cuda.set_device(0)
dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
t, release, deadline = torch.ones(1 << 10, device="cuda"), Path(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline and not release.exists():
    if rank == 1 or sys.argv[1] == "even":
        torch.cuda._sleep(50_000_000)  # tens of ms on the GPU; the host goes on and waits in item()
    dist.all_reduce(t)
    t.sum().item()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
"""


def start(tmp_path: Path, kind: str, seconds: int) -> subprocess.Popen[bytes]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = clean_env(NCCL_NVLS_ENABLE="0", DDPBOOT_STRAGGLER_NCCL="1")
    if gpu_count() < 2:
        real = load_inventory({}).gpus[0].uuid
        (tmp_path / "gpus.json").write_text(json.dumps([{"index": 0, "uuid": real}, {"index": 1}]))
        env.update(DDPBOOT_FAKE_GPUS=str(tmp_path / "gpus.json"), STRAGGLER_TEST_GPU=real, NCCL_SOCKET_IFNAME="lo",
                   NCCL_IB_DISABLE="1", NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1")
    args = ["--nproc", "2", "--gpu-watch", "off", "--log-dir", str(tmp_path / "logs"), "--straggler-window", "10",
            str(script), kind, str(tmp_path / "release"), str(seconds)]
    return subprocess.Popen([*ddpboot_exe(), *args], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def test_a_rank_slow_on_its_gpu_is_named_by_its_collectives_while_the_job_runs(tmp_path: Path) -> None:
    if gpu_count() < 1:
        pytest.skip("needs a GPU")
    proc = start(tmp_path, "slow", 120)
    try:
        lines = stderr_until(proc, lambda got: any("ddpboot: straggler:" in ln for ln in got), 150)
        running = proc.poll() is None
    finally:
        (tmp_path / "release").touch()
    code, _, rest = finish(proc, 120)
    said = [ln for ln in lines + rest.decode(errors="replace").splitlines() if "ddpboot: straggler:" in ln]
    assert code == 0, (lines, rest[-3000:])
    assert running and said, lines[-40:]
    assert said[0].startswith("ddpboot: straggler: rank 1 (GPU 1, node 0) is slower than the others: in "), said
    assert said[0].endswith("NCCL's flight recorder)"), said
    assert len(said) == 1, said


def test_ranks_slow_alike_are_not_named(tmp_path: Path) -> None:
    if gpu_count() < 1:
        pytest.skip("needs a GPU")
    proc = start(tmp_path, "even", 25)
    code, _, err = finish(proc, 150)
    text = err.decode(errors="replace")
    assert code == 0, text[-3000:]
    assert "ddpboot: straggler:" not in text, text[-3000:]
    assert not list((tmp_path / "logs").glob("*/attempt_0/nccl_trace_rank_*")), "the dumps read are removed"
    assert os.path.exists(tmp_path / "logs")
