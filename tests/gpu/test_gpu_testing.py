"""The pytest plugin's GPU variants on real GPUs (nccl): `device="gpu"` tests on 1 and 2 GPUs, warm ranks, each rank
on a GPU of its own, a failing rank's rewritten assertion, and two xdist workers whose GPU tests never share a GPU.

    OUT=/tmp/out python3 -m pytest -q -m gpu tests/gpu/test_gpu_testing.py

The inner pytest sessions' output goes to $OUT (when set) as testing-<name>.log. They find the plugin through the
package's pytest11 entry point: install ddpboot (`pip install -e .`) before running this file; with PYTHONPATH alone
their `ddp_ctx` fixture is missing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support import gpu_count

pytestmark = pytest.mark.gpu
pytest_plugins = ["pytester"]

SUITE = """
import json
import os
import time

import pytest


@pytest.mark.ddp(nproc=[1, 2], device="gpu", timeout=120)
@pytest.mark.parametrize("k", [1, 2])
def test_nccl_all_reduce(ddp_ctx, ddp_nproc, k, tmp_path):
    import torch
    import torch.distributed as dist

    assert dist.get_backend() == "nccl"
    assert torch.cuda.device_count() == 1  # rank isolation: each rank sees its own GPU only
    t = torch.full((1024,), float(k), device=ddp_ctx.device)
    dist.all_reduce(t)
    assert t[0].item() == k * ddp_nproc
    uuid = os.environ["CUDA_VISIBLE_DEVICES"]
    (tmp_path / f"rank{ddp_ctx.rank}").write_text(json.dumps([uuid, time.time()]))
    dist.barrier()
    uuids = [json.loads(p.read_text())[0] for p in tmp_path.glob("rank*")]
    assert len(set(uuids)) == ddp_nproc


@pytest.mark.ddp(nproc=2, device="gpu")
def test_rank1_fails(ddp_ctx):
    import torch

    got = torch.ones(2, device=ddp_ctx.device).sum().item() + ddp_ctx.rank
    assert got == 2.0
"""

XDIST_SUITE = """
import fcntl
import os

import pytest


@pytest.mark.ddp(nproc=2, device="gpu", timeout=300)
@pytest.mark.parametrize("i", range(4))
def test_gpus_are_mine(ddp_ctx, i, tmp_path_factory):
    import torch
    import torch.distributed as dist

    # A flag file per GPU, held for the test's length: a GPU used by two tests at once would be caught here.
    path = os.path.join(os.environ["GPU_FLAGS"], os.environ["CUDA_VISIBLE_DEVICES"])
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if another test holds this GPU now
    t = torch.ones(1 << 20, device=ddp_ctx.device)
    for _ in range(20):
        dist.all_reduce(t)
    torch.cuda.synchronize()
    os.close(fd)
"""


def _timeout(seconds: int) -> list[str]:
    """pytest-timeout's option where it is installed (a bare GPU machine may lack it)."""
    try:
        import pytest_timeout  # noqa: F401
    except ImportError:
        return []
    return ["--timeout", str(seconds)]


def _keep(name: str, text: str) -> None:
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"testing-{name}.log").write_text(text)


def test_gpu_tests_on_one_and_two_gpus(pytester: pytest.Pytester) -> None:
    gpus = gpu_count()
    if gpus < 1:
        pytest.skip("needs a GPU")
    pytester.makepyfile(test_gpu_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v", "-rs", *_timeout(600))
    _keep("one-and-two", result.stdout.str() + result.stderr.str())
    if gpus >= 2:
        result.assert_outcomes(passed=4, failed=1)
        result.stdout.fnmatch_lines(["*rank 1 of 2 failed*", "*[[]rank 1[]] AssertionError: assert 3.0 == 2.0*"])
    else:
        result.assert_outcomes(passed=2, skipped=3)
        result.stdout.fnmatch_lines(["*needs 2 GPUs for 2 ranks; this machine has 1*"])


def test_xdist_workers_never_share_a_gpu(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    if gpu_count() < 2:
        pytest.skip("needs 2 GPUs")
    pytester.makepyfile(test_xdist_gpus=XDIST_SUITE)
    flags = tmp_path / "flags"
    flags.mkdir()
    os.environ["GPU_FLAGS"] = str(flags)
    try:
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "-v", *_timeout(900))
    finally:
        del os.environ["GPU_FLAGS"]
    _keep("xdist", result.stdout.str() + result.stderr.str())
    result.assert_outcomes(passed=4)
