"""The runner (ddpboot/launch/runner.py): the plan preview, the LaunchSpec it hands the supervisor, and that a stop
before the start lets go of everything it took."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch import runner
from ddpboot.launch.config import LaunchConfig, RunOptions, SelectionOptions, build
from ddpboot.nodes.launcher import StoreAddress
from ddpboot.nodes.static import resolve_nodes
from ddpboot.selection.inventory import load_inventory
from ddpboot.selection.locks import current_holders


@pytest.fixture
def config(tmp_path: Path) -> LaunchConfig:
    env = {"DDPBOOT_FAKE_GPUS": "4", "DDPBOOT_LOCK_DIR": str(tmp_path / "locks"), "PATH": os.defpath}
    (tmp_path / "train.py").write_text("")
    options = RunOptions(script="train.py", args=("--epochs", "3"), selection=SelectionOptions(nproc="2"),
                         rdzv_id="run7", signals_to_handle="SIGTERM", role="trainer", no_prefix=True)
    return replace(build(options, env, tmp_path), python="/usr/bin/python3")


def test_the_preview_carries_the_node_setup(config: LaunchConfig) -> None:
    nodes = resolve_nodes({}, nnodes=2, node_rank=1, master_addr="10.0.0.1")
    plan = runner.preview_plan(replace(config.request, nnodes=2, node_rank=1), nodes, config.env)
    assert (plan.world_size, plan.node_rank, [s.rank for s in plan.ranks]) == (4, 1, [2, 3])
    assert plan.cluster["source"] == "flags" and plan.cluster["master_addr"] == "10.0.0.1"


def test_the_launch_spec_follows_the_config(config: LaunchConfig) -> None:
    plan = runner.preview_plan(config.request, config.nodes, config.env)
    spec = runner.launch_spec(config, plan)
    assert (spec.target, spec.python, spec.role, spec.signals) == (config.target, "/usr/bin/python3", "trainer",
                                                                   (signal.SIGTERM,))
    assert (spec.master_addr, spec.bind_addr, spec.master_port, spec.store) == ("127.0.0.1", "127.0.0.1", None,
                                                                               "python")
    assert spec.routing.prefix is None and set(spec.routing.console) == {0, 1}
    assert spec.run_id == "run7" and (spec.log_dir, spec.stall_timeout) == (None, None)


def test_a_dry_run_reports_a_port_in_use(config: LaunchConfig) -> None:
    dry = runner.dry_run(config)  # no port asked: bound at launch
    assert len(dry.plan.ranks) == 2 and dry.spec.master_port is None
    assert [w.rank for w in dry.workers] == [0, 1]
    assert dry.workers[1].variables["MASTER_PORT"] == "<port bound at launch>"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match="is in use"):
            runner.dry_run(replace(config, store_address=StoreAddress("127.0.0.1", "127.0.0.1", port)))



@pytest.fixture
def hup_blocked() -> Iterator[None]:
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:
        yield
    finally:
        while signal.SIGHUP in signal.sigpending():
            signal.sigtimedwait({signal.SIGHUP}, 0)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@pytest.mark.usefixtures("hup_blocked")
def test_a_stop_signal_before_the_start_releases_everything(
    config: LaunchConfig, capsys: pytest.CaptureFixture[str]
) -> None:
    signal.pthread_kill(threading.get_ident(), signal.SIGHUP)
    assert runner.run(config) == 128 + signal.SIGHUP
    assert "ddpboot: SIGHUP before the start: nothing was started" in capsys.readouterr().err
    uuids = [u.uuid for u in load_inventory(config.env).units()]
    assert current_holders(uuids, Path(config.env["DDPBOOT_LOCK_DIR"])) == {}  # the GPU locks were let go


@pytest.mark.usefixtures("hup_blocked")
def test_waiting_for_gpus_ends_at_a_stop_signal() -> None:
    runner.sleep_unless_stopped(0.0)
    signal.pthread_kill(threading.get_ident(), signal.SIGHUP)
    with pytest.raises(runner.StoppedBeforeStart, match="SIGHUP while waiting for GPUs") as stop:
        runner.sleep_unless_stopped(5.0)
    assert stop.value.exit_code == 128 + signal.SIGHUP
