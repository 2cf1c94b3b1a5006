"""The shared option groups (ddpboot/cli/options.py), through a real typer command: each group arrives as one raw
object, node options left out are None (not their default), and a command learns which values came from the
environment."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from ddpboot.cli.options import NODES, SELECTION, only, with_options
from ddpboot.errors import UsageError
from ddpboot.launch.config import NodeOptions, SelectionOptions, build_plan

seen: dict[str, object] = {}
app = typer.Typer()


@app.command()
@with_options(SELECTION, NODES)
def probe(selection: SelectionOptions, nodes: NodeOptions, from_env: dict[str, str], flag: str = "x") -> None:
    seen.update(selection=selection, nodes=nodes, from_env=from_env, flag=flag)


subset_app = typer.Typer()


@subset_app.command()
@with_options(only(SELECTION, "exclude"))
def probe_subset(selection: SelectionOptions) -> None:
    seen.update(selection=selection)


def invoke(target: typer.Typer, *args: str, **env: str) -> dict[str, object]:
    seen.clear()
    result = CliRunner().invoke(target, list(args), env=env)
    assert result.exit_code == 0, result.output
    return dict(seen)


def test_groups_arrive_as_one_object_each_and_node_defaults_are_not_choices() -> None:
    got = invoke(app)
    assert got["selection"] == SelectionOptions()
    assert got["nodes"] == NodeOptions()
    assert (got["flag"], got["from_env"]) == ("x", {})


def test_given_options_count_even_at_their_default_value() -> None:
    got = invoke(app, "--nnodes", "1", "--node-rank", "0", "--nproc", "2", "--flag", "y")
    nodes, sel = got["nodes"], got["selection"]
    assert isinstance(nodes, NodeOptions) and isinstance(sel, SelectionOptions)
    assert (nodes.nnodes, nodes.node_rank, sel.nproc, got["flag"]) == ("1", 0, "2", "y")


def test_values_from_the_environment_are_named_as_such() -> None:
    got = invoke(app, "--nproc", "2", PET_NNODES="2", PET_NODE_RANK="1")
    nodes = got["nodes"]
    assert isinstance(nodes, NodeOptions) and (nodes.nnodes, nodes.node_rank) == ("2", 1)
    assert got["from_env"] == {"--nnodes": "PET_NNODES", "--node-rank": "PET_NODE_RANK"}


def test_a_subset_of_a_group_keeps_the_others_at_their_defaults() -> None:
    got = invoke(subset_app, "--exclude", "0")
    assert got["selection"] == SelectionOptions(exclude="0")
    result = CliRunner().invoke(subset_app, ["--nproc", "2"])
    assert result.exit_code == 2 and "No such option" in result.output


def test_the_plan_path_takes_the_groups_as_they_came() -> None:
    got = invoke(app, "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1", "--isolation", " Node ",
                 "--max-used-memory", "1GiB")
    sel, nodes = got["selection"], got["nodes"]
    assert isinstance(sel, SelectionOptions) and isinstance(nodes, NodeOptions)
    planned = build_plan(sel, nodes, {})
    assert (planned.nodes.nnodes, planned.nodes.node_rank, planned.nodes.master_addr) == (2, 1, "10.0.0.1")
    req = planned.request
    assert (req.nnodes, req.node_rank, req.isolation, req.max_used_memory) == (2, 1, "node", 1024**3)


@pytest.mark.parametrize(
    ("args", "message"),
    [(("--max-util", "101"), "--max-util 101: give a percentage"), (("--max-used-memory", "lots"), "not a size")],
)
def test_bad_selection_values(args: tuple[str, str], message: str) -> None:
    sel = invoke(app, *args)["selection"]
    assert isinstance(sel, SelectionOptions)
    with pytest.raises(UsageError, match=message):
        build_plan(sel, NodeOptions(), {})


def test_an_elastic_range_is_planned_as_the_run_would() -> None:
    with pytest.raises(UsageError, match="--nnodes 1:2 is an elastic range, which runs through torch's c10d"):
        build_plan(SelectionOptions(), NodeOptions(nnodes="1:2"), {})
