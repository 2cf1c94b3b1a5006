"""Shared test helpers: simulated inventories and running the real `ddpboot` console script."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
# GPU locks taken by the processes tests start go here, not into the machine's shared lock directory.
_LOCK_DIR = tempfile.mkdtemp(prefix="ddpboot-test-locks-")
atexit.register(shutil.rmtree, _LOCK_DIR, True)


def ddpboot_exe() -> list[str]:
    """The installed console script (what users run), else `python -m ddpboot`."""
    exe = Path(sys.executable).with_name("ddpboot")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ddpboot")
    return [found] if found else [sys.executable, "-m", "ddpboot"]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without anything that would steer ddpboot or torch.distributed."""
    drop_prefixes = ("DDPBOOT_", "PET_", "SLURM_", "TORCHELASTIC_")
    drop = {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "OMP_NUM_THREADS",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(drop_prefixes)}
    env["DDPBOOT_LOCK_DIR"] = _LOCK_DIR
    env.update(extra)
    return env


def run_ddpboot(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ddpboot_exe(), *args],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


@pytest.fixture
def fake_gpus(tmp_path: Path) -> Callable[[Iterable[dict[str, Any]]], str]:
    """Write a simulated inventory (a list of GPU objects) and return its path for DDPBOOT_FAKE_GPUS."""
    counter = iter(range(1000))

    def write(gpus: Iterable[dict[str, Any]]) -> str:
        path = tmp_path / f"gpus{next(counter)}.json"
        path.write_text(json.dumps(list(gpus)))
        return str(path)

    return write
