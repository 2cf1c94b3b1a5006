"""What the tools print (ddpboot/cli/render.py)."""

from __future__ import annotations

import pytest

from ddpboot.cli.render import render_dry_run, render_plan, short_uuid
from ddpboot.launch.spec import LaunchSpec, Target
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.planner import Plan, make_plan
from ddpboot.selection.request import parse_request


def plan(**req: object) -> Plan:
    return make_plan(parse_request(**req), fake_inventory("4"), {}, cpu_count=8)  # type: ignore[arg-type]


def test_uuids_are_cut_to_a_column() -> None:
    assert short_uuid("GPU-0123456789abcdef") == "GPU-01234567…"
    assert short_uuid("GPU-01234567") == "GPU-01234567"


def test_the_plan_table_says_what_cuda_0_is(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    render_plan(plan(gpus="3,1"))
    out = capsys.readouterr().out
    assert "world size 2 · 1 node (this is node 0)" in out
    rows = [line for line in out.splitlines() if "cuda:0 = GPU" in line]
    assert "cuda:0 = GPU 3" in rows[0] and "cuda:0 = GPU 1" in rows[1]


def test_a_dry_run_shows_each_command_and_what_it_changes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    spec = LaunchSpec(Target("script", "train.py", ("--lr", "0.1")), "/usr/bin/python3", "run-1")
    render_dry_run(plan(nproc="2"), spec, {"RANK": "9"})
    out = capsys.readouterr().out
    assert "store: python server on 127.0.0.1:<a free port bound at launch>" in out
    assert "rank 1 (local rank 1): /usr/bin/python3 -u train.py --lr 0.1" in out
    assert "  RANK=1  (was '9')" in out and "  MASTER_PORT='<port bound at launch>'" in out
