"""The selection options and which options were given (ddpboot/cli/options.py), through a real typer command."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from ddpboot.cli.options import Selection, flag_nodes, options_given, selection_request, with_selection
from ddpboot.errors import UsageError
from ddpboot.nodes.static import resolve_nodes

seen: dict[str, object] = {}
app = typer.Typer()


@app.command()
@with_selection
def probe(selection: Selection, flag: str = "x") -> None:
    seen.update(selection=selection, flag=flag)


given_app = typer.Typer()


@given_app.command()
@with_selection
def probe_given(ctx: typer.Context, selection: Selection, flag: str = "x") -> None:
    seen.update(selection=selection, given=options_given(ctx))


def invoke(target: typer.Typer, *args: str, **env: str) -> Selection:
    seen.clear()
    result = CliRunner().invoke(target, list(args), env=env)
    assert result.exit_code == 0, result.output
    selection = seen["selection"]
    assert isinstance(selection, Selection)
    return selection


def test_defaults_of_node_options_are_not_choices() -> None:
    sel = invoke(app)
    assert (sel.nnodes, sel.node_rank, sel.nproc, sel.isolation, sel.max_util) == (None, None, None, "rank", 5)
    assert seen["flag"] == "x"


def test_given_node_options_count_even_at_their_default_value() -> None:
    sel = invoke(app, "--nnodes", "1", "--node-rank", "0", "--nproc", "2", "--flag", "y")
    assert (sel.nnodes, sel.node_rank, sel.nproc, seen["flag"]) == ("1", 0, "2", "y")
    assert invoke(app, PET_NNODES="2", PET_NODE_RANK="1").nnodes == "2"  # torchrun's environment defaults


def test_a_command_may_see_which_options_were_given() -> None:
    invoke(given_app, "--node-rank", "0", "--flag", "x")
    assert seen["given"] == {"node_rank", "flag"}


def test_nodes_from_flags_and_the_request() -> None:
    sel = invoke(app, "--nnodes", "2", "--node-rank", "1", "--isolation", " Node ", "--max-used-memory", "1GiB")
    nodes = flag_nodes(sel, {}, master_addr="10.0.0.1")
    assert (nodes.nnodes, nodes.node_rank, nodes.master_addr) == (2, 1, "10.0.0.1")
    req = selection_request(sel, nodes)
    assert (req.nnodes, req.node_rank, req.isolation, req.max_used_memory) == (2, 1, "node", 1024**3)
    assert flag_nodes(invoke(app), {}) == resolve_nodes({})


@pytest.mark.parametrize(
    ("args", "message"),
    [(("--max-util", "101"), "--max-util 101: give a percentage"), (("--max-used-memory", "lots"), "not a size")],
)
def test_bad_selection_values(args: tuple[str, str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        selection_request(invoke(app, *args), resolve_nodes({}))


def test_an_elastic_range_has_no_fixed_plan() -> None:
    with pytest.raises(UsageError, match="--nnodes 1:2 is an elastic range"):
        flag_nodes(invoke(app, "--nnodes", "1:2"), {})
