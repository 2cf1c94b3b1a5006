"""`-h`: every command's help, in the panels its options declare, readable at 80 columns.

Rich's help tables give each option's names, type and text a column each; with torchrun's aliases
(`--nproc,--nproc-per-node,--nproc_per_node`) the names were cut and the text squeezed into a narrow column. Here
each option shows its main name and its metavar (`--nproc N|gpu|auto|cpu`), never cut: a name too long for the
name column takes a line of its own, and the text, its aliases, default and environment variable follow in the
text column. Panels come in the order their first option is declared, so the options a job needs first come first.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ddpboot.cli.output import console, escape

if TYPE_CHECKING:
    from rich.console import RenderableType

NAME_WIDTH = 26  # the name column (`--nproc N|gpu|auto|cpu` fits); a longer name takes a line of its own
_TYPE_METAVARS = {"int": "N", "float": "NUM", "str": "TEXT", "bool": ""}


def install(command: Any) -> None:
    """Give `command` and its subcommands this help (click calls format_help for -h and for no arguments)."""
    command.format_help = lambda ctx, _formatter: print_help(command, ctx)
    for sub in getattr(command, "commands", {}).values():
        install(sub)


def print_help(command: Any, ctx: Any) -> None:
    """Usage, the command's first paragraph, one panel per option group, then the rest of its text and epilog."""
    from rich.padding import Padding

    con = console(pipe_width=80)
    con.print(Padding(f"[bold]Usage:[/] {escape(usage(command, ctx))}", (1, 1, 0, 1)))
    first, *rest = inspect.cleandoc(command.help or "").split("\n\n")
    if first:
        con.print(Padding(first.replace("\n", " "), (1, 1, 1, 1)))
    for title, rows in panels(command, ctx):
        con.print(panel(title, rows))
    subcommands = [(name, sub) for name, sub in getattr(command, "commands", {}).items() if not sub.hidden]
    if subcommands:
        rows = [(name, escape(inspect.cleandoc(sub.help or "").split("\n\n")[0])) for name, sub in subcommands]
        con.print(panel("Commands", rows))
    hidden = underscores(command.get_params(ctx))
    if hidden:
        rest.append(f"torchrun's spellings with underscores ({', '.join(hidden[:2])} and the others) are accepted "
                    "too.")
    for paragraph in [*rest, *(command.epilog or "").split("\n\n")]:
        if paragraph.strip():
            con.print(Padding(paragraph.replace("\n", " "), (1, 1, 0, 1)), style="dim")
    con.print()


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
        row = (names(param), describe(param, ctx))
        if param.name == "help":
            help_rows.append(row)
            continue
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
    if default:
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
