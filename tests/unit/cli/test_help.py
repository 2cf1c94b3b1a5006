"""`-h` (ddpboot/cli/help.py): names and metavars never cut, aliases and defaults in the text, panels in order."""

from __future__ import annotations

from typing import Any

import pytest
from typer.main import get_command

from ddpboot.cli import help as cli_help
from ddpboot.cli.run import run_app
from ddpboot.cli.tools import tools


def command_and_context(name: str | None = None) -> tuple[Any, Any]:
    command = get_command(tools).commands[name] if name else get_command(run_app)  # type: ignore[attr-defined]
    return command, command.make_context("ddpboot", ["x.py"] if name is None else [], resilient_parsing=True)


def param(command: Any, name: str) -> Any:
    return next(p for p in command.params if p.name == name)


def test_an_option_shows_one_name_and_what_it_takes() -> None:
    command, _ = command_and_context()
    assert cli_help.names(param(command, "nproc")) == "--nproc N|gpu|auto|cpu"
    assert cli_help.names(param(command, "module")) == "-m, --module"
    assert cli_help.names(param(command, "fast_start")) == "--fast-start/--no-fast-start"
    assert cli_help.names(param(command, "cpu")) == "--cpu"
    assert cli_help.names(param(command, "script")) == "SCRIPT"


def test_aliases_leave_out_the_underscore_spellings() -> None:
    command, _ = command_and_context()
    assert cli_help.aliases(param(command, "nproc")) == ["--nproc-per-node"]
    assert cli_help.aliases(param(command, "node_rank")) == []
    hidden = cli_help.underscores(command.params)
    assert "--nproc_per_node" in hidden and "--virtual_local_rank" not in hidden  # a hidden option stays hidden


def test_the_text_ends_with_aliases_default_and_variable() -> None:
    command, ctx = command_and_context()
    text = cli_help.describe(param(command, "nproc"), ctx)
    assert text.endswith("[dim]\\[also --nproc-per-node; env PET_NPROC_PER_NODE][/]")
    assert cli_help.describe(param(command, "isolation"), ctx).endswith(
        "\\[default rank; env DDPBOOT_ISOLATION_MODE][/]")
    assert cli_help.shown_default(param(command, "cpu"), ctx) == ""  # an unset flag has no default worth a word
    assert cli_help.shown_default(param(command, "fast_start"), ctx) == "--no-fast-start"


@pytest.mark.parametrize(
    ("name", "first"), [(None, ["GPU selection", "Arguments"]), ("stacks", ["Arguments", "Options"])]
)
def test_panels_put_the_first_options_first(name: str | None, first: list[str]) -> None:
    command, ctx = command_and_context(name)
    titles = [title for title, _ in cli_help.panels(command, ctx)]
    assert titles[:2] == first and titles[-1] == "Options"
    rows = dict(cli_help.panels(command, ctx))["Options"]
    assert rows[-1][0].endswith("--help")


def test_a_long_name_takes_a_line_of_its_own(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ddpboot.cli.output import console

    monkeypatch.setenv("COLUMNS", "60")
    long = "--a-very-long-option-name CHOICES"
    console().print(cli_help.panel("P", [(long, "Its text."), ("--short", "Beside.")]))
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"│ {long}") for line in lines)
    text = next(line for line in lines if "Its text." in line)
    assert text.startswith("│ " + " " * cli_help.NAME_WIDTH)
    assert any(line.startswith("│ --short") and "Beside." in line for line in lines)
    assert all(len(line) <= 60 for line in lines)


@pytest.mark.parametrize("name", sorted(cli_help.BRIEF))
def test_the_summary_names_options_of_its_command_in_one_line_each(name: str) -> None:
    """-h's options exist on their command, and each text fits beside its name at 80 columns (the panel's
    borders and padding take 4, the gap 2)."""
    command, ctx = command_and_context(None if name == "ddpboot" else name)
    params = {p.name for p in command.get_params(ctx)}
    chosen = cli_help.BRIEF[name]
    assert set(chosen) <= params and "help" in chosen
    assert all(len(text) <= 80 - 4 - 2 - cli_help.NAME_WIDTH for text in chosen.values())
    assert cli_help.brief_rows(command, ctx, chosen)[0][0].startswith("--nproc")


def test_a_default_the_text_says_is_not_repeated() -> None:
    command, ctx = command_and_context()
    assert cli_help.describe(param(command, "gpu_watch"), ctx).endswith("Default warn.")
    assert cli_help.describe(param(command, "gpu_watch_interval"), ctx).endswith("Default 5.")
    assert "[default 1]" in cli_help.describe(param(command, "gpus_per_proc"), ctx)
