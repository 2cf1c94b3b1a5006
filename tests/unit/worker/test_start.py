"""init(): bad input and contradictory launcher environments fail before anything starts; plain python is a world
of one.

Every init() here either fails before it touches anything (no process group, no CUDA) or runs as plain python,
which creates no process group, so these tests run inside pytest's process. CUDA_VISIBLE_DEVICES is emptied for
each test, so even on a GPU machine nothing here initialises CUDA.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import ddpboot
import ddpboot.cluster
from ddpboot.cluster.plugins import installed_plugins
from ddpboot.errors import (
    DdpbootError,
    NotInitializedError,
    PitfallError,
    VisibleDevicesChangedError,
    WorkerEnvError,
    WorkerSetupError,
)

UUID_A = "GPU-8c3f2b1a-0000-1111-2222-333344445555"
TorchrunEnv = Callable[..., None]


def assert_untouched() -> None:
    """A failed init() left nothing behind: no context, no process group."""
    with pytest.raises(NotInitializedError):
        ddpboot.context()
    assert not torch.distributed.is_initialized()


def test_init_unknown_backend() -> None:
    with pytest.raises(WorkerSetupError, match="unknown backend 'glooo'"):
        ddpboot.init(backend="glooo")
    assert_untouched()


@pytest.mark.parametrize("launched", [True, False])
def test_init_nccl_without_gpu(torchrun_env: TorchrunEnv, launched: bool) -> None:
    if launched:
        torchrun_env()
    with pytest.raises(WorkerSetupError, match="no GPU"):
        ddpboot.init(backend="nccl")
    assert_untouched()


@pytest.mark.parametrize("timeout", [0, -1, "10", True])
def test_init_bad_timeout(timeout: object) -> None:
    with pytest.raises(WorkerSetupError, match="timeout"):
        ddpboot.init(timeout=timeout)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, "RANK=2 is not below WORLD_SIZE=2"),
        ({"MASTER_PORT": None}, "MASTER_PORT is not set"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http'"),
        ({"RANK": "one"}, "RANK='one'"),
        ({"LOCAL_RANK": "-1"}, "LOCAL_RANK='-1'"),
        ({"DDPBOOT_ISOLATION": "gpu"}, "DDPBOOT_ISOLATION='gpu'"),
    ],
)
def test_init_contradictory_torchrun_env(
    torchrun_env: TorchrunEnv, overrides: dict[str, str | None], named: str
) -> None:
    torchrun_env(**overrides)
    with pytest.raises(WorkerEnvError) as exc:
        ddpboot.init()
    assert named in str(exc.value)
    assert_untouched()


def test_init_partial_env_is_not_a_world_of_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """RANK/WORLD_SIZE without a store address: running on alone would train an unrelated model."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(WorkerEnvError, match="MASTER_ADDR, MASTER_PORT are not set"):
        ddpboot.init()
    assert_untouched()


def test_init_contradictory_srun_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_NNODES": "1",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_STEP_NODELIST": "n1",
    }.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(WorkerEnvError, match="SLURM_PROCID=5 is not below SLURM_NTASKS=2"):
        ddpboot.init()
    assert_untouched()


def test_strict_guard_raises_before_anything_starts(torchrun_env: TorchrunEnv) -> None:
    """ddpboot assigned UUID_A, the script switched to '0': strict=True raises, having started nothing."""
    torchrun_env(
        DDPBOOT_ISOLATION="rank",
        DDPBOOT_LOCAL_RANK="0",
        DDPBOOT_GPU_UUIDS=UUID_A,
        CUDA_VISIBLE_DEVICES="0",
    )
    with pytest.raises(VisibleDevicesChangedError, match="Fix:") as exc:
        ddpboot.init(strict=True)
    assert isinstance(exc.value, PitfallError) and isinstance(exc.value, DdpbootError)
    assert_untouched()


def test_plain_python_world_of_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ddpboot.DdpbootWarning)
        ctx = ddpboot.init()
        assert ddpboot.init() is ctx is ddpboot.context()
        assert (ctx.rank, ctx.world_size, ctx.local_rank, ctx.local_world_size, ctx.node_rank) == (0, 1, 0, 1, 0)
        assert (ctx.device, ctx.backend, ctx.gpu_uuids, ctx.launcher) == (torch.device("cpu"), None, (), "none")
        assert ctx.is_main and not ctx.distributed and not torch.distributed.is_initialized()
        with pytest.raises(dataclasses.FrozenInstanceError):
            ctx.rank = 1  # type: ignore[misc]
        with pytest.raises(WorkerSetupError, match="earlier init"):
            ddpboot.init(backend="gloo")

        model = nn.Linear(3, 1)
        assert ddpboot.wrap(model, find_unused_parameters=True) is model  # world of one: no DDP
        s = ddpboot.sampler(list(range(7)), shuffle=False)
        s.set_epoch(3)
        assert list(s) == list(range(7)) and s.num_replicas == 1
        ddpboot.barrier()
        with ddpboot.main_first():
            pass
        ddpboot.print0("only", "rank", 0, sep="-")
        assert capsys.readouterr().out == "only-rank-0\n"

        torch.save({"w": torch.ones(2)}, tmp_path / "ckpt.pt")
        assert ddpboot.load(tmp_path / "ckpt.pt")["w"].device == torch.device("cpu")
        assert ddpboot.load(tmp_path / "ckpt.pt", map_location="meta")["w"].is_meta


class _OwnEnvironment(ddpboot.cluster.ClusterEnvironment):
    """A site's launcher, given to init() by the script: a world of one that joins no group (so no store here)."""

    name = "site"
    joins_group = False

    @classmethod
    def detect(cls, env: object) -> bool:
        return False

    def __init__(self, env: object) -> None:
        self._rank, self._world_size, self._local_rank, self._local_world_size = 0, 1, 0, 1
        self._node_rank, self._nnodes, self._main_address, self._main_port = 0, 1, "", 0


@pytest.mark.parametrize("given", [_OwnEnvironment, _OwnEnvironment({})])
def test_init_takes_the_script_s_own_environment(given: object, torchrun_env: TorchrunEnv) -> None:
    # it wins over what detection would find (here a half-set torchrun environment, which would be an error)
    torchrun_env(LOCAL_RANK=None)
    ctx = ddpboot.init(environment=given)  # type: ignore[arg-type]
    assert (ctx.launcher, ctx.rank, ctx.world_size, ctx.backend) == ("site", 0, 1, None)


@pytest.mark.parametrize("given", ["slurm", 3, object])
def test_init_refuses_an_environment_that_is_not_one(given: object) -> None:
    with pytest.raises(WorkerSetupError, match=r"environment=.*ClusterEnvironment instance or subclass"):
        ddpboot.init(environment=given)  # type: ignore[arg-type]
    assert_untouched()


def test_a_broken_environment_plugin_is_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    info = tmp_path / "broken_envs-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-envs\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[ddpboot.environments]\nbroken = broken_envs_missing:Env\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    installed_plugins.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            ctx = ddpboot.init()
            ddpboot.shutdown()
            ddpboot.init()  # said once per process
    finally:
        installed_plugins.cache_clear()
    assert ctx.launcher == "none"
    [w] = [w for w in got if issubclass(w.category, ddpboot.DdpbootWarning)]
    assert "broken = 'broken_envs_missing:Env'" in str(w.message) and "ModuleNotFoundError" in str(w.message)
    assert w.filename == __file__
