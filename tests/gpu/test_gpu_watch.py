"""--gpu-watch on a real GPU (NVML's compute processes): a process that is not the job's on the job's GPU is named
once, with its pid and memory; the rank's own memory on its own GPU is not a finding."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, TIMEOUT, clean_env, ddpboot_exe, finish, stderr_until, wait_for

pytestmark = pytest.mark.gpu


def gpus() -> int:
    """How many GPUs NVML sees (the watch reads NVML, so that is what this test needs)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no module, no driver
        pytest.skip(f"no NVIDIA GPU here (NVML: {exc})")
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def test_a_stranger_on_the_jobs_gpu_is_named_once(tmp_path: Path) -> None:
    if gpus() < 1:
        pytest.skip("needs 1 GPU")
    env = clean_env(WATCH_OUT=str(tmp_path))
    job = subprocess.Popen([*ddpboot_exe(), "--nproc", "1", "--gpus", "0", "--gpu-watch-interval", "0.5",
                            str(REPO / "tests" / "gpu" / "watch_rank.py")], env=env, cwd=REPO, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    stranger = None
    try:
        wait_for(lambda: (tmp_path / "ready").exists() or job.poll() is not None, TIMEOUT, "the rank's GPU memory")
        assert job.poll() is None, job.communicate()
        code = ("import sys, time, torch; x = torch.empty(128 << 20, dtype=torch.uint8, device='cuda'); "
                "print('ready', flush=True); sys.stdin.read()")
        stranger = subprocess.Popen([sys.executable, "-c", code], env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"),
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert stranger.stdout is not None and stranger.stdout.readline() == "ready\n"
        lines = stderr_until(job, lambda got: any(f"pid {stranger.pid} " in ln for ln in got), 60)
    finally:
        (tmp_path / "release").touch()
        if stranger is not None:
            stranger.communicate(input="", timeout=60)
    code, _, rest = finish(job, TIMEOUT)
    watch = [ln for ln in lines + rest.splitlines() if "gpu watch:" in ln]
    assert code == 0, (lines, rest)
    [line] = [ln for ln in watch if f"pid {stranger.pid} " in ln]
    assert "is not this job's and uses" in line and "MiB on GPU 0, the GPU of rank 0" in line, watch
    assert not [ln for ln in watch if "which is not its GPU" in ln], watch  # the rank on its own GPU is fine
