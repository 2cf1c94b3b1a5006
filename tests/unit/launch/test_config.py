"""A launch's options parsed once into typed values (ddpboot/launch/config.py), and torchrun's output rules."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.config import NodeOptions, OutputConfig, RunOptions, SelectionOptions, build
from ddpboot.launch.options import (
    REFUSED_TORCHRUN_OPTIONS,
    check_preloads,
    parse_preloads,
    refuse_torchrun_options,
    target_kind,
)
from ddpboot.launch.rundir import temporary_log_base
from ddpboot.launch.spec import Routing, Std, StoreBackend
from ddpboot.selection.affinity import NumaPolicy
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.planner import Plan, make_plan
from ddpboot.selection.request import parse_request


def plan(n: int = 3) -> Plan:
    return make_plan(parse_request(nproc=str(n)), fake_inventory("8"), {}, cpu_count=16)


def test_routing_follows_torchruns_redirect_and_tee_rules() -> None:
    p = plan(3)
    # No log dir: console only.
    r = OutputConfig().routing(p)
    assert all(r.files[i] == Std.NONE and r.console[i] == Std.ALL for i in range(3))
    # A log dir alone: everything to files and console.
    r = OutputConfig(log_dir=Path("logs")).routing(p)
    assert all(r.files[i] == Std.ALL and r.console[i] == Std.ALL for i in range(3))
    # -r 0:1 -t 1:3: rank 0's stdout to its file only; rank 1 both, shown; rank 2 console only.
    r = OutputConfig(log_dir=Path("logs"), redirects={0: Std.OUT}, tee={1: Std.ALL}).routing(p)
    assert (r.files[0], r.console[0]) == (Std.OUT, Std.ERR)
    assert (r.files[1], r.console[1]) == (Std.ALL, Std.ALL)
    assert (r.files[2], r.console[2]) == (Std.NONE, Std.ALL)
    # Filters: local rank 1 and global rank 2 → nothing shown (both must pass).
    r = OutputConfig(local_ranks=frozenset({1, 2}), global_ranks=frozenset({2}), prefix=None).routing(p)
    assert [r.console[i] for i in range(3)] == [Std.NONE, Std.NONE, Std.ALL]
    assert r.prefix is None and r.line_prefix(2, 2, 0) == b""


def test_routing_checks_the_filters_and_maps_against_the_plan() -> None:
    with pytest.raises(UsageError, match="--local-ranks-filter names local rank 3"):
        OutputConfig(local_ranks=frozenset({3})).routing(plan(2))
    with pytest.raises(UsageError, match="--ranks-filter names rank 7"):
        OutputConfig(global_ranks=frozenset({0, 7})).routing(plan(2))
    with pytest.raises(UsageError, match="--redirects names local rank 5, but this node runs 2 ranks"):
        OutputConfig(log_dir=Path("logs"), redirects={5: Std.OUT}).routing(plan(2))


def test_output_options_parse() -> None:
    out = OutputConfig.parse("logs", "0:1", "3", "0,1", None, prefix=False)
    assert out == OutputConfig(Path("logs"), {0: Std.OUT}, Std.ALL, frozenset({0, 1}), None, None)
    none = OutputConfig.parse(None, "0", "0", None, None, True)  # writes nothing: no directory
    assert none.redirects == Std.NONE and none.log_dir is None
    with pytest.raises(UsageError, match="--ranks-filter 'x'"):
        OutputConfig.parse(None, None, None, None, "x", True)


@pytest.mark.parametrize(("redirects", "tee"), [("3", None), (None, "3"), (None, "0:2"), ("0", "1")])
def test_redirects_and_tee_without_a_log_dir_write_under_the_temporary_log_base(redirects: str | None,
                                                                               tee: str | None) -> None:
    out = OutputConfig.parse(None, redirects, tee, None, None, True)
    assert out.log_dir == temporary_log_base()  # as torchrun, which writes them under a temporary directory
    routing = out.routing(plan(3))
    assert routing.files[0] != Std.NONE  # local rank 0 gets a file in every case


def test_the_line_prefix_template_and_its_sources(script: str) -> None:
    config = configure(script, role="trainer", log_line_prefix_template="${role_name}/${node_rank}/${local_rank}|")
    prefix = config.output.prefix  # type: ignore[attr-defined]
    assert prefix.render(5, 1, 2) == b"trainer/2/1|" and prefix.hostname == socket.gethostname()
    assert configure(script).output.prefix.render(3, 0, 0) == b"[rank3]: "  # type: ignore[attr-defined]
    assert configure(script, log_line_prefix_template="").output.prefix.template == "[rank${rank}]: "  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match="--no-prefix and --log-line-prefix-template contradict"):
        configure(script, no_prefix=True, log_line_prefix_template="${rank}")
    # The template from TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: --no-prefix wins; a bad one is named with its variable.
    from_env = {"--log-line-prefix-template": "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"}
    assert configure(script, no_prefix=True, log_line_prefix_template="${rank}",
                     from_env=from_env).output.prefix is None  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match=r"unknown name \$\{rnak\}.*came from TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"):
        build(RunOptions(script=script, log_line_prefix_template="${rnak}", from_env=from_env),
              {"DDPBOOT_FAKE_GPUS": "4", "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "${rnak}"}, Path(script).parent)


def test_lines_said_alike_are_collapsed_unless_no_collapse_or_no_prefix(script: str) -> None:
    def routing(**options: object) -> Routing:
        return configure(script, **options).output.routing(plan(2))  # type: ignore[attr-defined, no-any-return]

    assert routing().collapse and routing().group_prefix() == routing().prefix
    assert not routing(no_collapse=True).collapse and routing(no_collapse=True).group_prefix() is None
    assert routing(no_prefix=True).group_prefix() is None  # no prefix to name the ranks in: every copy is shown


@pytest.mark.parametrize(
    ("module", "no_python", "run_path", "kind"),
    [(False, False, False, "script"), (True, False, False, "module"), (False, True, False, "binary"),
     (False, False, True, "run_path"), (False, True, True, "run_path")],
)
def test_target_kinds(module: bool, no_python: bool, run_path: bool, kind: str) -> None:
    assert target_kind(module, no_python, run_path) == kind


def test_contradictory_target_kinds() -> None:
    with pytest.raises(UsageError, match="-m/--module and --no-python contradict each other"):
        target_kind(True, True, False)
    with pytest.raises(UsageError, match="--run-path runs a script file"):
        target_kind(True, False, True)


def test_store_backends() -> None:
    assert StoreBackend.parse(" Torch ", "--store") is StoreBackend.TORCH
    assert StoreBackend.parse("python", "--store") is StoreBackend.PYTHON
    with pytest.raises(UsageError, match=r"^--store 'foo': choose python \(ddpboot's store, the default\) or torch\.$"):
        StoreBackend.parse("foo", "--store")


def test_preloads() -> None:
    assert parse_preloads("numpy, json.decoder,", fast_start=True) == ("numpy", "json.decoder")
    assert parse_preloads("", fast_start=False) == ()
    with pytest.raises(UsageError, match="only with --fast-start"):
        parse_preloads("numpy", fast_start=False)
    with pytest.raises(UsageError, match="'a-b' is not a module name"):
        parse_preloads("a-b", fast_start=True)


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def configure(script: str, **options: object) -> object:
    return build(RunOptions(script=script, **options), {"DDPBOOT_FAKE_GPUS": "4"}, Path(script).parent)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_restarts": -1}, "--max-restarts -1"),
        ({"start_method": "thread"}, "--start-method 'thread'"),
        ({"rdzv_conf": "timeout"}, "is not KEY=VALUE"),
        ({"nodes": NodeOptions(rdzv_backend="zookeeper")}, "--rdzv-backend 'zookeeper'"),
        ({"nodes": NodeOptions(rdzv_backend="etcd-v2")}, "no etcd rendezvous"),
        ({"stall_timeout": "2 weeks"}, "--stall-timeout '2 weeks' is not a duration"),
        ({"selection": SelectionOptions(isolation="node"), "virtual_local_rank": True}, "contradicts --isolation"),
    ],
)
def test_torchruns_options_keep_torchruns_choices(script: str, options: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        configure(script, **options)


def test_the_config_is_built_with_typed_values(script: str) -> None:
    config = configure(script, start_method="fork", rdzv_conf="join_timeout=5", stall_timeout="2m",
                       nodes=NodeOptions(rdzv_backend="C10D"), rdzv_id="job7", selection=SelectionOptions(nproc="2"))
    assert config.stall_timeout == 120.0 and config.join_timeout == 5.0  # type: ignore[attr-defined]
    assert config.run_id == "job7" and config.request.nproc == 2  # type: ignore[attr-defined]
    assert configure(script, rdzv_id="none").run_id != "none"  # type: ignore[attr-defined]  # torchrun's default


def test_refusals_come_first_and_values_from_the_environment_are_named(script: str) -> None:
    with pytest.raises(UsageError, match=r"^--logs-specs mine"):
        configure(script, refused={"--logs-specs": "mine"}, max_restarts=-1)
    with pytest.raises(UsageError, match="--nnodes came from PET_NNODES=2 in the environment") as info:
        build(RunOptions(script=script, nodes=NodeOptions(nnodes="2"), from_env={"--nnodes": "PET_NNODES"}),
              {"PET_NNODES": "2"}, Path(script).parent)
    assert str(info.value).count("PET_NNODES") == 1


def test_fast_start_of_a_program_is_a_note_not_an_error(tmp_path: Path) -> None:
    config = build(RunOptions(script="true", no_python=True, fast_start=True), {"PATH": "/usr/bin:/bin"}, tmp_path)
    assert not config.fast_start and "every rank starts with exec" in config.notes[0]


def test_a_temporary_directory_too_deep_for_unix_sockets_is_a_note(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("")
    deep = "/scratch/" + "d" * 70  # 79 bytes: multiprocessing's sockets below it would take 111
    config = build(RunOptions(script=str(script)), {"PATH": "/usr/bin:/bin", "TMPDIR": deep}, tmp_path)
    assert [n for n in config.notes if n.startswith(f"TMPDIR={deep} is 79 bytes long")], config.notes
    assert "directory of at most 75 bytes" in config.notes[-1]
    fine = build(RunOptions(script=str(script)), {"PATH": "/usr/bin:/bin", "TMPDIR": "/tmp"}, tmp_path)
    assert not fine.notes


def test_refused_torchrun_options_say_what_to_use_instead() -> None:
    refuse_torchrun_options({option: None for option in REFUSED_TORCHRUN_OPTIONS})
    with pytest.raises(UsageError, match=r"^--event-log-handler x: .*stderr.* null"):
        refuse_torchrun_options({"--event-log-handler": "x"})
    refuse_torchrun_options({"--event-log-handler": "null"})  # torchrun's default: records nothing, as ddpboot
    refuse_torchrun_options({"--event-log-handler": " NULL "})
    with pytest.raises(UsageError, match=r"^--logs-specs null: "):
        refuse_torchrun_options({"--logs-specs": "null"})


def test_numa_binding_is_the_requests_cpu_affinity(script: str) -> None:
    config = configure(script, numa_binding=" Socket ")
    assert config.request.cpu_affinity == NumaPolicy("socket")  # type: ignore[attr-defined]
    with pytest.raises(UsageError, match=r"^--numa-binding numa: choose node, socket, exclusive or core-complex"):
        configure(script, numa_binding="numa")
    with pytest.raises(UsageError, match="--numa-binding node and --cpu-affinity 0-3 both choose"):
        configure(script, numa_binding="node", selection=SelectionOptions(cpu_affinity="0-3"))


def test_a_preload_that_cannot_be_found_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "mine.py").write_text("")
    check_preloads(("json", "os.path", "mine"), [str(tmp_path), *sys.path])
    with pytest.raises(UsageError, match=r"--preload json,jsno: no module 'jsno'"):
        check_preloads(("json", "jsno"), sys.path)


def test_a_log_dir_that_is_a_file_is_named_as_one(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(UsageError, match=r"afile is a file, not a directory"):
        OutputConfig.parse(str(afile), None, None, None, None, True)
    with pytest.raises(UsageError, match=r"is inside .*afile, which is a file"):
        OutputConfig.parse(str(afile / "logs"), None, None, None, None, True)
    assert OutputConfig.parse(str(tmp_path / "new" / "logs"), None, None, None, None, True).log_dir
