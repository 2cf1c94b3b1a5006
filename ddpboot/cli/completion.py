"""`ddpboot --print-completion bash|zsh|tcsh|fish`: a completion script for the `ddpboot` command, made from the
options the commands declare (so it cannot fall behind them), as torchrun's `--print-completion` makes its own.

What completes: the subcommands (`plan`, `gpus`, `smoke`, `stacks`, ...) as the first word, each command's options
(hidden ones, such as the torchrun options ddpboot refuses, are left out), the words of the options that take a fixed
set (each option's Choice, or the words its row of cli/options.py lists: `--nproc gpu`, `-r 3`), and file names
everywhere else (the script, a --log-dir). Static scripts: nothing runs ddpboot on a TAB.
tcsh completes options and values, not the subcommand names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from typer._click.core import Command, Context  # the click that typer carries (its own copy)
from typer.core import TyperOption

SHELLS = ("bash", "zsh", "tcsh", "fish")  # what --print-completion takes (its row offers them)


@dataclass(frozen=True)
class Opt:
    """One option as completion sees it: its spellings, whether it takes a value, a one-line description, and the
    words it takes where they are a fixed set (its row's Choice or words: cli/options.py)."""

    names: tuple[str, ...]
    takes_value: bool
    help: str
    choices: tuple[str, ...] = ()


def options_of(command: Command) -> list[Opt]:
    """The visible options of a click command, `-h/--help` included."""
    out = []
    ctx = Context(command)
    for param in command.get_params(ctx):
        if not isinstance(param, TyperOption) or param.hidden:
            continue
        names = tuple(param.opts) + tuple(param.secondary_opts)
        words = tuple(item.value for item in param.shell_complete(ctx, "") if item.type == "plain")
        out.append(Opt(names, not param.is_flag, _first_sentence(param.help or ""), words))
    return out


def _first_sentence(text: str) -> str:
    text = re.sub(r"\s+", " ", text.replace("\\[", "[")).strip()
    cut = re.search(r"(?<=[.:;])\s", text)
    return (text[: cut.start()] if cut else text)[:100].rstrip(".:;")


def script(shell: str, run: list[Opt], tools: dict[str, list[Opt]]) -> str:
    """The completion script for `shell` (one of SHELLS)."""
    if shell == "fish":
        return _fish(run, tools)
    if shell == "tcsh":
        return _tcsh(run, tools)
    bash = _bash(run, tools)
    if shell == "zsh":
        return ("#compdef ddpboot\n# ddpboot completion for zsh: `eval \"$(ddpboot --print-completion zsh)\"` in "
                "~/.zshrc\nautoload -U +X bashcompinit && bashcompinit\n" + bash.split("\n", 1)[1])
    return bash


def _every(run: list[Opt], tools: dict[str, list[Opt]]) -> list[Opt]:
    """Every command's options, each once (the selection options are on several commands)."""
    return list({o.names: o for o in [*run, *(o for opts in tools.values() for o in opts)]}.values())


def _words(opts: Iterable[Opt]) -> str:
    return " ".join(n for o in opts for n in o.names)


def _bash(run: list[Opt], tools: dict[str, list[Opt]]) -> str:
    every = _every(run, tools)
    takes = " ".join(dict.fromkeys(n for o in every if o.takes_value for n in o.names))
    cases = "\n".join(f"        {'|'.join(o.names)}) COMPREPLY=($(compgen -W '{' '.join(o.choices)}' -- \"$cur\"))"
                      "; return ;;" for o in every if o.choices and o.takes_value)
    per_tool = "\n".join(f"        {name}) words='{_words(opts)}' ;;" for name, opts in tools.items())
    return f"""# ddpboot completion for bash: `eval "$(ddpboot --print-completion bash)"` in ~/.bashrc
_ddpboot() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" words w p i
    local takes=' {takes} ' tools=' {" ".join(tools)} '
    case "$prev" in
{cases}
    esac
    [[ $takes == *" $prev "* ]] && return  # another option's value: file names
    if [[ $COMP_CWORD -eq 1 && $cur != -* ]]; then
        COMPREPLY=($(compgen -W "$tools" -- "$cur") $(compgen -f -- "$cur"))
        return
    fi
    words='{_words(run)}'
    case "${{COMP_WORDS[1]}}" in
{per_tool}
    esac
    if [[ $tools != *" ${{COMP_WORDS[1]}} "* ]]; then  # a job: after SCRIPT, the words are the script's own
        for ((i = 1; i < COMP_CWORD; i++)); do
            w="${{COMP_WORDS[i]}}" p="${{COMP_WORDS[i-1]}}"
            [[ $w == = || $p == = || $w == -* || $takes == *" $p "* ]] || return
        done
    fi
    [[ $cur == -* ]] && COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _ddpboot ddpboot
"""


def _tcsh(run: list[Opt], tools: dict[str, list[Opt]]) -> str:
    every = _every(run, tools)
    longs = sorted({n[2:] for o in every for n in o.names if n.startswith("--")})
    shorts = sorted({n[1:] for o in every for n in o.names if re.fullmatch(r"-\w", n)})
    values = " ".join(f"'n/{n}/({' '.join(o.choices)})/'" for o in every if o.choices for n in o.names)
    return ("# ddpboot completion for tcsh: `eval `ddpboot --print-completion tcsh`` in ~/.tcshrc\n"
            f"complete ddpboot {values} 'c/--/({' '.join(longs)})/' 'c/-/({' '.join(shorts)})/'\n")


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_lines(opts: list[Opt], condition: str) -> list[str]:
    lines = []
    for o in opts:
        spell = " ".join(f"-l {n[2:]}" if n.startswith("--") else f"-s {n[1:]}" for n in o.names)
        value = f" -x -a {_fish_quote(' '.join(o.choices))}" if o.choices else " -r" if o.takes_value else ""
        lines.append(f"complete -c ddpboot -n {_fish_quote(condition)} {spell}{value} -d {_fish_quote(o.help)}")
    return lines


def _fish(run: list[Opt], tools: dict[str, list[Opt]]) -> str:
    names = " ".join(tools)
    lines = ["# ddpboot completion for fish: `ddpboot --print-completion fish > ~/.config/fish/completions/"
             "ddpboot.fish`",
             f"complete -c ddpboot -n '__fish_is_first_arg' -a {_fish_quote(names)} -d 'subcommand'",
             *_fish_lines(run, f"not __fish_seen_subcommand_from {names}")]
    for name, opts in tools.items():
        lines += _fish_lines(opts, f"__fish_seen_subcommand_from {name}")
    return "\n".join(lines) + "\n"


def print_completion(ctx: Context, shell: str) -> None:
    """`--print-completion SHELL`: the completion script for the whole `ddpboot` command (this command's options and
    each subcommand's), then exit 0."""
    from typer import Exit
    from typer._click.exceptions import BadParameter
    from typer.main import get_command

    from ddpboot.cli.tools import TOOLS, tools

    name = shell.strip().lower()
    if name not in SHELLS:
        raise BadParameter(f"{shell!r}: choose one of {', '.join(SHELLS)}", param_hint="'--print-completion'")
    subcommands = getattr(get_command(tools), "commands", {})
    by_tool = {n: options_of(subcommands[n]) for n in TOOLS if n in subcommands}
    print(script(name, options_of(ctx.command), by_tool), end="")
    raise Exit(0)
