"""Each worker's command line and environment: torchrun's contract (the variables torchrun 2.13 sets for each
worker) plus the rank's GPUs. Pure.

Why LOCAL_RANK is 0 under rank isolation: the worker's CUDA_VISIBLE_DEVICES lists only its own GPU(s), so its GPU
is cuda:0, and an unmodified torchrun script doing `torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))`,
`model.to(local_rank)` and `DDP(model, device_ids=[local_rank])` must land there (torchrun's `--virtual-local-rank`
does the same). The true node-local index is DDPBOOT_LOCAL_RANK. Under `--isolation node` every worker sees the
node's selected GPUs and gets the true LOCAL_RANK, exactly as under torchrun.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ddpboot.contract import (
    ERROR_FILE_VAR,
    GPU_UUIDS_VAR,
    ISOLATION_VAR,
    LOCAL_RANK_VAR,
    RANK_STACKS_SIGNAL,
    STACKS_VAR,
    nccl_init_file,
    stacks_file,
    stacks_spec,
)
from ddpboot.launch.bootstrap import rank_command
from ddpboot.launch.pymain import TargetKind
from ddpboot.launch.spec import Target
from ddpboot.selection.planner import Plan, RankSlot

LOCAL_RANK_MACRO = "${local_rank}"

# NCCL's flight recorder with --log-dir: torch's own ring buffer of collectives, dumped per rank into the attempt
# directory when a collective times out (read with `torchfrtrace DIR`). Each entry: the names torch reads, newest
# first, each with the torch release that reads it from on; and the value. A user's value under any of an entry's
# names wins (ddpboot sets none of them then). ddpboot sets the newest name the workers' torch reads: torch prints
# a deprecation warning in every rank for an older name that has a newer one (TORCH_FR_BUFFER_SIZE and
# TORCH_FR_DUMP_TEMP_FILE from 2.11, TORCH_FR_DUMP_ON_TIMEOUT from 2.15); a torch of unknown release gets the
# oldest, which every release still reads.
FLIGHT_RECORDER: tuple[tuple[tuple[tuple[str, tuple[int, int]], ...], str], ...] = (
    ((("TORCH_FR_BUFFER_SIZE", (2, 11)), ("TORCH_NCCL_TRACE_BUFFER_SIZE", (0, 0))), "2000"),
    ((("TORCH_FR_DUMP_ON_TIMEOUT", (2, 15)), ("TORCH_NCCL_DUMP_ON_TIMEOUT", (0, 0))), "1"),
    ((("TORCH_FR_DUMP_TEMP_FILE", (2, 11)), ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", (0, 0))), "{dir}/nccl_trace_rank_"),
)
STRAGGLER_NCCL_VAR = "DDPBOOT_STRAGGLER_NCCL"
"""`1`: an NCCL job with --log-dir is watched for stragglers by its collectives' waits (observe/waits.py), for which
the ranks get NCCL_WAITS too (a user's value of one wins)."""
NCCL_WAITS = (("TORCH_NCCL_ENABLE_TIMING", "1"), ("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "{dir}/nccl_pipe_rank_"))
"""Each collective's time on the GPU, and a dump on demand, asked for through the rank's pipe."""


# NCCL's init timings for the start-up waterfall (observe/startup.py), with --log-dir, for a GPU rank: NCCL's INIT
# messages into a file beside the rank's error file. Unset, NCCL_DEBUG prints nothing, so the console is the same;
# a user's NCCL_DEBUG, NCCL_DEBUG_SUBSYS or NCCL_DEBUG_FILE wins (ddpboot sets none of them then).
NCCL_INIT_LOG = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"}
NCCL_INIT_LOG_VARS = (*NCCL_INIT_LOG, "NCCL_DEBUG_FILE")


def flight_recorder_name(names: Sequence[tuple[str, tuple[int, int]]], torch: tuple[int, int] | None) -> str:
    """The newest of `names` that torch release `torch` reads (None: unknown, the oldest)."""
    if torch is None:
        return names[-1][0]
    return next(name for name, since in names if torch >= since)


@dataclass(frozen=True)
class EnvContext:
    """What every worker of one attempt shares."""

    master_addr: str
    master_port: int
    run_id: str
    role: str = "default"
    restart_count: int = 0
    max_restarts: int = 0
    signals: str = ""  # TORCHELASTIC_SIGNALS_TO_HANDLE, as torchrun exports it
    trace_dir: str = ""  # where NCCL's flight recorder dumps (the attempt directory with --log-dir); "": not set
    torch: tuple[int, int] | None = None  # the workers' torch release, for FLIGHT_RECORDER's names; None: unknown


def worker_vars(
    plan: Plan, slot: RankSlot, ctx: EnvContext, base: Mapping[str, str], error_file: str
) -> dict[str, str]:
    """The variables ddpboot sets for this worker (what `--dry-run` prints); the worker gets `base` plus these."""
    out = {
        "RANK": str(slot.rank),
        "LOCAL_RANK": str(plan.isolation.exported_local_rank(slot.local_rank)),
        "WORLD_SIZE": str(plan.world_size),
        "LOCAL_WORLD_SIZE": str(plan.local_world_size),
        "GROUP_RANK": str(plan.node_rank),
        "GROUP_WORLD_SIZE": str(plan.nnodes),
        "ROLE_RANK": str(slot.rank),
        "ROLE_NAME": ctx.role,
        "ROLE_WORLD_SIZE": str(plan.world_size),
        "MASTER_ADDR": ctx.master_addr,
        "MASTER_PORT": str(ctx.master_port),
        "TORCHELASTIC_RUN_ID": ctx.run_id,
        "TORCHELASTIC_RESTART_COUNT": str(ctx.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(ctx.max_restarts),
        # Every worker, rank 0 included, is a client of the store the launcher serves.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": base.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        ERROR_FILE_VAR: error_file,
        # The rank's share of the cores unless the user chose (torchrun: 1 for several workers).
        "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS") or str(max(slot.omp_threads, 1)),
        "CUDA_VISIBLE_DEVICES": slot.cuda_visible_devices,
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        LOCAL_RANK_VAR: str(slot.local_rank),
        GPU_UUIDS_VAR: ",".join(g.uuid for g in slot.gpus),
        ISOLATION_VAR: plan.isolation.value,
        STACKS_VAR: stacks_spec(RANK_STACKS_SIGNAL, str(stacks_file(error_file))),
    }
    if ctx.signals:
        out["TORCHELASTIC_SIGNALS_TO_HANDLE"] = ctx.signals
    if ctx.trace_dir:
        for names, value in FLIGHT_RECORDER:
            if not any(n in base for n, _ in names):
                out[flight_recorder_name(names, ctx.torch)] = value.format(dir=ctx.trace_dir)
        if slot.gpus and not any(n in base for n in NCCL_INIT_LOG_VARS):
            out.update(NCCL_INIT_LOG, NCCL_DEBUG_FILE=str(nccl_init_file(error_file)))
        if base.get(STRAGGLER_NCCL_VAR) == "1":
            out.update({name: value.format(dir=ctx.trace_dir) for name, value in NCCL_WAITS if name not in base})
    return out


def worker_env(base: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    env = dict(base)
    env.update(own)
    return env


def substitute_local_rank(args: Sequence[str], local_rank: int) -> list[str]:
    """torchrun's `${local_rank}` macro in the script's arguments, replaced by the true node-local index.

    Only the literal `${local_rank}` is replaced (torchrun's string.Template also rewrites `$local_rank` and `$$`,
    which would change arguments that merely contain a dollar sign)."""
    return [a.replace(LOCAL_RANK_MACRO, str(local_rank)) for a in args]


def worker_argv(target: Target, python: str, local_rank: int) -> list[str]:
    """One worker's command as torchrun runs it (`python -u SCRIPT ARGS`, pymain.TargetKind.shown): what `--dry-run`
    and the failure report show. A Python rank is started through the rank bootstrap instead (exec_command), which
    runs exactly this."""
    return TargetKind(target.kind).shown(python, target.name, substitute_local_rank(target.args, local_rank))


def exec_command(target: Target, python: str, local_rank: int, env: Mapping[str, str]
                 ) -> tuple[list[str], dict[str, str]]:
    """What is exec'd, with which environment, for this worker: a Python target's runs through the rank bootstrap
    (launch/bootstrap.py: faulthandler on the stacks signal, then the script as python runs it; its command line
    names the script as worker_argv's does); a `--no-python` program is exec'd as worker_argv shows it."""
    kind = TargetKind(target.kind)
    if not kind.is_python:
        return worker_argv(target, python, local_rank), dict(env)
    command, carrier = rank_command(python, kind, target.name, substitute_local_rank(target.args, local_rank))
    return command, {**env, **carrier}
