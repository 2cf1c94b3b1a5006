"""The helpers around init(): bad input to wrap(), and what each does before init()."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import ddpboot
from ddpboot.errors import NotInitializedError, WorkerSetupError


def test_wrap_rejects_non_modules() -> None:
    for bad in ([nn.Linear(1, 1)], nn.Linear, {"weight": torch.zeros(1)}):
        with pytest.raises(WorkerSetupError, match=r"takes a torch\.nn\.Module"):
            ddpboot.wrap(bad)  # type: ignore[arg-type]


def test_helpers_before_init() -> None:
    for helper in (ddpboot.context, ddpboot.barrier, lambda: ddpboot.wrap(nn.Linear(1, 1))):
        with pytest.raises(NotInitializedError, match=r"ddpboot.init\(\)"):
            helper()
    with pytest.raises(NotInitializedError), ddpboot.main_first():
        pass
    assert ddpboot.is_main()  # no launcher: rank 0


def test_is_main_before_init_reads_the_launcher(torchrun_env: Callable[..., None]) -> None:
    torchrun_env(RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", LOCAL_RANK="1")
    assert not ddpboot.is_main()


def test_is_main_before_init_ignores_a_partial_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")  # init() would refuse this; is_main() only asks whether a launcher said so
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert ddpboot.is_main()


def test_load_before_init_maps_to_cpu(tmp_path: Path) -> None:
    torch.save(torch.arange(3), tmp_path / "t.pt")
    assert ddpboot.load(tmp_path / "t.pt").device == torch.device("cpu")
