"""The job a rank receives and the report a failing job becomes."""

from __future__ import annotations

import pickle
import threading
from pathlib import Path

import pytest

from ddpboot.testing.fixtures import RankFixtureRef
from ddpboot.testing.job import (
    NotPicklable,
    RankResult,
    failure_report,
    make_job,
    read_job,
    read_results,
    write_job,
    write_result,
)


def test_arguments_travel_pickled_without_the_context(tmp_path: Path) -> None:
    ref = RankFixtureRef("/x/conftest.py", "conftest", "model", {"tmp_path": tmp_path})
    job = make_job("/x/test_a.py", "test_a", "test_f", {"k": 3, "tmp_path": tmp_path, "model": ref,
                                                         "ddp_ctx": None}, 10.0)
    write_job(job, tmp_path)
    back = read_job(tmp_path)
    assert back == job
    assert pickle.loads(back.kwargs) == {"k": 3, "tmp_path": tmp_path, "model": ref}


def test_an_unpicklable_value_is_named() -> None:
    with pytest.raises(NotPicklable) as err:
        make_job("/x/test_a.py", "test_a", "test_f", {"k": 1, "lock": threading.Lock()}, 10.0)
    assert "the value of 'lock' cannot be sent to the ranks" in str(err.value)
    assert "@ddpboot.testing.rank_fixture" in str(err.value)


def test_results_missing_rank_counts_as_failed(tmp_path: Path) -> None:
    write_result(tmp_path, RankResult(0, True))
    (tmp_path / "rank1.stacks").write_text('Thread 0x1:\n  File "/t/test_a.py", line 3 in test_f\n'
                                           '  File "/d/ddpboot/launch/faststart/zygote.py", line 9 in main\n')
    results = read_results(tmp_path, 2)
    assert [r.passed for r in results] == [True, False]
    report = failure_report(results, 1, "launcher says", 5.0)
    assert report is not None
    assert report.splitlines()[0] == "timeout: the 2-rank run did not finish within 5 s; rank 1 had not passed"
    assert '[rank 1]   File "/t/test_a.py", line 3 in test_f' in report
    assert "zygote.py" not in report


def test_report_names_the_failing_ranks() -> None:
    ok, bad = RankResult(0, True), RankResult(1, False, "Traceback\nAssertionError: assert 1 == 2\n")
    assert failure_report([ok, RankResult(1, True)], 0, "", None) is None
    report = failure_report([ok, bad], 1, "", None)
    assert report == ("rank 1 of 2 failed (launcher exit code 1)\n--- rank 1 failed ---\n[rank 1] Traceback\n"
                      "[rank 1] AssertionError: assert 1 == 2")
    crashed = failure_report([ok, RankResult(1, False)], 137, "rank 1 was killed", None)
    assert crashed is not None and crashed.endswith("launcher output:\nrank 1 was killed")
    assert failure_report([ok], 2, "ddpboot: error: x", None) == (
        "every rank passed but the launcher exited with code 2\nlauncher output:\nddpboot: error: x")
