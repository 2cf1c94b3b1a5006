"""Rank isolation's one trap is reported, never silent: a script that counts GPUs sees only its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import SCRIPTS, clean_env, run_launcher

COUNT_GPUS = str(SCRIPTS / "count_gpus.py")


@pytest.mark.parametrize(
    ("args", "told"),
    [
        (["--nproc", "2"], True),
        (["--nproc", "2", "--isolation", "node"], False),
        (["--nproc", "2", "--cpu"], False),
        (["--nproc", "1"], False),
    ],
)
def test_a_script_that_counts_gpus_hears_what_rank_isolation_shows_it(
    tmp_path: Path, args: list[str], told: bool
) -> None:
    res = run_launcher([*args, COUNT_GPUS], clean_env(DDPBOOT_FAKE_GPUS="2", TMPDIR=str(tmp_path)))
    assert res.returncode == 0, res.stderr
    note = [line for line in res.stderr.splitlines() if "counts GPUs" in line]
    if told:
        assert len(note) == 1, res.stderr
        assert "count_gpus.py:13" in note[0] and "is 1 in every rank, not 2" in note[0]
        assert "--isolation node" in note[0]
    else:
        assert note == [], res.stderr


@pytest.mark.parametrize(
    ("args", "extra", "warned"),
    [
        (["--nproc", "2"], {"COUNT_FOR_REAL": "1"}, True),  # counts 0 (CPU torch) < 2: leaves without joining
        (["--nproc", "2"], {"JOIN": "1"}, False),  # joins the process group
        (["--nproc", "2", "--isolation", "node"], {"COUNT_FOR_REAL": "1"}, False),  # sees every GPU: not the trap
        (["--nproc", "2", "--cpu"], {"COUNT_FOR_REAL": "1"}, False),  # no GPUs hidden from anyone
    ],
)
def test_a_job_in_which_no_rank_joined_is_reported_after_it_ends(
    tmp_path: Path, args: list[str], extra: dict[str, str], warned: bool
) -> None:
    res = run_launcher([*args, COUNT_GPUS], clean_env(DDPBOOT_FAKE_GPUS="2", TMPDIR=str(tmp_path), **extra))
    assert res.returncode == 0, res.stderr  # the exit code stays the ranks'
    warning = [line for line in res.stderr.splitlines() if "no rank joined the job" in line]
    if warned:
        assert len(warning) == 1, res.stderr
        assert "torch.cuda.device_count() returns 1 in every rank, not 2" in res.stderr
        assert "--isolation node" in res.stderr
    else:
        assert warning == [], res.stderr
