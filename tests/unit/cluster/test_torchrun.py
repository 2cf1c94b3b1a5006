"""TorchrunEnvironment: the ranks torchrun (or a hand-made env:// launch) gives a worker, and their checks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.cluster import TorchrunEnvironment, detect_environment
from ddpboot.errors import WorkerEnvError

TorchrunVars = Callable[..., dict[str, str]]
Layout = Callable[[Any], tuple[int, int, int, int, int, int, str, int]]


def test_env_init_vars_without_run_id_are_torchrun_style(torchrun_vars: TorchrunVars) -> None:
    env = torchrun_vars()
    del env["TORCHELASTIC_RUN_ID"]
    assert isinstance(detect_environment(env), TorchrunEnvironment)
    del env["MASTER_PORT"]  # no longer the env:// contract, and no run id
    assert detect_environment(env) is None


def test_run_id_alone_is_detected_and_then_reports_what_is_missing() -> None:
    # a half-set torchrun environment fails loudly instead of falling back to a single process
    with pytest.raises(WorkerEnvError, match=r"WORLD_SIZE is not set.*TORCHELASTIC_RUN_ID"):
        detect_environment({"TORCHELASTIC_RUN_ID": "abc"})


def test_torchrun_values(torchrun_vars: TorchrunVars, layout: Layout) -> None:
    env = TorchrunEnvironment(torchrun_vars())
    assert layout(env) == (5, 8, 1, 4, 1, 2, "10.1.2.3", 29500)
    assert (env.name, env.device_index, env.isolation, env.assigned_gpus) == ("torchrun", 1, None, ())
    assert not env.exports_contract and env.joins_group and not env.narrows_visible_devices
    assert "rank 5/8" in env.describe()


def test_true_local_rank_may_differ_from_the_device_index(torchrun_vars: TorchrunVars) -> None:
    # ddpboot exports LOCAL_RANK=0 under rank isolation; the true node-local index is DDPBOOT_LOCAL_RANK
    env = TorchrunEnvironment({**torchrun_vars(rank=7, local_rank=0), "DDPBOOT_LOCAL_RANK": "3"})
    assert (env.local_rank, env.device_index) == (3, 0)


def test_group_variables_are_derived_from_torchrun_layout_when_absent(torchrun_vars: TorchrunVars) -> None:
    env = torchrun_vars(rank=5, local_rank=1, world_size=8, local_world_size=4)
    del env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]
    t = TorchrunEnvironment(env)
    assert (t.node_rank, t.nnodes) == (1, 2)


def test_group_world_size_cannot_be_derived_for_uneven_nodes(torchrun_vars: TorchrunVars) -> None:
    env = torchrun_vars(rank=5, local_rank=1, world_size=6, local_world_size=4)
    del env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]
    with pytest.raises(WorkerEnvError, match=r"GROUP_WORLD_SIZE is not set.*WORLD_SIZE=6.*LOCAL_WORLD_SIZE=4"):
        TorchrunEnvironment(env)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"RANK": "8"}, "RANK=8 is not below WORLD_SIZE=8"),
        ({"RANK": "x"}, "RANK='x' is not an integer"),
        ({"RANK": "-1"}, "RANK='-1' is not an integer"),
        ({"RANK": ""}, "RANK is not set"),
        ({"RANK": None}, "RANK is not set"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' must be at least 1"),
        ({"LOCAL_RANK": "4"}, "LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
        ({"LOCAL_RANK": None}, "LOCAL_RANK is not set"),
        ({"LOCAL_WORLD_SIZE": None}, "LOCAL_WORLD_SIZE is not set"),
        ({"LOCAL_WORLD_SIZE": "16"}, "LOCAL_WORLD_SIZE=16 is larger than WORLD_SIZE=8"),
        ({"DDPBOOT_LOCAL_RANK": "4"}, "DDPBOOT_LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
        ({"DDPBOOT_LOCAL_RANK": "one"}, "DDPBOOT_LOCAL_RANK='one'"),
        ({"GROUP_RANK": "2"}, "GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"),
        ({"GROUP_WORLD_SIZE": "9"}, "GROUP_WORLD_SIZE=9 is larger than WORLD_SIZE=8"),
        ({"GROUP_RANK": None, "GROUP_WORLD_SIZE": "1"}, "RANK // LOCAL_WORLD_SIZE=1 is not below GROUP_WORLD_SIZE"),
        ({"MASTER_ADDR": None}, "MASTER_ADDR is not set"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT='70000' is not a TCP port"),
        ({"MASTER_PORT": "0"}, "MASTER_PORT='0' must be at least 1"),
        ({"MASTER_PORT": "29500a"}, "MASTER_PORT='29500a'"),
    ],
)
def test_torchrun_errors_name_the_variable(
    torchrun_vars: TorchrunVars, change: dict[str, str | None], message: str
) -> None:
    env = torchrun_vars()
    for name, value in change.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    with pytest.raises(WorkerEnvError) as info:
        TorchrunEnvironment(env)
    assert message in str(info.value)


@given(
    nnodes=st.integers(1, 8),
    nproc=st.integers(1, 8),
    data=st.data(),
    isolated=st.booleans(),
    drop_groups=st.booleans(),
)
def test_any_torchrun_layout_reads_back(
    torchrun_vars: TorchrunVars,
    layout: Layout,
    nnodes: int,
    nproc: int,
    data: st.DataObject,
    isolated: bool,
    drop_groups: bool,
) -> None:
    node = data.draw(st.integers(0, nnodes - 1))
    local = data.draw(st.integers(0, nproc - 1))
    rank = node * nproc + local  # torchrun's layout: consecutive ranks per node
    env = torchrun_vars(rank, local, nnodes * nproc, nproc, node, nnodes)
    if isolated:
        env.update(LOCAL_RANK="0", DDPBOOT_LOCAL_RANK=str(local), DDPBOOT_ISOLATION="rank")
    if drop_groups:
        del env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]
    got = detect_environment(env)
    assert got is not None
    assert layout(got) == (rank, nnodes * nproc, local, nproc, node, nnodes, "10.1.2.3", 29500)
