"""The worker environment and command line the launcher builds (ddpboot/launch/env.py): pure functions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ddpboot.launch.bootstrap import BOOTSTRAP_VAR, LAUNCH, bootstrap, rank_command
from ddpboot.launch.env import (
    EnvContext,
    exec_command,
    substitute_local_rank,
    worker_argv,
    worker_vars,
)
from ddpboot.launch.pymain import RUN_PATH_CODE, TargetKind
from ddpboot.launch.spec import Target
from ddpboot.selection.inventory import fake_inventory
from ddpboot.selection.planner import Plan, make_plan
from ddpboot.selection.request import parse_request
from tests.support import launch_spec

CONTRACT = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
    "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCHELASTIC_ERROR_FILE", "OMP_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "DDPBOOT_LOCAL_RANK", "DDPBOOT_GPU_UUIDS", "DDPBOOT_ISOLATION",
    "DDPBOOT_STACKS",
}
CTX = EnvContext("127.0.0.1", 41234, "run-1", "trainer", 2, 3, "SIGTERM,SIGINT")


def plan(n: int = 4, gpus: int = 8, **req: Any) -> Plan:
    return make_plan(parse_request(nproc=str(n), **req), fake_inventory(str(gpus)), {}, cpu_count=16)


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


@pytest.mark.parametrize("kind", ["script", "module", "run_path", "binary"])
def test_a_python_rank_is_execd_through_the_bootstrap_with_its_own_words(kind: str) -> None:
    py = "/opt/py/bin/python3"
    target = Target(kind, "t.py" if kind != "module" else "pkg.t", ("-m", "-u", "${local_rank}", "-c"))  # type: ignore[arg-type]
    shown = worker_argv(target, py, 3)
    got, env = exec_command(target, py, 3, {"HOME": "/h"})
    if kind == "binary":
        assert got == shown == ["t.py", "-m", "-u", "3", "-c"] and env == {"HOME": "/h"}
        return
    assert (got, env) == (rank_command(py, kind, target.name, ["-m", "-u", "3", "-c"])[0],
                          {"HOME": "/h", **rank_command(py, kind, target.name, [])[1]})
    words = ["-m", "pkg.t"] if kind == "module" else ["t.py"]
    assert got == [py, "-u", "-c", LAUNCH, *words, "-m", "-u", "3", "-c"]  # the words python would be given
    assert env[BOOTSTRAP_VAR] == bootstrap(TargetKind(kind))


def test_a_ranks_command_line_is_short_and_names_the_script() -> None:
    """ps, top and py-spy show a rank by its command line: the script's name comes within its first 100
    characters, whatever the bootstrap holds."""
    argv, _ = rank_command("/usr/bin/python3", "script", "train.py", ["--lr", "3"])
    line = " ".join(argv)
    assert len(line) < 100 and line.endswith(" train.py --lr 3"), line


def test_the_bootstrap_takes_only_python_kinds() -> None:
    with pytest.raises(ValueError, match="binary"):
        rank_command("python", "binary", "x", [])


@given(st.lists(st.text(max_size=20), max_size=5), st.integers(0, 1000))
def test_only_the_local_rank_macro_is_replaced(args: list[str], rank: int) -> None:
    out = substitute_local_rank(args, rank)
    assert [a.replace("${local_rank}", str(rank)) for a in args] == out


def test_every_rank_gets_its_own_stacks_file_beside_its_error_file() -> None:
    from ddpboot.contract import RANK_STACKS_SIGNAL

    specs = [env["DDPBOOT_STACKS"] for env in all_vars(plan(2))]
    assert specs == [f"{int(RANK_STACKS_SIGNAL)}:/logs/rank{r}.stacks" for r in range(2)]


def test_flight_recorder_with_a_log_dir_unless_the_user_set_it() -> None:
    from dataclasses import replace

    p = plan(1)
    slot = p.ranks[0]
    assert not [k for k in worker_vars(p, slot, CTX, {}, "/e") if "DUMP" in k]  # no --log-dir: nothing
    traced = replace(CTX, trace_dir="/logs/run/attempt_0")
    names = {}
    newest = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE")
    oldest = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    between = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE")  # 2.11 to 2.14
    for torch, expected in (((2, 13), between), ((2, 15), newest), ((3, 0), newest), ((2, 10), oldest),
                            (None, oldest)):
        env = worker_vars(p, slot, replace(traced, torch=torch), {}, "/e")
        names[torch] = {k: v for k, v in env.items() if k.startswith(("TORCH_FR_", "TORCH_NCCL_"))
                        and k != "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
        assert sorted(names[torch]) == sorted(expected), torch  # one name each, the newest this torch reads
        assert [names[torch][k] for k in expected] == ["2000", "1", "/logs/run/attempt_0/nccl_trace_rank_"]
    # a user's value under any name of an entry wins: ddpboot sets no other name of it
    for mine in ({"TORCH_FR_DUMP_ON_TIMEOUT": "0"}, {"TORCH_NCCL_DUMP_ON_TIMEOUT": "0"}):
        for torch in ((2, 13), (2, 15), None):
            env = worker_vars(p, slot, replace(traced, torch=torch), mine, "/e")
            assert "TORCH_FR_DUMP_ON_TIMEOUT" not in env and "TORCH_NCCL_DUMP_ON_TIMEOUT" not in env, (mine, torch)
    mine = worker_vars(p, slot, replace(traced, torch=(2, 13)),
                       {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_FR_DUMP_TEMP_FILE": "/x/"}, "/e")
    assert "TORCH_FR_BUFFER_SIZE" not in mine and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in mine
    assert mine["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"


def test_the_straggler_watch_of_an_nccl_job_asks_for_timing_and_a_pipe_when_asked_for() -> None:
    from dataclasses import replace

    p = plan(1)
    slot = p.ranks[0]
    traced = replace(CTX, trace_dir="/logs/run/attempt_0")
    waits = ("TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    assert not [k for k in worker_vars(p, slot, traced, {}, "/e") if k in waits]
    assert not [k for k in worker_vars(p, slot, CTX, {"DDPBOOT_STRAGGLER_NCCL": "1"}, "/e") if k in waits]  # no dir
    env = worker_vars(p, slot, traced, {"DDPBOOT_STRAGGLER_NCCL": "1"}, "/e")
    assert [env[k] for k in waits] == ["1", "/logs/run/attempt_0/nccl_pipe_rank_"]
    mine = worker_vars(p, slot, traced, {"DDPBOOT_STRAGGLER_NCCL": "1", "TORCH_NCCL_ENABLE_TIMING": "0"}, "/e")
    assert "TORCH_NCCL_ENABLE_TIMING" not in mine and "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" in mine  # the user's wins


def test_the_flight_recorder_names_follow_the_workers_torch(tmp_path: Path) -> None:
    """The workers' torch release only where they run the launcher's own interpreter; any other interpreter
    (PYTHON_EXEC) or a binary may carry another torch: unknown, so the oldest names, which every release reads."""

    from ddpboot.launch.supervisor.workers import installed_torch, workers_torch

    own = launch_spec()
    assert workers_torch(own) == installed_torch() is not None
    other = tmp_path / "python3"
    other.symlink_to("/bin/true")
    assert workers_torch(launch_spec(python=str(other))) is None
    assert workers_torch(launch_spec(target=Target("binary", "train"))) is None


def test_the_torch_release_comes_from_the_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher reads the release from the package metadata instead of importing torch."""
    import importlib.metadata

    from ddpboot.launch.supervisor.workers import installed_torch

    for version, expected in (("2.10.1", (2, 10)), ("2.15.0+cu130", (2, 15)), ("3.0.0", (3, 0)), ("local", None)):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=version: v)
        installed_torch.cache_clear()
        assert installed_torch() == expected, version

    def absent(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", absent)
    installed_torch.cache_clear()
    assert installed_torch() is None
    monkeypatch.undo()
    installed_torch.cache_clear()


def test_nccl_s_init_log_with_a_log_dir_for_a_gpu_rank_unless_the_user_set_nccl_debug() -> None:
    from dataclasses import replace

    traced = replace(CTX, trace_dir="/logs/run/attempt_0")
    p = plan(1)
    nccl = {k: v for k, v in worker_vars(p, p.ranks[0], traced, {}, "/e/rank0.error.json").items()
            if k.startswith("NCCL_")}
    assert nccl == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", "NCCL_DEBUG_FILE": "/e/rank0.error.json.nccl"}
    assert not [k for k in worker_vars(p, p.ranks[0], CTX, {}, "/e") if k.startswith("NCCL_")]  # no --log-dir
    cpu = plan(1, cpu=True)
    assert not [k for k in worker_vars(cpu, cpu.ranks[0], traced, {}, "/e") if k.startswith("NCCL_")]
    for mine in ({"NCCL_DEBUG": "WARN"}, {"NCCL_DEBUG_SUBSYS": "ALL"}, {"NCCL_DEBUG_FILE": "/x"}):
        assert not [k for k in worker_vars(p, p.ranks[0], traced, mine, "/e") if k.startswith("NCCL_")], mine
