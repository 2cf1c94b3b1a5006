"""On a machine with NVIDIA GPUs: `ddpboot gpus` agrees with nvidia-smi, and planning picks what it should."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.support import clean_env, run_ddpboot

pytestmark = pytest.mark.gpu


def smi_uuids() -> list[str]:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi on this machine: GPU tests need NVIDIA GPUs and their driver")
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
    )
    if out.returncode != 0:
        pytest.skip(f"nvidia-smi failed ({out.stderr.strip()}): no usable GPUs here")
    return [line.split(",")[1].strip() for line in out.stdout.strip().splitlines()]


def test_gpus_json_lists_what_nvidia_smi_lists() -> None:
    uuids = smi_uuids()
    out = run_ddpboot("gpus", "--json", env=clean_env())
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["source"] == "nvml"
    assert [g["uuid"] for g in data["gpus"]] == uuids
    assert [g["index"] for g in data["gpus"]] == list(range(len(uuids)))


def test_plan_exclude_0_picks_gpu_1() -> None:
    uuids = smi_uuids()
    if len(uuids) < 2:
        pytest.skip(f"needs 2 GPUs, this machine has {len(uuids)}")
    out = run_ddpboot(
        "plan",
        "--exclude",
        "0",
        "--nproc",
        "1",
        "--json",
        "--max-used-memory",
        "100GiB",
        "--max-util",
        "100",
        env=clean_env(),
    )
    assert out.returncode == 0, out.stderr
    (rank,) = json.loads(out.stdout)["ranks"]
    assert rank["gpus"][0]["index"] == 1 and rank["cuda_visible_devices"] == uuids[1]
