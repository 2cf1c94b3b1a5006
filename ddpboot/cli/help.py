"""`-h` and `--help`: each command's help, readable at 80 columns. `-h` is the summary that fits one screen (the
options a user needs first, one line each, the subcommands, and where to read the rest), `--help` the whole
reference, as ripgrep's and git's; a command whose whole help is short (`ddpboot top`) shows it for both.

Rich's help tables give each option's names, type and text a column each; with torchrun's aliases
(`--nproc,--nproc-per-node,--nproc_per_node`) the names were cut and the text squeezed into a narrow column. Here
each option shows its main name and its metavar (`--nproc N|gpu|auto|cpu`), never cut: a name too long for the
name column takes a line of its own, and the text, its aliases, default and environment variable follow in the
text column. Panels come in the order their first option is declared, so the options a job needs first come first.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ddpboot.cli.output import console, escape

if TYPE_CHECKING:
    from rich.console import RenderableType

NAME_WIDTH = 26  # the name column (`--nproc N|gpu|auto|cpu` fits); a longer name takes a line of its own
_TYPE_METAVARS = {"int": "N", "float": "NUM", "str": "TEXT", "bool": ""}

# `-h`: the options a user needs first, per command, in this order, each with a text that fits one line beside its
# name at 80 columns. A command not named here shows its whole help for -h too.
BRIEF = {
    "ddpboot": {
        "nproc": "Ranks on this node (default 1).",
        "gpus": "Exactly these GPUs: 0,2 or 0-3 or UUIDs.",
        "exclude": "Never these GPUs.",
        "cpu": "CPU ranks with gloo, even where GPUs exist.",
        "module": "SCRIPT is a module, run as python -m.",
        "no_python": "SCRIPT is a program, not Python.",
        "nnodes": "Nodes (with --node-rank, --master-addr).",
        "log_dir": "Each rank's output into DIR/RUN_ID/.",
        "max_restarts": "Restart every rank up to N times.",
        "fast_start": "Import torch once; fork every rank.",
        "warm": "Fork ranks from a process kept warm.",
        "dry_run": "Show each worker's command; start nothing.",
        "version": "Print ddpboot's version and exit.",
        "help": "-h this summary; --help every option.",
    },
    "plan": {
        "nproc": "Ranks on this node (default 1).",
        "gpus": "Exactly these GPUs: 0,2 or 0-3 or UUIDs.",
        "exclude": "Never these GPUs.",
        "cpu": "CPU ranks, even where GPUs exist.",
        "isolation": "What each worker sees (default rank).",
        "nnodes": "Nodes (with --node-rank, --master-addr).",
        "as_json": "Print the plan as one JSON object.",
        "wide": "Every column, full UUIDs and bus ids.",
        "help": "-h this summary; --help every option.",
    },
    "smoke": {
        "nproc": "Ranks on this node (default 1).",
        "gpus": "Exactly these GPUs: 0,2 or 0-3 or UUIDs.",
        "exclude": "Never these GPUs.",
        "cpu": "CPU ranks, even where GPUs exist.",
        "checks": "Only these checks (comma list).",
        "timeout": "Seconds for the whole run (default 120).",
        "as_json": "Print the report as one JSON object.",
        "junit": "Also write a JUnit XML report here.",
        "help": "-h this summary; --help every option.",
    },
}
_BRIEF_COMMANDS = "Commands (each takes -h)"


def install(command: Any, brief: bool = False) -> None:
    """Give `command` and its subcommands this help (click calls format_help for -h, --help and for no
    arguments); `brief`: the summary (-h, or no arguments) rather than the whole reference (--help)."""
    command.format_help = lambda ctx, _formatter: print_help(command, ctx, brief)
    for sub in getattr(command, "commands", {}).values():
        install(sub, brief)


def print_help(command: Any, ctx: Any, brief: bool = False) -> None:
    """Usage, the command's first paragraph, one panel per option group (brief: one panel of the options a user
    needs first), the subcommands, then the rest of its text and epilog (brief: where to read more)."""
    from rich.padding import Padding

    con = console(pipe_width=80)
    con.print(Padding(f"[bold]Usage:[/] {escape(usage(command, ctx))}", (1, 1, 0, 1)))
    first, *rest = inspect.cleandoc(command.help or "").split("\n\n")
    if first:
        con.print(Padding(first.replace("\n", " "), (1, 1, 1, 1)))
    chosen = BRIEF.get(_brief_key(ctx)) if brief else None
    if chosen is not None:
        con.print(panel("Options to start with", brief_rows(command, ctx, chosen)))
    else:
        for title, rows in panels(command, ctx):
            con.print(panel(title, rows))
    subcommands = [(name, sub) for name, sub in getattr(command, "commands", {}).items() if not sub.hidden]
    if subcommands or ctx.parent is None:
        con.print(panel(_BRIEF_COMMANDS if brief else "Commands", tool_rows(subcommands)))
    if chosen is not None:
        name = ctx.command_path
        con.print(Padding(f"`{name} --help` shows every option, with its environment variable and default; "
                          "docs/reference.md explains each.", (1, 1, 1, 1)), style="dim")
        return
    hidden = underscores(command.get_params(ctx))
    if hidden:
        rest.append(f"torchrun's spellings with underscores ({', '.join(hidden[:2])} and the others) are accepted "
                    "too.")
    for paragraph in [*rest, *(command.epilog or "").split("\n\n")]:
        if paragraph.strip():
            con.print(Padding(paragraph.replace("\n", " "), (1, 1, 0, 1)), style="dim")
    con.print()


def _brief_key(ctx: Any) -> str:
    """The command's name in BRIEF: the job's is `ddpboot`, a tool's its own."""
    return str(ctx.info_name) if ctx.parent is not None else "ddpboot"


def brief_rows(command: Any, ctx: Any, chosen: dict[str, str]) -> list[tuple[str, str]]:
    """The options of BRIEF, in its order, each with its one-line text."""
    params = {p.name: p for p in command.get_params(ctx)}
    return [(names(params[name]).split("/", 1)[0], escape(text)) for name, text in chosen.items() if name in params]


def tool_rows(subcommands: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    """One row per subcommand (the tools' short help, cli/tools.py); a job's own help lists the tools too."""
    if not subcommands:
        from typer.main import get_command

        from ddpboot.cli.tools import TOOLS, tools

        group = getattr(get_command(tools), "commands", {})
        subcommands = [(name, group[name]) for name in TOOLS if name in group]
    return [(f"ddpboot {name}" if not name.startswith("ddpboot") else name,
             escape(sub.short_help or inspect.cleandoc(sub.help or "").split("\n\n")[0])) for name, sub in subcommands]


def usage(command: Any, ctx: Any) -> str:
    pieces = [ctx.command_path, "[OPTIONS]"]
    for param in command.get_params(ctx):
        if param.param_type_name == "argument":
            name = param.metavar or param.name.upper()
            pieces.append(name if param.required else f"[{name}]..." if param.nargs != 1 else f"[{name}]")
    if getattr(command, "commands", None):
        pieces.append("COMMAND [ARGS]...")
    return " ".join(pieces)


def panels(command: Any, ctx: Any) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, rows) per panel, in the order of each panel's first option, -h last. The arguments' panel comes
    second when the command's options name panels (the usage line names the arguments already, and the options a
    job needs first come first), else first."""
    out: dict[str, list[tuple[str, str]]] = {}
    help_rows = []
    for param in command.get_params(ctx):
        if getattr(param, "hidden", False):
            continue
        is_argument = param.param_type_name == "argument"
        if param.name == "help":
            summary = _brief_key(ctx) in BRIEF
            help_rows.append((names(param), "This reference; -h shows a summary." if summary else describe(param, ctx)))
            continue
        row = (names(param), describe(param, ctx))
        title = getattr(param, "rich_help_panel", None) or ("Arguments" if is_argument else "Options")
        out.setdefault(title, []).append(row)
    out.setdefault("Options", []).extend(help_rows)
    order = [t for t in out if t != "Arguments"]
    if "Arguments" in out:
        order.insert(1 if order[0] != "Options" else 0, "Arguments")
    return [(title, out[title]) for title in order]


def names(param: Any) -> str:
    """`-m, --module`, `--nproc N|gpu|auto|cpu`, `--fast-start/--no-fast-start`, `SCRIPT`: the option's short
    name and first long name (the other spellings go to its text) and what it takes."""
    if param.param_type_name == "argument":
        return str(param.metavar or param.name.upper())
    short = [o for o in param.opts if not o.startswith("--")]
    long = [o for o in param.opts if o.startswith("--")][:1]
    text = ", ".join(short + long)
    if param.secondary_opts:
        text += "/" + param.secondary_opts[0]
    value = metavar(param)
    return f"{text} {value}" if value else text


def metavar(param: Any) -> str:
    if getattr(param, "is_flag", False):
        return ""
    if param.metavar is not None:
        return str(param.metavar)
    return _TYPE_METAVARS.get(str(param.bare_type()), str(param.name).upper())


def aliases(param: Any) -> list[str]:
    """The other long spellings of an option, but not those that only put underscores for its dashes
    (--nproc-per-node for --nproc, not --nproc_per_node: `underscores` says once that those are accepted)."""
    long = [o for o in param.opts if o.startswith("--")]
    out: list[str] = []
    for other in long[1:]:
        dashed = other.replace("_", "-")
        if dashed != long[0] and dashed not in out:
            out.append(dashed)
    return out


def underscores(params: Iterable[Any]) -> list[str]:
    """The spellings with underscores that the help leaves out (torchrun's --nproc_per_node, --master_addr)."""
    return [o for p in params if not getattr(p, "hidden", False) for o in getattr(p, "opts", ())[1:]
            if o.startswith("--") and "_" in o]


def describe(param: Any, ctx: Any) -> str:
    """The text column: the help (rich markup, as typer reads it), then its other spellings, default and
    environment variable, dim."""
    text = " ".join((param.help or "").split())
    extra = []
    also = aliases(param)
    if also:
        extra.append("also " + ", ".join(also))
    default = shown_default(param, ctx)
    if default and not re.search(r"\bDefault\b", text):  # "Default warn." in the text is not said twice
        extra.append(f"default {default}")
    envvar = param.envvar if getattr(param, "show_envvar", True) else None
    if envvar:
        extra.append("env " + (envvar if isinstance(envvar, str) else ", ".join(envvar)))
    if not extra:
        return text
    tail = f"[dim]\\[{escape('; '.join(extra))}][/]"
    return f"{text} {tail}" if text else tail


def shown_default(param: Any, ctx: Any) -> str:
    """A default worth printing: not None, not an unset flag, not an empty string; a flag pair's chosen side."""
    if param.show_default is False or param.param_type_name == "argument":
        return ""
    value = param.get_default(ctx, call=False)
    if getattr(param, "is_flag", False) and param.secondary_opts:
        return str(param.opts[0] if value else param.secondary_opts[0])
    if callable(value) or value in (None, "", False) or value == ():
        return ""
    return str(value)


def panel(title: str, rows: Iterable[tuple[str, str]]) -> RenderableType:
    """One bordered panel: names in a column of NAME_WIDTH, text beside; a longer name takes a line of its own
    and its text starts on the next."""
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    lines: list[RenderableType] = []
    for name, text in rows:
        grid = Table.grid(padding=(0, 2), expand=True)
        grid.add_column(no_wrap=True, width=NAME_WIDTH)
        grid.add_column(ratio=1)
        label = Text(name, style="bold cyan", overflow="fold")
        if label.cell_len > NAME_WIDTH:
            lines.append(label)
            grid.add_row("", text)
        else:
            grid.add_row(label, text)
        lines.append(grid)
    return Panel(Group(*lines), title=title, title_align="left", border_style="dim")
