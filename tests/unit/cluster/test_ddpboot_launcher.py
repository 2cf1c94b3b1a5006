"""DdpbootEnvironment: a worker of ddpboot's launcher, recognised by DDPBOOT_ISOLATION, with its assigned GPUs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ddpboot.cluster import DdpbootEnvironment, TorchrunEnvironment, detect_environment, split_uuids
from ddpboot.errors import WorkerEnvError

TorchrunVars = Callable[..., dict[str, str]]
UUID_A = "GPU-8c3f2b1a-0000-1111-2222-333344445555"
UUID_B = "GPU-9d4e3c2b-6666-7777-8888-99990000aaaa"


def test_rank_isolation_reports_the_true_local_rank(torchrun_vars: TorchrunVars) -> None:
    # ddpboot exports LOCAL_RANK=0 under rank isolation; the true node-local index is DDPBOOT_LOCAL_RANK
    env = detect_environment(
        {
            **torchrun_vars(rank=7, local_rank=0),
            "DDPBOOT_LOCAL_RANK": "3",
            "DDPBOOT_ISOLATION": "rank",
            "DDPBOOT_GPU_UUIDS": UUID_A,
        }
    )
    assert isinstance(env, DdpbootEnvironment) and isinstance(env, TorchrunEnvironment)
    assert (env.name, env.local_rank, env.device_index) == ("ddpboot", 3, 0)
    assert (env.isolation, env.assigned_gpus) == ("rank", (UUID_A,))
    assert not env.exports_contract


def test_node_isolation_local_rank_is_local_rank(torchrun_vars: TorchrunVars) -> None:
    env = DdpbootEnvironment({**torchrun_vars(), "DDPBOOT_LOCAL_RANK": "1", "DDPBOOT_ISOLATION": "node"})
    assert (env.local_rank, env.device_index, env.isolation, env.assigned_gpus) == (1, 1, "node", ())


def test_without_isolation_it_is_not_ddpboot(torchrun_vars: TorchrunVars) -> None:
    assert not DdpbootEnvironment.detect({**torchrun_vars(), "DDPBOOT_ISOLATION": " "})
    assert type(detect_environment({**torchrun_vars(), "DDPBOOT_GPU_UUIDS": UUID_A})) is TorchrunEnvironment


def test_unknown_isolation_is_named(torchrun_vars: TorchrunVars) -> None:
    with pytest.raises(WorkerEnvError, match=r"DDPBOOT_ISOLATION='gpu': choose rank .* or node .*Fix: let the ddpboot"):
        detect_environment({**torchrun_vars(), "DDPBOOT_ISOLATION": "gpu"})


def test_torchrun_errors_come_first(torchrun_vars: TorchrunVars) -> None:
    with pytest.raises(WorkerEnvError, match="RANK=8 is not below WORLD_SIZE=8"):
        DdpbootEnvironment({**torchrun_vars(), "RANK": "8", "DDPBOOT_ISOLATION": "gpu"})


def test_uuid_lists() -> None:
    assert split_uuids(None) == () and split_uuids("") == ()
    assert split_uuids(f"{UUID_A}, {UUID_B}") == (UUID_A, UUID_B)
    assert split_uuids(f"{UUID_A},,") == (UUID_A,)
