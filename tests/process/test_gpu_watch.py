"""--gpu-watch, rehearsed with a simulated inventory whose process lists a rank rewrites while the job runs: a rank
on a GPU that is not its own, and a process that is not the job's on the job's GPU, are each said once; `strict`
ends the job with exit code 125. (The NVML path is tested on a real GPU in tests/gpu/.)"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support import SCRIPTS, TIMEOUT, finish, launch_env, start_launcher, stderr_until

WRONG = str(SCRIPTS / "wrong_gpu.py")


def inventory(tmp_path: Path) -> Path:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"index": i, "uuid": f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd"} for i in (0, 1)]))
    return path


def watch_lines(lines: list[str]) -> list[str]:
    return [ln for ln in lines if "gpu watch:" in ln]


@pytest.mark.parametrize("mode", ["warn", "strict"])
def test_a_rank_on_another_gpu_and_a_stranger_on_its_own_are_said_once(tmp_path: Path, mode: str) -> None:
    env = launch_env(tmp_path)
    env["DDPBOOT_FAKE_GPUS"] = str(inventory(tmp_path))
    proc = start_launcher(["--nproc", "1", "--gpus", "0", "--gpu-watch", mode, "--gpu-watch-interval", "0.1",
                           WRONG, str(os.getpid())], env)
    try:
        lines = stderr_until(proc, lambda got: len(watch_lines(got)) >= 2, 60)
    finally:
        (tmp_path / "release").touch()
    code, _, rest = finish(proc, TIMEOUT)
    watch = watch_lines(lines + rest.splitlines())
    [wrong] = [ln for ln in watch if "rank 0 (the rank itself)" in ln]
    assert "holds 500 MiB on GPU 1, which is not its GPU (rank 0 runs on GPU 0)" in wrong, watch
    assert "without device_id" in wrong and "map_location" in wrong
    if mode == "strict":
        assert code == 125, rest
        assert wrong.endswith("--gpu-watch strict: ending the job (exit code 125)")
    else:
        assert code == 0, rest
        [stranger] = [ln for ln in watch if f"pid {os.getpid()} " in ln]
        assert "is not this job's and uses 300 MiB on GPU 0, the GPU of rank 0" in stranger, watch
        assert len(watch) == 2, watch  # each said once, however many readings saw it


def test_a_job_gpu_that_turns_sick_while_the_job_runs_is_said_once_per_kind(tmp_path: Path) -> None:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps([{"index": 0, "memory_total": 80 << 30}]))
    env = launch_env(tmp_path, DDPBOOT_LOCK_DIR=str(tmp_path / "locks"))  # Xid 79 marks the GPU failing there
    env["DDPBOOT_FAKE_GPUS"] = str(path)
    proc = start_launcher(["--nproc", "1", "--gpu-watch-interval", "0.1", str(SCRIPTS / "sick_gpu.py")], env)
    try:
        lines = stderr_until(proc, lambda got: len(watch_lines(got)) >= 3, 60)
    finally:
        (tmp_path / "release").touch()
    code, _, rest = finish(proc, TIMEOUT)
    watch = watch_lines(lines + rest.splitlines())
    assert code == 0, rest
    assert len(watch) == 3, watch  # each once, however many looks saw it
    assert any("GPU 0 (rank 0) is 97% full (77.6 of 80.0 GiB)" in w for w in watch), watch
    assert any("GPU 0 (rank 0) slows its clocks: thermal slowdown" in w for w in watch), watch
    assert any("GPU 0 (rank 0) reported Xid 79" in w and "GPU 0 is marked failing" in w for w in watch), watch
