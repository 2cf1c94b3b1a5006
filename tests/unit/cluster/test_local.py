"""LocalEnvironment: a process no launcher started, alone or in a process group the script made itself."""

from __future__ import annotations

import pytest

from ddpboot.cluster import LocalEnvironment
from ddpboot.errors import WorkerEnvError


def test_a_plain_process_is_a_world_of_one() -> None:
    env = LocalEnvironment({"HOME": "/root", "RANK": "0", "WORLD_SIZE": "1"})
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size) == (0, 1, 0, 1)
    assert (env.node_rank, env.nnodes, env.device_index, env.isolation, env.assigned_gpus) == (0, 1, 0, None, ())
    assert env.name == "none" and not env.joins_group and not env.exports_contract


def test_a_scripts_own_group_is_one_node() -> None:
    env = LocalEnvironment.from_group(2, 4)
    assert (env.global_rank, env.world_size, env.local_rank, env.local_world_size) == (2, 4, 2, 4)
    assert (env.node_rank, env.nnodes, env.device_index) == (0, 1, 2)


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"RANK": "1", "WORLD_SIZE": "2"},
            "RANK=1 and WORLD_SIZE=2 say this process is one rank of a job, but MASTER_ADDR, MASTER_PORT are not set",
        ),
        (
            {"WORLD_SIZE": "2", "MASTER_ADDR": "n1"},
            "RANK=(unset) and WORLD_SIZE=2 say this process is one rank of a job, but RANK, MASTER_PORT are not set",
        ),
        ({"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "n1"}, "MASTER_PORT is not set, so it cannot join"),
    ],
)
def test_a_partial_contract_is_not_a_world_of_one(env: dict[str, str], message: str) -> None:
    """RANK/WORLD_SIZE without a store address: running on alone would train an unrelated model."""
    with pytest.raises(WorkerEnvError, match="Fix: start the script with ddpboot or torchrun") as info:
        LocalEnvironment(env)
    assert message in str(info.value)
