"""The pytest plugin `ddpboot.testing` as a CI suite uses it (pytester, real launcher, real gloo groups): parameters
and fixtures reaching the ranks, rank fixtures, world-size matrices, rewritten assertions, a hanging rank's stack,
warm ranks, the per-test launcher (`args`), and pytest-xdist."""

from __future__ import annotations

import contextlib
import uuid

import psutil
import pytest

pytest_plugins = ["pytester"]
TAG_VAR = "TESTING_PLUGIN_SESSION_TAG"

CONFTEST = """
import pytest
from ddpboot.testing import rank_fixture


@rank_fixture
def group_sum(ddp_ctx, tmp_path):
    import torch
    import torch.distributed as dist

    t = torch.ones(1) * (ddp_ctx.rank + 1)
    dist.all_reduce(t)
    yield t.item()
    (tmp_path / f"teardown{ddp_ctx.rank}").write_text("done")
"""

SUITE = """
import os
import threading

import pytest

BIG = 16 * len(os.sched_getaffinity(0)) + 1  # more CPU ranks than the launcher allows on this machine


@pytest.mark.ddp(nproc=2)
@pytest.mark.parametrize("k", [3, 5])
def test_param_and_shared_tmp_path(ddp_ctx, k, tmp_path):
    import torch.distributed as dist

    (tmp_path / f"rank{ddp_ctx.rank}").write_text(str(k))
    dist.barrier()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("rank")) == ["rank0", "rank1"]
    assert {p.read_text() for p in tmp_path.iterdir()} == {str(k)}


@pytest.mark.ddp(nproc=2)
def test_rank_fixture(group_sum, ddp_ctx):
    assert group_sum == 3


def test_rank_fixture_teardown_ran(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    assert sorted(p.name for p in base.glob("test_rank_fixture0/teardown*")) == ["teardown0", "teardown1"]


@pytest.mark.ddp(nproc=[1, 3, BIG])
def test_sizes(ddp_ctx, ddp_nproc):
    assert ddp_ctx.world_size == ddp_nproc


@pytest.fixture
def lock():
    return threading.Lock()


@pytest.mark.ddp(nproc=2)
def test_unpicklable(lock):
    pass


@pytest.mark.ddp(nproc=2)
def test_rank1_fails(ddp_ctx):
    got = [7, ddp_ctx.rank]
    assert got == [7, 0]


@pytest.mark.ddp(nproc=2, timeout=4)
def test_hang(ddp_ctx):
    import time

    import torch.distributed as dist

    if ddp_ctx.rank == 1:
        while True:
            time.sleep(0.05)
    dist.barrier()


class TestInAClass:
    @pytest.mark.ddp(nproc=2)
    def test_method(self, ddp_ctx):
        assert ddp_ctx.world_size == 2


@pytest.mark.ddp(nproc=2, args=["--isolation", "node"])
def test_own_launcher(ddp_ctx):
    assert os.environ["DDPBOOT_ISOLATION"] == "node"
"""


def _left_behind(tag: str) -> list[str]:
    """Processes that carry this session's tag in their environment (warm process, zygote, launchers, ranks)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error):
            if p.environ().get(TAG_VAR) == tag:
                out.append(f"{p.info['pid']}: {' '.join(p.info['cmdline'] or [])}")
    return out


def test_a_suite_as_ci_writes_it(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_VAR, tag)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "-v", "--timeout", "240",
                                           "-p", "no:randomly")
    out = result.stdout.str()
    result.assert_outcomes(passed=8, failed=3, skipped=1)
    result.stdout.fnmatch_lines_random([
        "*test_param_and_shared_tmp_path?3? PASSED*",
        "*test_param_and_shared_tmp_path?5? PASSED*",
        "*test_sizes?nproc=1? PASSED*",
        "*test_sizes?nproc=3? PASSED*",
        "*test_sizes?nproc=* SKIPPED*",
        "*test_own_launcher PASSED*",
        "*TestInAClass::test_method PASSED*",
        "*test_rank_fixture_teardown_ran PASSED*",
        "*needs * CPU ranks, more than 16 per core*",
        # a value that cannot be pickled is named, with what to do
        "*the value of 'lock' cannot be sent to the ranks: TypeError*@ddpboot.testing.rank_fixture*",
        # the failing rank's assertion, rewritten by pytest, prefixed by its rank; the head says which rank failed
        "*rank 1 of 2 failed (launcher exit code 1)*",
        "*[[]rank 1[]] AssertionError: assert [[]7, 1[]] == [[]7, 0[]]*",
        # the hanging test: every rank's stack, where it was
        "*timeout: the 2-rank run did not finish within 4 s*",
        "*--- rank 0 stack at the timeout ---*",
        "*[[]rank 0[]]*in barrier*",
        "*--- rank 1 stack at the timeout ---*",
        "*[[]rank 1[]]*test_suite.py*in test_hang*",
    ])
    assert "--- rank 0 failed ---" not in out.split("test_rank1_fails")[-1].split("test_hang")[0]
    assert not _left_behind(tag), "processes of the session outlived it"


def test_xdist_two_workers(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_x="""
        import pytest


        @pytest.mark.ddp(nproc=2)
        @pytest.mark.parametrize("i", range(4))
        def test_sum(ddp_ctx, i, tmp_path):
            import os

            import torch
            import torch.distributed as dist

            t = torch.ones(1) * (ddp_ctx.rank + i)
            dist.all_reduce(t)
            assert t.item() == 1 + 2 * i
            worker = os.environ["PYTEST_XDIST_WORKER"]
            (tmp_path.parent.parent / f"{worker}-{i}-{ddp_ctx.rank}").write_text("")  # beside the workers' temps
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--timeout", "240")
    result.assert_outcomes(passed=4)
    ran = {p.name.split("-")[0] for p in pytester.path.glob("runpytest-*/gw*-*")}
    assert ran == {"gw0", "gw1"}, "both workers ran ddp tests, each with its own warm process and launchers"


def test_a_cpu_test_reads_no_gpu(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that asked for CPU ranks never reads the machine's GPUs: a simulated inventory that fails whoever reads
    it (a file that is not there) stops nothing but a test that may use GPUs."""
    monkeypatch.setenv("DDPBOOT_FAKE_GPUS", str(pytester.path / "no-such-inventory.json"))
    pytester.makepyfile(test_cpu="""
        import os

        import pytest


        @pytest.mark.ddp(nproc=2)
        @pytest.mark.parametrize("i", range(2))
        def test_sum(ddp_ctx, i):
            import torch
            import torch.distributed as dist

            t = torch.ones(1) * (ddp_ctx.rank + i)
            dist.all_reduce(t)
            assert t.item() == 1 + 2 * i and os.environ["CUDA_VISIBLE_DEVICES"] == ""
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--timeout", "240")
    result.assert_outcomes(passed=2)
    pytester.makepyfile(test_cpu="""
        import pytest


        @pytest.mark.ddp(nproc=1, device="auto")
        def test_may_use_a_gpu(ddp_ctx):
            pass
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--timeout", "240")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*no-such-inventory.json* is neither a GPU count nor a readable JSON file*"])
