"""The pytest plugin `ddpboot.testing`: a marked test runs on N ranks through the launcher (pytester)."""

from __future__ import annotations

import pytest

from ddpboot.selection.inventory import load_inventory

pytest_plugins = ["pytester"]


def test_ranks_pass_and_fail_with_their_tracebacks(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_ddp="""
        import pytest


        @pytest.mark.ddp(nproc=2)
        def test_all_reduce(ddp_ctx):
            import torch
            import torch.distributed as dist

            t = torch.ones(1) * (ddp_ctx.rank + 1)
            dist.all_reduce(t)
            assert t.item() == 3
            assert ddp_ctx.world_size == 2


        @pytest.mark.ddp(nproc=2)
        def test_rank1_fails():
            import os

            assert os.environ["RANK"] != "1", "rank one disagrees"


        @pytest.mark.ddp(nproc=2, device="gpu")
        def test_needs_gpus():
            pass
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "--timeout", "240")
    gpus = len(load_inventory().units())
    expect = ["*1 of 2 ranks failed*", "*--- rank 1 failed ---*", "*AssertionError: rank one disagrees*"]
    if gpus >= 2:
        result.assert_outcomes(passed=2, failed=1)
    else:
        result.assert_outcomes(passed=1, failed=1, skipped=1)
        expect.append(f"*needs 2 GPUs for 2 ranks; this machine has {gpus}*")
    result.stdout.fnmatch_lines(expect)
    assert "--- rank 0 failed ---" not in result.stdout.str()
