"""detect_environment: which launcher started this process, asked in a fixed order."""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest

from ddpboot.cluster import (
    ENVIRONMENTS,
    DdpbootEnvironment,
    SlurmEnvironment,
    TorchrunEnvironment,
    detect_environment,
)

TorchrunVars = Callable[..., dict[str, str]]


def test_plain_process_has_no_environment() -> None:
    assert detect_environment({}) is None
    assert detect_environment({"HOME": "/root", "CUDA_VISIBLE_DEVICES": "0"}) is None


def test_the_order_is_ddpboot_torchrun_slurm() -> None:
    # ddpboot's workers also match torchrun's contract, and launchers under srun inherit SLURM_* variables
    assert (DdpbootEnvironment, TorchrunEnvironment, SlurmEnvironment) == ENVIRONMENTS


def test_detect_environment_defaults_to_os_environ(
    monkeypatch: pytest.MonkeyPatch, torchrun_vars: TorchrunVars
) -> None:
    for name in list(os.environ):
        if name.startswith(("SLURM_", "TORCHELASTIC_", "DDPBOOT_", "PET_")) or name in torchrun_vars():
            monkeypatch.delenv(name)
    assert detect_environment() is None
    for name, value in torchrun_vars().items():
        monkeypatch.setenv(name, value)
    env = detect_environment()
    assert isinstance(env, TorchrunEnvironment)
    assert env.global_rank == 5
