"""The worker API without other processes: its pure helpers, bad input to init()/wrap(), and plain-python use.

Every init() here either fails before it touches anything (no process group, no CUDA) or runs as plain python,
which creates no process group, so these tests run inside pytest's process. CUDA_VISIBLE_DEVICES is emptied for
each test, so even on a GPU machine nothing here initialises CUDA.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import ddpboot
from ddpboot import worker
from ddpboot.errors import (
    DdpbootError,
    NotInitializedError,
    PitfallError,
    VisibleDevicesChangedError,
    WorkerEnvError,
    WorkerSetupError,
)
from ddpboot.worker import (
    check_master,
    check_ranks,
    normalize_backend,
    normalize_uuid,
    parse_int_var,
    select_device_index,
    slurm_visible_devices,
    split_uuids,
    unassigned_gpus,
    visible_devices_changed,
)

UUID_A = "GPU-8c3f2b1a-0000-1111-2222-333344445555"
UUID_B = "GPU-9d4e3c2b-6666-7777-8888-99990000aaaa"
TORCHRUN_NAMES = {
    "rank": "RANK",
    "world_size": "WORLD_SIZE",
    "local_rank": "LOCAL_RANK",
    "local_world_size": "LOCAL_WORLD_SIZE",
    "node_rank": "GROUP_RANK",
}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No launcher variables (pytest itself may run under srun), no GPUs, no leftover ddpboot state."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "TORCHELASTIC_", "DDPBOOT_", "PET_")) or name in (
            "RANK",
            "WORLD_SIZE",
            "LOCAL_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_RANK",
            "GROUP_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    yield
    worker.shutdown()
    worker._first_launcher = None


def torchrun_env(monkeypatch: pytest.MonkeyPatch, **overrides: str | None) -> None:
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


def assert_untouched() -> None:
    """A failed init() left nothing behind: no context, no process group."""
    with pytest.raises(NotInitializedError):
        ddpboot.context()
    assert not torch.distributed.is_initialized()


# ------------------------------------------------------------------------------------------------- import cost


def test_import_ddpboot_does_not_import_torch() -> None:
    code = (
        "import sys, ddpboot\n"
        "assert 'torch' not in sys.modules, 'import ddpboot loaded torch'\n"
        "assert 'ddpboot.worker' not in sys.modules\n"
        "print(ddpboot.__version__, sorted(n for n in ddpboot.__all__ if n != '__version__'))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("0.1.0 ")
    for name in ("init", "wrap", "shutdown", "barrier", "is_main", "main_first", "print0", "sampler", "context"):
        assert f"'{name}'" in out.stdout


def test_lazy_exports_are_the_worker_objects() -> None:
    assert ddpboot.init is worker.init and ddpboot.Context is worker.Context
    assert issubclass(ddpboot.DdpbootWarning, UserWarning)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        ddpboot.nope  # type: ignore[attr-defined]  # noqa: B018


# ------------------------------------------------------------------------------------------------ pure helpers


@pytest.mark.parametrize(
    ("given", "expected"),
    [("gloo", "gloo"), (" NCCL ", "nccl"), ("cpu:gloo,cuda:nccl", "cpu:gloo,cuda:nccl"), ("mpi", "mpi")],
)
def test_normalize_backend_accepts_torch_names(given: str, expected: str) -> None:
    assert normalize_backend(given) == expected


@pytest.mark.parametrize("bad", ["ncl", "", "  ", "tpu:gloo", "cpu:nope", "undefined", 3, None])
def test_normalize_backend_rejects_unknown(bad: object) -> None:
    with pytest.raises(WorkerSetupError, match="Fix: pass backend=None") as exc:
        normalize_backend(bad)
    assert repr(bad) in str(exc.value)


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ((2, 2, 0, 1, 0), "RANK=2 is not below WORLD_SIZE=2"),
        ((0, 0, 0, 1, 0), "WORLD_SIZE=0"),
        ((0, 2, 1, 1, 0), "LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1"),
        ((0, 2, 0, 3, 0), "LOCAL_WORLD_SIZE=3 must be between 1 and WORLD_SIZE=2"),
        ((0, 2, 0, 2, -1), "GROUP_RANK=-1"),
    ],
)
def test_check_ranks_names_the_contradiction(values: tuple[int, int, int, int, int], named: str) -> None:
    with pytest.raises(WorkerEnvError, match="fix:") as exc:
        check_ranks(*values, names=TORCHRUN_NAMES)
    assert named in str(exc.value)


def test_check_ranks_accepts_a_consistent_job() -> None:
    check_ranks(5, 8, 1, 4, 1, TORCHRUN_NAMES)


def test_parse_int_var() -> None:
    assert parse_int_var({"X": " 7 "}, "X") == 7
    with pytest.raises(WorkerEnvError, match="X='seven' is not an integer"):
        parse_int_var({"X": "seven"}, "X")
    with pytest.raises(WorkerEnvError, match="X is not set"):
        parse_int_var({}, "X")


def test_check_master() -> None:
    assert check_master({"MASTER_ADDR": "node1", "MASTER_PORT": "29500"}) == ("node1", 29500)
    with pytest.raises(WorkerEnvError, match="MASTER_PORT is not set"):
        check_master({"MASTER_ADDR": "node1"})
    with pytest.raises(WorkerEnvError, match="MASTER_PORT='x'"):
        check_master({"MASTER_ADDR": "node1", "MASTER_PORT": "x"})
    with pytest.raises(WorkerEnvError, match="MASTER_PORT=70000 is not a TCP port"):
        check_master({"MASTER_ADDR": "node1", "MASTER_PORT": "70000"})
    with pytest.raises(WorkerEnvError, match="MASTER_ADDR is not set"):
        check_master({"MASTER_PORT": "1"})


def test_uuid_spellings() -> None:
    assert split_uuids(None) == () and split_uuids("") == ()
    assert split_uuids(f"{UUID_A}, {UUID_B}") == (UUID_A, UUID_B)
    # torch prints props.uuid without NVML's prefix
    assert normalize_uuid(UUID_A) == normalize_uuid(UUID_A[4:]) == normalize_uuid(UUID_A.upper())


def test_visible_devices_changed() -> None:
    assert visible_devices_changed(UUID_A, [UUID_A]) is None
    assert visible_devices_changed(f" {UUID_A.lower()} ", [UUID_A]) is None
    assert visible_devices_changed("0", []) is None  # CPU rank: nothing assigned, nothing to compare
    msg = visible_devices_changed("0", [UUID_A])
    assert msg is not None and "CUDA_VISIBLE_DEVICES is '0'" in msg and UUID_A in msg and "Fix:" in msg
    unset = visible_devices_changed(None, [UUID_A])
    assert unset is not None and "is unset" in unset
    assert visible_devices_changed(f"{UUID_B},{UUID_A}", [UUID_A, UUID_B]) is not None  # order is CUDA's numbering


def test_unassigned_gpus_compares_across_spellings() -> None:
    assert unassigned_gpus([UUID_A[4:]], [UUID_A]) == ()
    assert unassigned_gpus([UUID_A, UUID_B], [UUID_A]) == (UUID_B,)


@pytest.mark.parametrize(
    ("cvd", "count", "local_rank", "lws", "per_task", "expected"),
    [
        (None, 4, 2, 4, False, "2"),  # every GPU visible: the task's index (CUDA_DEVICE_ORDER=PCI_BUS_ID set too)
        ("4,5,6,7", 4, 1, 4, False, "5"),  # SLURM gave global indices: keep its spelling
        (f"{UUID_A},{UUID_B}", 2, 1, 2, False, UUID_B),
        (None, 8, 3, 4, False, "3"),  # more GPUs than tasks: task i takes GPU i
        ("3", 1, 1, 2, False, None),  # --gpus-per-task / cgroup: already its own GPU
        ("0,1", 2, 1, 2, True, None),  # --gpus-per-task=2: the task's own list, use its first
        ("", 0, 1, 2, False, None),  # CPU
    ],
)
def test_slurm_visible_devices(
    cvd: str | None, count: int, local_rank: int, lws: int, per_task: bool, expected: str | None
) -> None:
    assert slurm_visible_devices(cvd, count, local_rank, lws, per_task) == expected


def test_slurm_visible_devices_refuses_more_tasks_than_gpus() -> None:
    with pytest.raises(WorkerEnvError, match="--ntasks-per-node=2"):
        slurm_visible_devices(None, 2, 3, 4, False)


@given(st.integers(1, 8).flatmap(lambda lws: st.tuples(st.just(lws), st.integers(lws, 16))), st.booleans())
def test_slurm_tasks_of_a_node_get_distinct_gpus(sizes: tuple[int, int], as_list: bool) -> None:
    lws, count = sizes
    cvd = ",".join(str(10 + i) for i in range(count)) if as_list else None
    picks = [slurm_visible_devices(cvd, count, r, lws, False) or "0" for r in range(lws)]
    assert len(set(picks)) == lws


def test_select_device_index() -> None:
    assert select_device_index(0, 1, "LOCAL_RANK") == 0
    assert select_device_index(3, 1, "LOCAL_RANK") == 0  # one visible GPU is this rank's, whatever LOCAL_RANK says
    assert select_device_index(1, 2, "LOCAL_RANK") == 1
    with pytest.raises(WorkerEnvError, match=r"LOCAL_RANK=2 but this process sees only 2 GPUs"):
        select_device_index(2, 2, "LOCAL_RANK")


# --------------------------------------------------------------------------------------- bad input to init()


def test_init_unknown_backend() -> None:
    with pytest.raises(WorkerSetupError, match="unknown backend 'glooo'"):
        ddpboot.init(backend="glooo")
    assert_untouched()


@pytest.mark.parametrize("launched", [True, False])
def test_init_nccl_without_gpu(monkeypatch: pytest.MonkeyPatch, launched: bool) -> None:
    if launched:
        torchrun_env(monkeypatch)
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
    monkeypatch: pytest.MonkeyPatch, overrides: dict[str, str | None], named: str
) -> None:
    torchrun_env(monkeypatch, **overrides)
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


def test_strict_guard_raises_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """ddpboot assigned UUID_A, the script switched to '0': strict=True raises, having started nothing."""
    torchrun_env(
        monkeypatch,
        DDPBOOT_ISOLATION="rank",
        DDPBOOT_LOCAL_RANK="0",
        DDPBOOT_GPU_UUIDS=UUID_A,
        CUDA_VISIBLE_DEVICES="0",
    )
    with pytest.raises(VisibleDevicesChangedError, match="Fix:") as exc:
        ddpboot.init(strict=True)
    assert isinstance(exc.value, PitfallError) and isinstance(exc.value, DdpbootError)
    assert_untouched()


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


def test_is_main_before_init_reads_the_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    torchrun_env(monkeypatch, RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", LOCAL_RANK="1")
    assert not ddpboot.is_main()


# ------------------------------------------------------------------------------------------------ plain python


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


def test_context_manager_shuts_down() -> None:
    with ddpboot.init() as ctx:
        assert ddpboot.context() is ctx
    with pytest.raises(NotInitializedError):
        ddpboot.context()
    ddpboot.shutdown()  # again: harmless
    assert ddpboot.init() is not ctx  # a fresh context after shutdown


def test_load_before_init_maps_to_cpu(tmp_path: Path) -> None:
    torch.save(torch.arange(3), tmp_path / "t.pt")
    assert ddpboot.load(tmp_path / "t.pt").device == torch.device("cpu")
