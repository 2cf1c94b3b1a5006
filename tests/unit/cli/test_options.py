"""The shared option groups (ddpboot/cli/options.py), through a real typer command: each group arrives as one raw
object, node options left out are None (not their default), and a command learns which values came from the
environment."""

from __future__ import annotations

import dataclasses

import pytest
import typer
from typer.testing import CliRunner

from ddpboot.cli.options import HOSTS, NODES, SELECTION, OptionGroup, only, with_options
from ddpboot.cli.run_options import COMMAND, REFUSED, RUN
from ddpboot.errors import UsageError
from ddpboot.launch.config import HostOptions, NodeOptions, RunOptions, SelectionOptions, build_plan

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


hosts_app = typer.Typer()


@hosts_app.command()
@with_options(HOSTS)
def probe_hosts(hosts: HostOptions) -> None:
    seen.update(hosts=hosts)


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


GROUPS = [SELECTION, NODES, HOSTS, RUN, COMMAND, REFUSED]
NOT_OPTIONS = {NodeOptions: {"step"}, RunOptions: {"script", "args", "selection", "nodes", "hosts", "refused",
                                                    "from_env"}}  # what the command line fills in otherwise


@pytest.mark.parametrize("group", GROUPS, ids=[g.name for g in GROUPS])
def test_every_field_is_one_row_and_its_default_is_the_fields(group: OptionGroup) -> None:
    """The dataclass is the one home of each option's default: the command line's is read from it."""
    fields = {f.name: f for f in dataclasses.fields(group.record)}
    rows = [r.name for r in group.rows]
    assert sorted(rows) == sorted(set(fields) - NOT_OPTIONS.get(group.record, set())) and len(rows) == len(set(rows))
    for param in group.params:
        default = fields[param.name].default
        assert param.default == (None if isinstance(default, tuple) else default), param.name


def test_the_run_options_defaults_are_strings_as_typed() -> None:
    assert (RunOptions.gpu_watch, RunOptions.gpu_watch_interval, RunOptions.warm_idle) == ("warn", "5", "15m")
    assert type(RunOptions.store) is str and RunOptions.store == "python"


def test_a_repeated_option_arrives_as_a_tuple() -> None:
    assert invoke(hosts_app, "--env", "A", "--env", "B=1")["hosts"] == HostOptions(env=("A", "B=1"))
    assert invoke(hosts_app)["hosts"] == HostOptions()
