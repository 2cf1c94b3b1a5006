"""What a new user reads first, through the real console script at a fixed terminal width: `ddpboot plan`,
`ddpboot gpus` and `ddpboot -h` fit 80 columns with 0, 1 and 8 (simulated) GPUs, `--wide` shows what the footnote
promises, a machine without a driver is explained once, and other launchers' habits (`-np 2`) get ddpboot's option.
The command line starts without torch, so each run is a fraction of a second.
"""

from __future__ import annotations

import json

import pytest

from tests.support import REPO, clean_env, run_ddpboot

COLUMNS = 80


def at_80(*args: str, gpus: str | None = "8", **extra: str) -> tuple[int, str, str]:
    env = clean_env(COLUMNS=str(COLUMNS), **extra)
    if gpus is not None:
        env["DDPBOOT_FAKE_GPUS"] = gpus
    done = run_ddpboot(*args, env=env, timeout=60, cwd=REPO)
    return done.returncode, done.stdout, done.stderr


def too_wide(text: str) -> list[str]:
    return [line for line in text.splitlines() if len(line) > COLUMNS]


@pytest.mark.parametrize("gpus", ["0", "1", "8"])
def test_plan_and_gpus_fit_80_columns(gpus: str) -> None:
    for args in (["plan", "--nproc", "auto"], ["plan", "--nproc", "auto", "--wide"], ["gpus"], ["gpus", "--wide"]):
        code, out, err = at_80(*args, gpus=gpus)
        assert code == 0, err
        assert not too_wide(out), (args, too_wide(out))
        if args[0] == "plan":  # the first line was 148 characters whatever the width
            assert out.splitlines()[0].startswith("world size "), out


def test_wide_shows_full_uuids_and_bus_ids_at_80_columns() -> None:
    _, plan_json, _ = at_80("plan", "--nproc", "2", "--json")
    gpus = [slot["gpus"][0] for slot in json.loads(plan_json)["ranks"]]
    _, wide, _ = at_80("plan", "--nproc", "2", "--wide")
    for gpu in gpus:
        assert gpu["uuid"] in wide and gpu["pci_bus_id"] in wide, wide
    _, narrow, _ = at_80("gpus")
    _, every, _ = at_80("gpus", "--wide")
    headers = [h.strip() for h in next(line for line in narrow.splitlines() if "┃" in line).split("┃")]
    assert all(header in every for header in headers) and "PCI bus id" in every and "name" in every, every


def test_the_help_fits_80_columns_with_the_first_options_first() -> None:
    code, out, _ = at_80("-h")
    assert code == 0 and not too_wide(out), too_wide(out)
    lines = out.splitlines()
    for name in ("--nproc N|gpu|auto|cpu", "--gpus LIST", "--exclude LIST", "--cpu ", "--log-dir DIR"):
        assert any(name in line for line in lines[:24]), (name, lines[:24])
    assert "…" not in out and "<bool>" not in out and "<list[str]>" not in out


@pytest.mark.parametrize("tool", [None, "plan", "smoke"])
def test_dash_h_fits_one_screen_and_dash_dash_help_has_every_option(tool: str | None) -> None:
    """-h is the summary (at most 60 lines at 80 columns: the first options, the subcommands, where to read
    more), --help the whole reference: every option the command declares, each default said once."""
    from typer.main import get_command

    from ddpboot.cli.run import run_app
    from ddpboot.cli.tools import TOOLS, tools

    command = get_command(run_app) if tool is None else get_command(tools).commands[tool]  # type: ignore[attr-defined]
    first = [tool] if tool else []
    _, brief, _ = at_80(*first, "-h")
    code, full, _ = at_80(*first, "--help")
    assert code == 0 and len(brief.splitlines()) <= 60 and not too_wide(brief), brief
    assert f"ddpboot {tool + ' ' if tool else ''}--help` shows every option" in " ".join(brief.split()), brief
    if tool is None:
        assert all(f"ddpboot {name} " in brief and f"ddpboot {name} " in full for name in TOOLS), brief
    options = [o for p in command.params if p.param_type_name == "option" and not p.hidden for o in p.opts
               if "_" not in o]
    missing = [o for o in options if o not in full]
    assert not missing and len(full.splitlines()) > 60, missing
    text = " ".join(full.split())
    assert "Default warn. [default warn]" not in text and "Default 5. [default 5]" not in text


def test_without_a_driver_the_reason_is_said_once() -> None:
    """`make demo` runs `ddpboot gpus` then `ddpboot plan`: the reason (no driver, no NVML) is printed by the first,
    the plan says that no GPU was found and where the reason is."""
    _, inventory, _ = at_80("gpus", "--json", gpus=None)
    found = json.loads(inventory)
    if found["source"] != "none":
        pytest.skip(f"this machine has a GPU inventory ({found['source']})")
    reason = found["notes"][0]
    _, gpus, _ = at_80("gpus", gpus=None)
    _, plan, _ = at_80("plan", "--nproc", "2", gpus=None)
    both = " ".join((gpus + plan).split())
    assert both.count(" ".join(reason.split())) == 1, gpus + plan
    assert "--cpu" in gpus and "no GPUs found (`ddpboot gpus` says why)" in " ".join(plan.split())
    assert "inventory none" not in plan and "visible: all GPUs" not in plan


def test_the_readme_first_command_says_what_to_do_without_gpus() -> None:
    code, _, err = at_80("--nproc", "4", "--exclude", "0", "examples/train.py", "--epochs", "3", gpus="0")
    assert code == 2 and "this machine has no GPUs" in err and "Leave --exclude out" in err and "--cpu" in err


@pytest.mark.parametrize(
    "args", [["-np", "2", "train.py"], ["plan", "-np", "2"], ["--num_gpus", "2", "train.py"], ["-n", "2", "x.py"]]
)
def test_another_launchers_option_gets_ddpboots(args: list[str]) -> None:
    code, out, err = at_80(*args)
    typed = next(arg for arg in args if arg.startswith("-"))
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"ddpboot: error: No such option: {typed}. ") and "is --nproc N here" in err, err
