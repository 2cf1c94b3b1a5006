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


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


@pytest.mark.parametrize("tool", ["plan", "gpus", "smoke"])
def test_every_tool_takes_dash_h(tool: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_main([tool, "-h"], capsys)
    assert code == 0 and f"Usage: ddpboot {tool}" in out


def _panels(out: str) -> list[str]:
    return [line.split("─ ")[1].split(" ─")[0] for line in out.splitlines() if line.startswith("╭─ ")]


def test_the_help_lists_the_tools_and_puts_gpu_selection_first(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main(["--help"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert all(f"│ ddpboot {tool} " in out for tool in ("plan", "gpus", "smoke", "stacks", "top", "warm"))
    panels = _panels(out)
    assert panels[:2] == ["GPU selection", "Arguments"] and panels[-2:] == ["Options", "Commands"]
    assert {"More GPU selection", "Job", "Multi-node", "Supervision", "Logs", "torchrun compatibility"} <= set(panels)
    first = {name: next(i for i, line in enumerate(lines) if f"│ {name} " in line)
             for name in ("--nproc", "--gpus", "--exclude", "--cpu", "--isolation")}
    assert max(first.values()) < 24, first  # the first screen of a 24-line terminal
    assert "SIGUS R1" not in out and "--master- addr" not in out


@pytest.mark.parametrize("command", [[], ["plan"], ["gpus"], ["smoke"], ["stacks"]])
def test_the_help_fits_80_columns_and_cuts_no_name(
    command: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from typer.main import get_command

    from ddpboot.cli.run import run_app
    from ddpboot.cli.tools import tools

    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_main([*command, "--help"], capsys)
    assert code == 0
    assert all(len(line) <= 80 for line in out.splitlines())
    assert "…" not in out and not any(t in out for t in ("<bool>", "<str>", "<int>", "<list[str]>", "<float>"))
    click_command = get_command(tools).commands[command[0]] if command else get_command(run_app)  # type: ignore[attr-defined]
    cells = [line.split("│")[1].strip().split("  ")[0] for line in out.splitlines() if line.startswith("│ -")]
    names = [token for cell in cells for token in cell.replace(",", " ").split()]
    for param in click_command.params:
        long = [o for o in param.opts if o.startswith("--")][:1]
        if param.param_type_name == "option" and not param.hidden and long:
            assert long[0] in names or f"{long[0]}/{param.secondary_opts[0]}" in names, long


def test_aliases_and_defaults_are_in_the_text(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    _, out, _ = run_main(["--help"], capsys)
    text = " ".join(out.replace("│", " ").split())
    nproc = text[text.index("--nproc N|gpu|auto|cpu") : text.index("--gpus LIST")]
    assert nproc.endswith("[also --nproc-per-node; env PET_NPROC_PER_NODE] ") and "--nproc_per_node" not in nproc
    assert "spellings with underscores (--nproc_per_node, --node_rank and the others) are accepted too" in text
    isolation = text[text.index("--isolation rank|node") : text.index("--cpu ")]
    assert isolation.endswith("[default rank; env DDPBOOT_ISOLATION_MODE] ")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from ddpboot import __version__

    code, out, err = run_main(["--version"], capsys)
    assert code == 0 and out.strip() == f"ddpboot {__version__}" and not err


@pytest.mark.parametrize(
    ("args", "start"),
    [
        (["--max-util", "x", "train.py"], "ddpboot: error: Invalid value for '--max-util'"),
        (["--nprocs", "2", "train.py"], "ddpboot: error: No such option: --nprocs"),
        (["plan", "--log-dir", "x"], "ddpboot: error: No such option: --log-dir"),
        (["-np", "2", "train.py"], "ddpboot: error: No such option: -np. mpirun's -np is --nproc N here"),
        (["-n", "2", "train.py"], "ddpboot: error: No such option: -n. mpirun's and srun's -n is --nproc N here"),
        (["plan", "-np2"], "ddpboot: error: No such option: -np2. mpirun's -np is --nproc N here"),
        (["--num_gpus", "2", "train.py"], "ddpboot: error: No such option: --num_gpus. DeepSpeed's --num_gpus is"),
        (["--use-env", "train.py"], "ddpboot: error: No such option: --use-env. torch.distributed.launch's"),
        (["smoke", "--checks", "all_reduce,", "ddp"],
         "ddpboot: error: Got unexpected extra argument(s) (ddp): all_reduce, ddp is one list split by a space"),
    ],
)
def test_a_mistyped_option_is_one_error_line(args: list[str], start: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(args, capsys)
    assert code == 2 and err.startswith(start) and len(err.strip().splitlines()) == 1, err
    assert any(f"`ddpboot {tool}-h`" in err for tool in ("", "plan ", "smoke "))


@pytest.mark.parametrize(
    ("option", "instead"),
    [
        ("--numa-binding", "--cpu-affinity"),
        ("--logs-specs", "--log-dir"),
        ("--event-log-handler", "stderr"),
        ("--duplicate-stdout-filters", "--log-dir"),
        ("--duplicate_stderr_filters", "--log-dir"),
    ],
)
def test_refused_torchrun_options_are_named(option: str, instead: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(["--dry-run", option, "x", "train.py"], capsys)
    assert code == 2 and err.startswith(f"ddpboot: error: {option.replace('_', '-')} x:") and instead in err


def test_a_bad_junit_path_fails_before_the_smoke_test(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import ddpboot.smoke

    def started(*_args: object) -> None:
        raise AssertionError("the smoke test ran")

    monkeypatch.setattr(ddpboot.smoke, "run_smoke", started)
    monkeypatch.setenv("DDPBOOT_FAKE_GPUS", "2")
    for path in (tmp_path, tmp_path / "missing" / "r.xml"):
        code, _, err = run_main(["smoke", "--nproc", "2", "--junit-xml", str(path)], capsys)
        assert code == 2 and err.startswith(f"ddpboot: error: --junit-xml {path}:"), err
