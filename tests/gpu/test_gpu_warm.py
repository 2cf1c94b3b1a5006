"""`--warm` on a real GPU: NCCL ranks forked by the warm process get their own GPU and CUDA context, and neither
the warm process nor the launch's session ever holds one (CUDA is never initialised before the fork)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO, TIMEOUT, clean_env, ddpboot_exe, finish, wait_for

pytestmark = pytest.mark.gpu

RANK = """
import json, os, sys, time, torch, torch.distributed as dist
from pathlib import Path
out = Path(os.environ["WARM_GPU_OUT"])
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
dist.init_process_group("nccl")
t = torch.ones(4, device="cuda")
dist.all_reduce(t)
(out / "rank.json").write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "sum": t[0].item(),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "name": torch.cuda.get_device_name()}))
while not (out / "release").exists():
    time.sleep(0.05)
dist.destroy_process_group()
"""


def _compute_pids() -> set[int]:
    import pynvml

    pynvml.nvmlInit()
    try:
        return {p.pid for i in range(pynvml.nvmlDeviceGetCount())
                for p in pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(i))}
    finally:
        pynvml.nvmlShutdown()


def _on_gpu_with(pid: int) -> set[int] | None:
    pids = _compute_pids()
    return pids if pid in pids else None


def test_warm_nccl_ranks_and_a_warm_process_without_cuda(tmp_path: Path) -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
    except Exception as exc:
        pytest.skip(f"no NVIDIA GPU here (NVML: {exc})")
    if count < 1:
        pytest.skip("needs 1 GPU")
    job = tmp_path / "rank.py"
    job.write_text(RANK)
    warm_dir = tmp_path / "warm"
    warm_pids = []
    launchers: list[subprocess.Popen[str]] = []
    try:
        for launch in range(2):
            out = tmp_path / f"out{launch}"
            out.mkdir()
            env = clean_env(WARM_GPU_OUT=str(out), DDPBOOT_WARM_DIR=str(warm_dir))
            proc = subprocess.Popen([*ddpboot_exe(), "--warm", "--nproc", "1", "--gpus", "0", str(job)], env=env,
                                    cwd=REPO, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
            launchers.append(proc)
            wait_for(lambda out=out, proc=proc: (out / "rank.json").exists() or proc.poll() is not None, TIMEOUT,
                     "the rank")
            assert proc.poll() is None, proc.communicate()
            rank = json.loads((out / "rank.json").read_text())
            status = json.loads(subprocess.run([*ddpboot_exe(), "warm", "status", "--json"], env=env, text=True,
                                               capture_output=True, check=True).stdout)
            warm_pids.append(status["pid"])
            on_gpu = wait_for(lambda rank=rank: _on_gpu_with(rank["pid"]), 30, "the rank among the GPU's processes")
            assert status["pid"] not in on_gpu and rank["ppid"] not in on_gpu, (on_gpu, status, rank)
            assert rank["sum"] == 1.0 and rank["visible"], rank  # GPU 0, by the index or the UUID ddpboot gives
            (out / "release").touch()
            code, _, err = finish(proc, TIMEOUT)
            assert code == 0, err
        assert warm_pids[0] == warm_pids[1], "the second launch was served by the same warm process"
    finally:
        for launcher in launchers:  # a failed check leaves none holding the GPU
            if launcher.poll() is None:
                os.killpg(launcher.pid, 9)
                launcher.wait()
        subprocess.run([*ddpboot_exe(), "warm", "stop"], env=clean_env(DDPBOOT_WARM_DIR=str(warm_dir)),
                       capture_output=True, timeout=60)
        for pid in warm_pids:
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
