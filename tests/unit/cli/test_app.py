"""The entry point (ddpboot/cli/app.py): a tool when the first argument names one, else a job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddpboot.cli import main


def test_a_tool(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setenv("DDPBOOT_FAKE_GPUS", "4")
    monkeypatch.setenv("DDPBOOT_LOCK_DIR", str(tmp_path))
    with pytest.raises(SystemExit) as done:
        main(["plan", "--nproc", "2", "--json"])
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out)["world_size"] == 2


def test_a_job_errors_as_one_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--dry-run", "--store", "foo", "train.py"])
    assert done.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert err.startswith("ddpboot: error: --store 'foo': choose python") and "Traceback" not in err
