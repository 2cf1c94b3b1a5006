"""`ddpboot.testing`: the pytest plugin that runs a test on N ranks through the ddpboot launcher.

    import pytest
    from ddpboot.testing import rank_fixture

    @rank_fixture                               # resolved inside every rank; may use the process group
    def ones(ddp_ctx):
        import torch
        return torch.ones(2) * (ddp_ctx.rank + 1)

    @pytest.mark.ddp(nproc=[1, 2, 4])           # one test per world size: test_sum[nproc=1], ...
    @pytest.mark.parametrize("k", [1, 2])       # parameters and fixtures reach the ranks (pickled)
    def test_sum(ddp_ctx, ones, k, tmp_path):   # tmp_path: one directory for all ranks of the test
        import torch.distributed as dist
        dist.all_reduce(ones)
        n = ddp_ctx.world_size
        assert ones.tolist() == [n * (n + 1) / 2] * 2

    @pytest.mark.ddp(nproc=2, device="gpu")     # skipped, with the reason, on a machine with fewer than 2 GPUs

Marker arguments: `nproc` (a count or a list of counts, default 2), `device` ("cpu", "gpu" or "auto": GPUs when
the machine has enough, else CPU), `timeout` (seconds, default 120: then every rank's stack is shown and the job is
ended), `args` (extra launcher options, e.g. ["--isolation", "node"]; such a test starts its own launcher).

The plugin is registered through the `pytest11` entry point, so installing ddpboot is enough. The ranks of a
session's tests are forked from one warm process that has imported torch and the test files (`--ddp-cold`: a
launcher process per test). Importing this package is light: no torch, no CUDA in the pytest process.
"""

from ddpboot.testing.fixtures import rank_fixture
from ddpboot.testing.plugin import (
    ddp_ctx,
    ddp_nproc,
    pytest_addoption,
    pytest_collection_finish,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
    pytest_pyfunc_call,
    pytest_unconfigure,
)

__all__ = [
    "ddp_ctx",
    "ddp_nproc",
    "pytest_addoption",
    "pytest_collection_finish",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
    "pytest_pyfunc_call",
    "pytest_unconfigure",
    "rank_fixture",
]
