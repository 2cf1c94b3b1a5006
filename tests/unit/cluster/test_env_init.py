"""EnvInitEnvironment: RANK, WORLD_SIZE and MASTER_* without LOCAL_RANK/LOCAL_WORLD_SIZE is one process per node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from ddpboot.cluster import EnvInitEnvironment, TorchrunEnvironment, detect_environment
from ddpboot.errors import WorkerEnvError

Layout = Callable[[Any], tuple[int, int, int, int, int, int, str, int]]
POD = {"RANK": "2", "WORLD_SIZE": "4", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"}


def test_the_four_env_init_variables_alone_are_one_process_per_node(layout: Layout) -> None:
    env = detect_environment(POD)
    assert isinstance(env, EnvInitEnvironment) and env.name == "env"
    assert layout(env) == (2, 4, 0, 1, 2, 4, "job-master-0", 23456)
    assert env.exports_contract and env.joins_group and env.device_index == 0
    [note] = env.notes
    assert "LOCAL_RANK and LOCAL_WORLD_SIZE are not" in note and "local rank 0 of 1" in note and "export" in note


@pytest.mark.parametrize("extra", [{"LOCAL_RANK": "0"}, {"LOCAL_WORLD_SIZE": "1"}, {"TORCHELASTIC_RUN_ID": "r"}])
def test_torchrun_s_own_or_a_half_local_pair_stays_an_error(extra: dict[str, str]) -> None:
    # torchrun always sets both; a launcher that sets one of them meant to set the other
    assert not EnvInitEnvironment.detect({**POD, **extra})
    with pytest.raises(WorkerEnvError, match=r"LOCAL_(RANK|WORLD_SIZE) is not set"):
        detect_environment({**POD, **extra})
    assert TorchrunEnvironment.detect({**POD, **extra})


@pytest.mark.parametrize(
    ("change", "message"),
    [({"RANK": "4"}, "RANK=4 is not below WORLD_SIZE=4"), ({"MASTER_PORT": "0"}, "MASTER_PORT='0'"),
     ({"WORLD_SIZE": "x"}, "WORLD_SIZE='x'")],
)
def test_bad_values_name_the_variable(change: dict[str, str], message: str) -> None:
    with pytest.raises(WorkerEnvError, match=message):
        EnvInitEnvironment({**POD, **change})
