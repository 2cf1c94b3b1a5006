"""The worker environment and command line the launcher builds (pure), and the option values that shape them."""

from __future__ import annotations

import signal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.cli.run import _routing
from ddpboot.errors import UsageError
from ddpboot.launch.env import RUN_PATH_CODE, EnvContext, substitute_local_rank, worker_argv, worker_vars
from ddpboot.launch.options import (
    Std,
    parse_rank_list,
    parse_rdzv_conf,
    parse_signals,
    parse_std,
    resolve_std,
)
from ddpboot.launch.spec import Target
from ddpboot.nodes.static import parse_endpoint
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.planner import Plan, Request, make_plan

CONTRACT = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "DDPBOOT_LOCAL_RANK", "DDPBOOT_GPU_UUIDS", "DDPBOOT_ISOLATION",
}
CTX = EnvContext("127.0.0.1", 41234, "run-1", "trainer", 2, 3, "SIGTERM,SIGINT")


def plan(n: int = 4, gpus: int = 8, **req: Any) -> Plan:
    return make_plan(Request(nproc=str(n), **req), fake_inventory(str(gpus)), {}, cpu_count=16)


def all_vars(p: Plan, base: dict[str, str] | None = None) -> list[dict[str, str]]:
    return [worker_vars(p, slot, CTX, base or {}, f"/logs/rank{slot.rank}.error.json") for slot in p.ranks]


def test_every_contract_variable_is_set_for_every_rank() -> None:
    for env in all_vars(plan()):
        assert set(env) == CONTRACT | {"TORCHELASTIC_SIGNALS_TO_HANDLE"}


def test_rank_isolation_gives_local_rank_0_and_one_gpu_each() -> None:
    p = plan(4)
    envs = all_vars(p)
    uuids = [fake_inventory("8").gpus[i].uuid for i in range(4)]
    for i, env in enumerate(envs):
        assert env["RANK"] == env["ROLE_RANK"] == env["DDPBOOT_LOCAL_RANK"] == str(i)
        assert env["LOCAL_RANK"] == "0"  # cuda:0 is this rank's GPU
        assert env["CUDA_VISIBLE_DEVICES"] == env["DDPBOOT_GPU_UUIDS"] == uuids[i]
        assert env["DDPBOOT_ISOLATION"] == "rank"
        assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == "4"
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("0", "1")
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "41234")
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"
        assert (env["TORCHELASTIC_RESTART_COUNT"], env["TORCHELASTIC_MAX_RESTARTS"]) == ("2", "3")
        assert env["TORCHELASTIC_RUN_ID"] == "run-1" and env["ROLE_NAME"] == "trainer"
        assert env["TORCHELASTIC_ERROR_FILE"] == f"/logs/rank{i}.error.json"


def test_node_isolation_gives_the_true_local_rank_and_every_gpu() -> None:
    p = plan(4, isolation="node")
    envs = all_vars(p)
    everything = ",".join(g.uuid for g in fake_inventory("8").gpus[:4])
    for i, env in enumerate(envs):
        assert env["LOCAL_RANK"] == env["DDPBOOT_LOCAL_RANK"] == str(i)
        assert env["CUDA_VISIBLE_DEVICES"] == everything
        assert env["DDPBOOT_GPU_UUIDS"] == fake_inventory("8").gpus[i].uuid
        assert env["DDPBOOT_ISOLATION"] == "node"


def test_several_gpus_per_rank_are_listed_in_order() -> None:
    p = plan(2, gpus_per_proc=2)
    gpus = fake_inventory("8").gpus
    env0, env1 = all_vars(p)
    assert env0["CUDA_VISIBLE_DEVICES"] == env0["DDPBOOT_GPU_UUIDS"] == f"{gpus[0].uuid},{gpus[1].uuid}"
    assert env1["CUDA_VISIBLE_DEVICES"] == f"{gpus[2].uuid},{gpus[3].uuid}"


def test_cpu_ranks_hide_every_gpu() -> None:
    p = plan(2, cpu=True)
    for env in all_vars(p):
        assert env["CUDA_VISIBLE_DEVICES"] == "" and env["DDPBOOT_GPU_UUIDS"] == ""


def test_user_choices_win_over_defaults() -> None:
    base = {"OMP_NUM_THREADS": "7", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3", "CUDA_VISIBLE_DEVICES": "0,1"}
    for env in all_vars(plan(2), base):
        assert env["OMP_NUM_THREADS"] == "7" and env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3"
        assert env["CUDA_VISIBLE_DEVICES"] != "0,1"  # the plan's GPUs, never the launcher's inherited list
    for env in all_vars(plan(2)):
        assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and int(env["OMP_NUM_THREADS"]) >= 1


def test_worker_command_lines() -> None:
    py = "/usr/bin/python3"
    args = ("--epochs", "3", "--rank=${local_rank}", "$HOME", "a$$b")
    assert worker_argv(Target("script", "train.py", args), py, 2) == [
        py, "-u", "train.py", "--epochs", "3", "--rank=2", "$HOME", "a$$b"]
    assert worker_argv(Target("module", "pkg.train", ("x",)), py, 0) == [py, "-u", "-m", "pkg.train", "x"]
    assert worker_argv(Target("binary", "/bin/echo", ("${local_rank}",)), py, 5) == ["/bin/echo", "5"]
    assert worker_argv(Target("run_path", "/abs/t.py", ("y",)), py, 0) == [py, "-u", "-c", RUN_PATH_CODE,
                                                                           "/abs/t.py", "y"]


@given(st.lists(st.text(max_size=20), max_size=5), st.integers(0, 1000))
def test_only_the_local_rank_macro_is_replaced(args: list[str], rank: int) -> None:
    out = substitute_local_rank(args, rank)
    assert [a.replace("${local_rank}", str(rank)) for a in args] == out


# --- option values ---------------------------------------------------------------------------------


def test_std_specs_any_rank_number() -> None:
    assert parse_std("3", "-r") == Std.ALL
    assert parse_std("0:1,10:2", "-r") == {0: Std.OUT, 10: Std.ERR}
    assert resolve_std(parse_std("0:1,10:2", "-r"), 11, "-r") == {**dict.fromkeys(range(11), Std.NONE),
                                                                   0: Std.OUT, 10: Std.ERR}
    assert resolve_std(Std.ERR, 3, "-t") == {0: Std.ERR, 1: Std.ERR, 2: Std.ERR}
    for bad, msg in (("4", "is not RANK:VALUE"), ("0:4", "is not RANK:VALUE"), ("", "is empty"),
                     ("1:1,1:2", "twice"), ("a:1", "is not RANK:VALUE")):
        with pytest.raises(UsageError, match=msg):
            parse_std(bad, "-r")
    with pytest.raises(UsageError, match="names local rank 10, but this node runs 2 ranks"):
        resolve_std({10: Std.OUT}, 2, "-r")


def test_rank_lists() -> None:
    assert parse_rank_list("0,2-4, 7", "--ranks-filter") == {0, 2, 3, 4, 7}
    for bad in ("", "a", "3-1", "1,,2", "-1"):
        with pytest.raises(UsageError):
            parse_rank_list(bad, "--ranks-filter")


def test_signal_lists() -> None:
    assert parse_signals("SIGTERM,int, 10,SIGTERM") == (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    with pytest.raises(UsageError, match="is not a signal"):
        parse_signals("SIGNOPE")
    for sig in ("SIGKILL", "STOP", "SIGCHLD"):
        with pytest.raises(UsageError, match="cannot be handled"):
            parse_signals(sig)


def test_rendezvous_values() -> None:
    assert parse_rdzv_conf("timeout=900, join_timeout=10,") == {"timeout": "900", "join_timeout": "10"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_rdzv_conf("timeout")
    assert parse_endpoint("localhost:29400") == ("localhost", 29400)
    assert parse_endpoint("[::1]:5") == ("::1", 5)
    assert parse_endpoint("node1") == ("node1", None)


def test_routing_follows_torchruns_redirect_and_tee_rules() -> None:
    p = plan(3)
    # No log dir: console only.
    r = _routing(p, None, None, False, None, None, True)
    assert all(r.files[i] == Std.NONE and r.console[i] == Std.ALL for i in range(3))
    # A log dir alone: everything to files and console.
    r = _routing(p, None, None, True, None, None, True)
    assert all(r.files[i] == Std.ALL and r.console[i] == Std.ALL for i in range(3))
    # -r 0:1 -t 1:3: rank 0's stdout to its file only; rank 1 both, shown; rank 2 console only.
    r = _routing(p, {0: Std.OUT}, {1: Std.ALL}, True, None, None, True)
    assert (r.files[0], r.console[0]) == (Std.OUT, Std.ERR)
    assert (r.files[1], r.console[1]) == (Std.ALL, Std.ALL)
    assert (r.files[2], r.console[2]) == (Std.NONE, Std.ALL)
    # Filters: local rank 1 and global rank 2 → nothing shown (both must pass).
    r = _routing(p, None, None, False, frozenset({1, 2}), frozenset({2}), False)
    assert [r.console[i] for i in range(3)] == [Std.NONE, Std.NONE, Std.ALL]
    assert r.prefix is False
