"""Choosing this rank's device: which visible GPU is its own, and narrowing an srun task to its GPU."""

from __future__ import annotations

import os

import pytest
import torch

from ddpboot.cluster import SlurmEnvironment
from ddpboot.errors import WorkerEnvError
from ddpboot.worker.device import choose_device, select_device_index

# GPUs no machine has: CUDA hides every GPU when CUDA_VISIBLE_DEVICES names an unknown UUID, so nothing here
# reaches a real GPU even where there is one.
ABSENT = ("GPU-00000000-0000-0000-0000-00000000000a", "GPU-00000000-0000-0000-0000-00000000000b")


def test_select_device_index() -> None:
    assert select_device_index(0, 1, "LOCAL_RANK") == 0
    assert select_device_index(3, 1, "LOCAL_RANK") == 0  # one visible GPU is this rank's, whatever LOCAL_RANK says
    assert select_device_index(1, 2, "LOCAL_RANK") == 1
    with pytest.raises(WorkerEnvError, match=r"LOCAL_RANK=2 but this process sees only 2 GPUs"):
        select_device_index(2, 2, "LOCAL_RANK")


def srun_task(local_rank: int) -> SlurmEnvironment:
    return SlurmEnvironment(
        {
            "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": str(local_rank),
            "SLURM_LOCALID": str(local_rank),
            "SLURM_NODEID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_NNODES": "1",
            "SLURM_TASKS_PER_NODE": "2",
            "SLURM_STEP_NODELIST": "n1",
        }
    )


def test_an_srun_task_keeps_only_its_own_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(ABSENT))
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    monkeypatch.delenv("CUDA_DEVICE_ORDER")  # unset, and restored after the test
    device, uuids = choose_device(srun_task(1), strict=False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ABSENT[1]
    assert os.environ["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert (device, uuids) == (torch.device("cpu"), ())


def test_a_cpu_srun_task_leaves_the_variable_alone() -> None:
    device, _ = choose_device(srun_task(1), strict=False)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and device == torch.device("cpu")
