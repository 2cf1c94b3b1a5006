"""Every worker test starts without launcher variables or GPUs and leaves no ddpboot state behind."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

import ddpboot

_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE")


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher variables (pytest itself may run under srun), no GPUs, no leftover ddpboot context."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "TORCHELASTIC_", "DDPBOOT_", "PET_")) or name in (
            *_LAUNCH_VARS,
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    yield
    ddpboot.shutdown()


@pytest.fixture
def torchrun_env(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Sets the variables torchrun gives rank 0 of a world of one; keyword arguments change them (None unsets)."""

    def set_vars(**overrides: str | None) -> None:
        values: dict[str, str | None] = {
            "TORCHELASTIC_RUN_ID": "test",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
        }
        values.update(overrides)
        for k, v in values.items():
            if v is None:
                monkeypatch.delenv(k, raising=False)
            else:
                monkeypatch.setenv(k, v)

    return set_vars
