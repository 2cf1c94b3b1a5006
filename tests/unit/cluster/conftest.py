"""Fixtures for the cluster environment tests: what torchrun gives a worker, and an environment's layout."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ddpboot.cluster import ClusterEnvironment

TorchrunVars = Callable[..., dict[str, str]]
Layout = Callable[[ClusterEnvironment], tuple[int, int, int, int, int, int, str, int]]


def _torchrun_vars(
    rank: int = 5, local_rank: int = 1, world_size: int = 8, local_world_size: int = 4, node: int = 1, nnodes: int = 2
) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(nnodes),
        "ROLE_RANK": str(rank),
        "ROLE_NAME": "default",
        "MASTER_ADDR": "10.1.2.3",
        "MASTER_PORT": "29500",
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }


def _layout(env: ClusterEnvironment) -> tuple[int, int, int, int, int, int, str, int]:
    return (
        env.global_rank,
        env.world_size,
        env.local_rank,
        env.local_world_size,
        env.node_rank,
        env.nnodes,
        env.main_address,
        env.main_port,
    )


@pytest.fixture(scope="session")
def torchrun_vars() -> TorchrunVars:
    """Builds what torchrun gives a worker (torch.distributed.run's worker environment): a fresh dict each call."""
    return _torchrun_vars


@pytest.fixture(scope="session")
def layout() -> Layout:
    """An environment's eight values as one tuple: rank, world size, local rank, local world size, node rank,
    node count, store address, store port."""
    return _layout
