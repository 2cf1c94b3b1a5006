"""The start-up waterfall of real 2-rank gloo jobs: one whose rank 1 spends 8 s in its imports prints one
`ddpboot: start-up` line naming rank 1 and its imports, with every rank's phases in status.json's record; one whose
ranks start alike prints none."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpboot.launch.observe.waterfall import LOSS_MIN, PHASES
from tests.support import SCRIPTS, launch_env, run_launcher

SLOW = str(SCRIPTS / "slow_imports.py")


def _run(tmp_path: Path, *extra: str, **env: str) -> tuple[list[str], str]:
    logs = tmp_path / "logs"
    proc = run_launcher(["--nproc-per-node", "2", "--log-dir", str(logs), "--rdzv-id", "w", *extra, SLOW],
                        launch_env(tmp_path, **env))
    assert proc.returncode == 0, proc.stderr
    return [ln for ln in proc.stderr.splitlines() if ln.startswith("ddpboot: start-up")], proc.stderr


def test_a_rank_slow_in_its_imports_is_named_once(tmp_path: Path) -> None:
    """Rank 1 sleeps before it imports torch. 4 s is plenty where torch's own import takes about as long in every
    rank; on a loaded 2-core machine (the suite's four workers) that import alone varies by several seconds between
    the two ranks, and rank 0, importing while rank 1 sleeps, can take 3 s longer than rank 1 does after it: 8 s keep
    rank 1 past the rule's margin (LOSS_MIN more, LOSS_RATIO times as long) whatever the load."""
    lines, err = _run(tmp_path, SLOW_RANK="1", SLOW_SECONDS="8")
    assert len(lines) == 1, err
    assert lines[0].startswith("ddpboot: start-up ") and ": slowest rank 1: imports " in lines[0], lines
    took, others = (float(x) for x in lines[0].split(": imports ")[1].removesuffix(" s)").split(
        " s (the others at most "))
    assert took >= 8.0 and took - others >= LOSS_MIN, lines


@pytest.mark.parametrize("fast_start", [False, True])
def test_ranks_that_start_alike_print_no_start_up_line(fast_start: bool, tmp_path: Path) -> None:
    lines, err = _run(tmp_path, *(["--fast-start"] if fast_start else []))
    assert lines == [], err


def test_the_phases_of_every_rank_are_in_the_status_file(tmp_path: Path) -> None:
    """status.json is removed at the launcher's end: the rank reads it while the job runs, after its group is up."""
    from ddpboot.launch.observe.status import read_status
    from tests.support import finish, start_launcher, wait_for

    logs = tmp_path / "logs"
    proc = start_launcher(["--nproc-per-node", "2", "--log-dir", str(logs), "--rdzv-id", "s", SLOW],
                          launch_env(tmp_path, SLOW_RANK="none", SLOW_HOLD=str(tmp_path / "release")))
    try:
        def phased() -> object:
            st = read_status(logs / "s")
            return st if st is not None and all(r.phases and "rendezvous" in r.phases for r in st.ranks) else None

        st = wait_for(phased, 120, "both ranks' phases in status.json")
    finally:
        (tmp_path / "release").touch()
    code, _, err = finish(proc)
    assert code == 0, err
    for r in st.ranks:
        assert list(r.phases) == [p for p in PHASES if p in r.phases]
        assert {"python", "imports", "setup", "rendezvous"} <= set(r.phases), r.phases
    raw = json.loads(json.dumps(st.to_json()))
    assert raw["ranks"][0]["phases"] == st.ranks[0].phases


def test_a_forked_rank_s_slow_work_before_its_group_is_its_setup(tmp_path: Path) -> None:
    """Under --fast-start torch is imported before the fork: the same 4 s are the script's own setup."""
    lines, err = _run(tmp_path, "--fast-start", SLOW_RANK="1", SLOW_SECONDS="4")
    assert len(lines) == 1 and ": slowest rank 1: setup " in lines[0], err


def test_top_shows_the_phase_of_a_rank_that_is_still_starting(tmp_path: Path) -> None:
    """While rank 1 sleeps in its imports (20 s here) and rank 0 waits in init_process_group, `ddpboot top --json`
    names each one's phase."""
    from tests.support import clean_env, finish, run_ddpboot, start_launcher, wait_for

    logs = tmp_path / "logs"
    proc = start_launcher(["--nproc-per-node", "2", "--log-dir", str(logs), "--rdzv-id", "p", SLOW],
                          launch_env(tmp_path, SLOW_RANK="1", SLOW_SECONDS="20"))
    try:
        def phases() -> dict[int, str | None] | None:
            got = run_ddpboot("top", str(logs / "p"), "--json", "--interval", "0.2", env=clean_env(), timeout=60)
            if got.returncode != 0:
                return None
            seen = {r["rank"]: r["phase"] for r in json.loads(got.stdout)["ranks"]}
            return seen if seen == {0: "rendezvous", 1: "imports"} else None

        assert wait_for(phases, 60, "rank 0 in its rendezvous, rank 1 in its imports", interval=0.5)
    finally:
        code, _, err = finish(proc)
    assert code == 0, err
