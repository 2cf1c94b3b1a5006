"""The launcher reads the script's source for GPU counting, which rank isolation changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddpboot.launch.source_checks import device_count_checks, isolation_note, script_file
from ddpboot.launch.spec import Target
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.planner import make_plan
from ddpboot.selection.request import parse_request

COUNTING = """import torch
# torch.cuda.device_count() in a comment does not count
if torch.cuda.device_count() < 2:  # the check
    exit()
n = torch.accelerator.device_count()
"""


def test_device_count_calls_are_found_with_their_lines() -> None:
    assert device_count_checks(COUNTING) == [(3, "if torch.cuda.device_count() < 2:"),
                                             (5, "n = torch.accelerator.device_count()")]
    assert device_count_checks("import torch\nprint(torch.cuda.is_available())\n") == []


def plan_for(gpus: int, **options: str | int) -> object:
    return make_plan(parse_request(**options), fake_inventory(str(gpus)), {}, cpu_count=16)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"nproc": "2"}, "so that count is 1 in every rank, not 2"),
        ({"nproc": "2", "gpus_per_proc": 2}, "only its own 2 GPUs, so that count is 2 in every rank, not 4"),
        ({"nproc": "2", "isolation": "node"}, None),  # every rank sees both
        ({"nproc": "1"}, None),  # one GPU either way
        ({"nproc": "2", "cpu": True}, None),  # CPU ranks count no GPU
    ],
)
def test_the_note_names_the_line_and_what_each_rank_will_see(
    tmp_path: Path, options: dict[str, str | int], says: str | None
) -> None:
    (tmp_path / "train.py").write_text(COUNTING)
    note = isolation_note(plan_for(4, **options), Target("script", "train.py", ()), tmp_path)  # type: ignore[arg-type]
    if says is None:
        assert note is None
    else:
        assert note is not None and note.startswith("train.py:3 counts GPUs (`if torch.cuda.device_count() < 2:`)")
        assert says in note and "--isolation node" in note


def test_no_note_for_a_script_that_does_not_count(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\n")
    assert isolation_note(plan_for(2, nproc="2"), Target("script", "train.py", ()), tmp_path) is None  # type: ignore[arg-type]


def test_script_file_follows_what_python_runs(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    assert script_file(Target("script", "pkg", ()), tmp_path) == tmp_path / "pkg" / "__main__.py"
    assert script_file(Target("run_path", str(tmp_path / "t.py"), ()), Path("/")) == tmp_path / "t.py"
    assert script_file(Target("module", "pkg.train", ()), tmp_path) is None
    assert script_file(Target("binary", "/bin/true", ()), tmp_path) is None
