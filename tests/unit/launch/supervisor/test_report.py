"""The failure summary: the root cause, its traceback or last lines, how the other ranks ended, where the logs are."""

from __future__ import annotations

import json
from pathlib import Path

from ddpboot.launch.logs import RankStream
from ddpboot.launch.spec import Std
from ddpboot.launch.supervisor.report import failure_summary
from ddpboot.launch.supervisor.workers import AttemptResult, Worker
from ddpboot.selection.planner import RankSlot
from tests.unit.launch.observe.stacks.flight_dumps import dump, entry, write


def worker(rank: int, status: int | None, tmp_path: Path) -> Worker:
    slot = RankSlot(rank=rank, local_rank=rank, gpus=(), cuda_visible_devices="", device="cpu")
    return Worker(slot, ["python3", "-u", "train.py", "--x", "a b"], {}, tmp_path / f"rank{rank}.error.json",
                  RankStream(rank, Std.OUT, None, None), RankStream(rank, Std.ERR, None, None),
                  pid=100 + rank, started=1.0, ended=3.5, status=status)


def test_the_summary_names_the_root_cause_and_shows_its_last_stderr_lines(tmp_path: Path) -> None:
    root = worker(1, 7 << 8, tmp_path)
    root.err.feed(b"loading\nValueError: bad\n")
    other = worker(0, 15, tmp_path)
    other.signalled = ["SIGTERM (rank 1 failed)", "SIGTERM (rank 1 failed)"]
    text = failure_summary(AttemptResult(7, root, workers=[other, root]), 1, 3, tmp_path / "attempt_1")
    assert text.splitlines() == [
        "ddpboot: rank 1 failed on attempt 1 (2 restarts left): exit code 7",
        "  local rank 1 · CPU · pid 101 · ran 2.50 s",
        "  command: python3 -u train.py --x 'a b'",
        "  last lines of its stderr:",
        "  | loading",
        "  | ValueError: bad",
        "  other ranks: rank 0: killed by SIGTERM (exit code 143) after SIGTERM (rank 1 failed)",
        f"  logs: {tmp_path / 'attempt_1'}",
    ]


def test_a_recorded_traceback_comes_first_and_silence_is_said(tmp_path: Path) -> None:
    root = worker(0, 1 << 8, tmp_path)
    root.error_file.write_text(json.dumps({"message": {"message": "x", "extraInfo": {"py_callstack": "Trace\nboom"}}}))
    text = failure_summary(AttemptResult(1, root, workers=[root]), 0, 0, None)
    assert "ddpboot: rank 0 failed: exit code 1" in text
    assert "  traceback (recorded by @record in TORCHELASTIC_ERROR_FILE):\n  | Trace\n  | boom" in text
    assert "logs:" not in text and "other ranks" not in text
    silent = worker(0, 1 << 8, tmp_path / "none")
    assert "  it printed nothing." in failure_summary(AttemptResult(1, silent, workers=[silent]), 0, 0, None)


def test_rank_isolation_hides_gpus_only_when_ranks_see_fewer_than_selected() -> None:
    from ddpboot.launch.supervisor.report import no_join_report, rank_isolated_gpus
    from ddpboot.selection.inventory import fake_inventory
    from ddpboot.selection.planner import make_plan
    from ddpboot.selection.request import parse_request

    def plan(**options: object) -> object:
        return make_plan(parse_request(**options), fake_inventory("4"), {}, cpu_count=8)  # type: ignore[arg-type]

    assert rank_isolated_gpus(plan(nproc="2"))  # type: ignore[arg-type]
    assert rank_isolated_gpus(plan(nproc="2", gpus_per_proc=2))  # type: ignore[arg-type]
    assert not rank_isolated_gpus(plan(nproc="2", isolation="node"))  # type: ignore[arg-type]
    assert not rank_isolated_gpus(plan(nproc="1"))  # type: ignore[arg-type]
    assert not rank_isolated_gpus(plan(nproc="2", cpu=True))  # type: ignore[arg-type]
    text = no_join_report(plan(nproc="2", gpus_per_proc=2))  # type: ignore[arg-type]
    assert "returns 2 in every rank, not 4" in text and "its own GPUs" in text and "all 4 selected" in text


def test_ranks_that_exited_0_while_the_job_failed_are_named_with_how_long_before(tmp_path: Path) -> None:
    root = worker(0, 1 << 8, tmp_path)
    early, late, running = worker(1, 0, tmp_path), worker(2, 0, tmp_path), worker(3, None, tmp_path)
    early.ended, late.ended = 2.25, 4.0
    text = failure_summary(AttemptResult(1, root, workers=[root, early, late, running]), 0, 0, None)
    [note] = [ln for ln in text.splitlines() if ln.startswith("  note:")]
    assert note.startswith("  note: ranks 1, 2 exited 0, 1.25 s before rank 0 failed, while the job failed.")
    assert note.endswith("look at why ranks 1, 2 ended first.")
    killed = worker(1, 15, tmp_path)
    assert "note:" not in failure_summary(AttemptResult(1, root, workers=[root, killed, running]), 0, 0, None)


def test_the_flight_recorder_s_dumps_add_a_verdict_post_mortem(tmp_path: Path) -> None:
    attempt = tmp_path / "attempt_0"
    attempt.mkdir()
    root = worker(0, 6 << 8, tmp_path)
    assert "verdict" not in failure_summary(AttemptResult(1, root, workers=[root]), 0, 0, attempt)
    write(attempt, 0, dump([entry(0, 1, line=4), entry(1, 2, state="started", line=5)]))
    write(attempt, 1, dump([entry(0, 1, line=4)]))
    last = failure_summary(AttemptResult(1, root, workers=[root]), 0, 0, attempt).splitlines()[-1]
    assert last == ("ddpboot: verdict: flight recorder: rank 1 is behind in process group 0 (default_pg): its last "
                    "collective is all_reduce #1 at job.py:4 (completed); rank 0 is at all_reduce #2 at job.py:5 "
                    "(not completed); rank 1 never called all_reduce #2: look at rank 1")
