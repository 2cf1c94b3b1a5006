"""`ddpboot top`'s screen, from rows as the sampler makes them: the job's line, one line per rank at 80 columns, the
columns a narrow screen drops first, a bar without its drawn part."""

from __future__ import annotations

import os

from rich.console import Console

from ddpboot.cli.top import compact_bar, render
from ddpboot.launch.observe.sample import build_rows
from ddpboot.launch.observe.status import StatusFile
from tests.unit.launch.observe.statuses import BAR, BEFORE, GPUS, NOW, RANKS, status


def test_a_bar_loses_its_drawn_part_first() -> None:
    assert compact_bar(BAR) == "epoch 2: 57% 570/1000 [01:02<00:47, 9.12it/s]"
    assert compact_bar("step 3 of 9") == "step 3 of 9"


def screen(st: StatusFile, width: int) -> list[str]:
    rows = build_rows(st, BEFORE, NOW, 2.0, GPUS, 1000.0)
    con = Console(width=width, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 (closed with the console)
    con.print(render(st, rows, width, "q to leave"))
    return con.export_text().splitlines()


def test_the_screen_fits_80_columns_one_line_per_rank() -> None:
    lines = screen(status(), 80)
    assert max(len(ln) for ln in lines) <= 80, lines
    assert lines[0].startswith("run job-7 · launcher pid 99 · node 1 (node-a)")
    header = next(ln for ln in lines if ln.startswith("rank"))
    assert all(h in header for h in ("pid", "state", "CPU", "RSS", "GPU", "quiet", "progress")), header
    [rank0] = [ln for ln in lines if ln.startswith("0 ")]
    assert "running" in rank0 and "75%" in rank0 and "2.0G" in rank0 and "0 3.0G 93%" in rank0 and "10s" in rank0
    assert "epoch 2: 57%" in rank0
    assert any("exited 3" in ln for ln in lines) and any("starting" in ln for ln in lines)
    assert "ddpboot: gpu watch: pid 7 is odd" in lines and lines[-1] == "q to leave"


def test_a_narrow_screen_drops_columns_by_priority_never_rank_nor_state() -> None:
    wide = screen(status(), 140)
    narrow = screen(status(), 40)
    assert max(len(ln) for ln in narrow) <= 40, narrow
    assert "node" in next(ln for ln in wide if ln.startswith("rank"))
    header = next(ln for ln in narrow if ln.startswith("rank"))
    assert "state" in header and "progress" in header and "GPU" not in header and "node" not in header


def test_a_job_without_gpus_has_no_gpu_column() -> None:
    from dataclasses import replace

    st = status(tuple(replace(r, gpus=()) for r in RANKS))
    header = next(ln for ln in screen(st, 80) if ln.startswith("rank"))
    assert "GPU" not in header


def test_a_starting_job_shows_each_rank_s_phase_and_a_started_one_no_phase_column() -> None:
    from dataclasses import replace

    starting = status(tuple(replace(r, phase="imports" if r.rank == 0 else None) for r in RANKS))
    lines = screen(starting, 100)
    header = next(ln for ln in lines if ln.startswith("rank"))
    assert "phase" in header, header
    [rank0] = [ln for ln in lines if ln.startswith("0 ")]
    assert "imports" in rank0
    assert "phase" not in next(ln for ln in screen(status(), 100) if ln.startswith("rank"))
    narrow = next(ln for ln in screen(starting, 60) if ln.startswith("rank"))
    assert "phase" in narrow, narrow  # the first column kept as the screen narrows


def test_the_slow_column_only_when_a_rank_is_named_and_kept_first_as_the_width_shrinks() -> None:
    from dataclasses import replace

    assert "slow" not in next(ln for ln in screen(status(), 80) if ln.startswith("rank"))
    st = status((RANKS[0], replace(RANKS[1], straggler="96% vs 16%"), *RANKS[2:]))
    for width in (80, 52):  # at 52 only rank, state, slow and progress fit
        lines = screen(st, width)
        header = next(ln for ln in lines if ln.startswith("rank"))
        assert "slow" in header and ("pid" in header) == (width == 80), lines
        assert "96% vs 16%" in next(ln for ln in lines if ln.startswith("1 ")), lines
