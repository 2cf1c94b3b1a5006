"""The completion scripts (ddpboot/cli/completion.py), made from the commands' declared options."""

from __future__ import annotations

import subprocess

import pytest
from typer.main import get_command

from ddpboot.cli.completion import SHELLS, Opt, options_of, script
from ddpboot.cli.run import run_app
from ddpboot.cli.tools import tools
from ddpboot.launch.spec import WatchMode


def run_options() -> list[Opt]:
    return options_of(get_command(run_app))


def test_the_visible_options_with_their_spellings_and_values() -> None:
    opts = {o.names[0]: o for o in run_options()}
    assert opts["--nproc"].names == ("--nproc", "--nproc-per-node", "--nproc_per_node") and opts["--nproc"].takes_value
    assert opts["--fast-start"].names == ("--fast-start", "--no-fast-start") and not opts["--fast-start"].takes_value
    assert opts["--isolation"].choices == ("rank", "node") and opts["--gpus"].choices == ()
    assert opts["-r"].names == ("-r", "--redirects") and "--help" in {n for o in opts.values() for n in o.names}
    assert "--logs-specs" not in opts and "--duplicate-stdout-filters" not in opts  # refused: hidden, not offered
    assert opts["--print-completion"].help == "Print a completion script for bash, zsh, tcsh or fish and exit, e.g"


def test_every_option_with_a_fixed_set_completes_its_words() -> None:
    """Read from each option's row (its Choice, or its words): nothing to keep in step by hand."""
    opts = {o.names[0]: o.choices for o in run_options()}
    assert opts["--gpu-watch"] == WatchMode.values() == ("warn", "strict", "off")
    assert opts["--numa-binding"] == ("node", "socket", "exclusive", "core-complex")
    assert opts["-r"] == opts["-t"] == ("0", "1", "2", "3")
    assert opts["--store"] == ("python", "torch") and opts["--log-mode"] == ("private", "shared")
    assert opts["--start-method"] == ("spawn", "fork", "forkserver") and opts["--rdzv-backend"] == ("static", "c10d")
    assert opts["--print-completion"] == SHELLS and opts["--nproc"] == ("gpu", "auto", "cpu")
    assert opts["--gpus"] == () and opts["--log-dir"] == ()


def test_every_shell_gets_every_option() -> None:
    group = get_command(tools)
    by_tool = {name: options_of(cmd) for name, cmd in group.commands.items()}  # type: ignore[attr-defined]
    run = run_options()
    for shell in SHELLS:
        text = script(shell, run, by_tool)
        long = [n for o in run for n in o.names if n.startswith("--")]
        assert all((n if shell in ("bash", "zsh") else n[2:]) in text for n in long), shell
    assert script("zsh", run, by_tool).startswith("#compdef ddpboot\n")


def test_fish_quotes_what_it_describes() -> None:
    text = script("fish", [Opt(("--it", "-i"), True, "it's a \\ test")], {"plan": []})
    assert "complete -c ddpboot -n 'not __fish_seen_subcommand_from plan' -l it -s i -r -d 'it\\'s a \\\\ test'" in text


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_bash_family_parses(shell: str) -> None:
    text = script(shell, run_options(), {"plan": [Opt(("--json",), False, "")]})
    done = subprocess.run(["bash", "-n"], input=text.split("autoload", 1)[-1].split("\n", 1)[-1], text=True,
                          capture_output=True)
    assert done.returncode == 0, done.stderr
