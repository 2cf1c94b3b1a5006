"""`init()`: find the environment that started this process, choose the device, join (or adopt) the process group.

The environment object (`ddpboot.cluster`) answers every launcher-specific question -- ranks, store address,
which visible GPU is this rank's, isolation, whether CUDA_VISIBLE_DEVICES must be narrowed, whether torchrun's
variables must be exported -- so nothing here branches on which launcher it was.
"""

from __future__ import annotations

import atexit
import os
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ddpboot.cluster import ClusterEnvironment, LocalEnvironment, detect_environment, plugin_failures
from ddpboot.cluster.placement import Where, host_identity, place
from ddpboot.contract import STACKS_VAR, register_stacks
from ddpboot.errors import WorkerEnvError, WorkerSetupError
from ddpboot.worker.backend import check_backend_usable, normalize_backend, uses_nccl
from ddpboot.worker.context import STATE, Context
from ddpboot.worker.device import choose_device
from ddpboot.worker.exiting import RECORDER, shutdown_at_exit
from ddpboot.worker.guards import check_visible_devices, note


def init(
    backend: str | None = None,
    timeout: float | timedelta | None = None,
    strict: bool = False,
    environment: ClusterEnvironment | type[ClusterEnvironment] | None = None,
) -> Context:
    """Join the job this process belongs to and return its `Context`; a second call returns the same one.

    backend: None picks nccl when this rank has a GPU and gloo otherwise; any torch.distributed backend name (or a
      composite like `cpu:gloo,cuda:nccl`) overrides it.
    timeout: seconds (or a timedelta) for collectives and the rendezvous; None keeps torch's default.
    strict: pitfall guards raise a `ddpboot.PitfallError` subclass instead of warning with `DdpbootWarning`.
    environment: a `ddpboot.cluster.ClusterEnvironment` (an instance, or a subclass, built from os.environ) that
      says where this process's ranks come from, instead of detecting the launcher (ddpboot.cluster's order).

    The device is chosen and `torch.cuda.set_device` called before `init_process_group`, so NCCL and every later
    `.cuda()` land on this rank's GPU. `ddpboot.shutdown()` runs at exit. Under ddpboot's launcher, faulthandler
    is registered on the signal the launcher sends for a stack dump (ddpboot/contract.py STACKS_VAR).
    """
    with STATE.lock:
        if STATE.context is not None:
            if backend is not None and normalize_backend(backend) != STATE.context.backend:
                raise WorkerSetupError(
                    f"ddpboot.init(backend={backend!r}) after an earlier init() chose backend "
                    f"{STATE.context.backend!r}: a process has one default process group. Fix: call init() once, "
                    "or ddpboot.shutdown() first."
                )
            return STATE.context
        requested = normalize_backend(backend) if backend is not None else None
        chosen = _given_environment(environment)
        register_stacks(os.environ.get(STACKS_VAR))  # `ddpboot stacks` without py-spy (observe/stacks/collect.py)
        STATE.context, STATE.owns_group = _start(requested, _as_timedelta(timeout), strict, chosen)
        if not STATE.atexit_registered:
            RECORDER.install()
            atexit.register(shutdown_at_exit)
            STATE.atexit_registered = True
        return STATE.context


def current_environment() -> ClusterEnvironment | None:
    """The environment that started this process, or None without a launcher. Once init() has exported the
    torchrun contract itself (under srun) the first answer is kept (see `WorkerState.kept_environment`)."""
    if STATE.kept_environment is not None:
        return STATE.kept_environment
    return detect_environment()


def _as_timedelta(timeout: float | timedelta | None) -> timedelta | None:
    if timeout is None or isinstance(timeout, timedelta):
        return timeout
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise WorkerSetupError(
            f"ddpboot.init(timeout={timeout!r}): give a positive number of seconds or a datetime.timedelta."
        )
    return timedelta(seconds=float(timeout))


def _given_environment(given: object) -> ClusterEnvironment | None:
    """init(environment=...): an instance as it is, a subclass built from os.environ; checked before anything."""
    if given is None or isinstance(given, ClusterEnvironment):
        return given
    if isinstance(given, type) and issubclass(given, ClusterEnvironment):
        return given(os.environ)
    raise WorkerSetupError(
        f"ddpboot.init(environment={given!r}): give a ddpboot.cluster.ClusterEnvironment instance or subclass. "
        "Fix: pass environment=None to detect the launcher, or your ClusterEnvironment subclass."
    )


def _start(
    requested: str | None, timeout: timedelta | None, strict: bool, given: ClusterEnvironment | None
) -> tuple[Context, bool]:
    """The new Context, and whether init() created (and so owns) the process group."""
    env = given if given is not None else _joined_environment()
    _report(env)
    check_visible_devices(env, strict)
    device, uuids = choose_device(env, strict)
    backend, owns_group = _join_group(env, requested, timeout, device)
    if env.placed_by_hosts and dist.is_available() and dist.is_initialized():
        _place_by_hosts(env)
    ctx = Context(
        rank=env.global_rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        local_world_size=env.local_world_size,
        node_rank=env.node_rank,
        device=device,
        backend=backend,
        gpu_uuids=tuple(uuids),
        launcher=env.name,
        strict=strict,
    )
    return ctx, owns_group


def _report(env: ClusterEnvironment) -> None:
    """One DdpbootWarning per assumption the environment made, and per plugin that could not be loaded (once)."""
    failures = () if STATE.plugins_reported else plugin_failures()
    STATE.plugins_reported = STATE.plugins_reported or bool(failures)
    for message in (*failures, *env.notes):
        note(message)


def _joined_environment() -> ClusterEnvironment:
    """The detected launcher's environment; without one, the script's own process group (mp.spawn style, one node)
    or a world of one."""
    env = current_environment()
    if env is not None:
        return env
    if dist.is_available() and dist.is_initialized():
        return LocalEnvironment.from_group(dist.get_rank(), dist.get_world_size())
    return LocalEnvironment(os.environ)


def _join_group(
    env: ClusterEnvironment, requested: str | None, timeout: timedelta | None, device: torch.device
) -> tuple[str | None, bool]:
    """(backend of the process group, None without one; whether init() created it)."""
    chosen = requested or ("nccl" if device.type == "cuda" else "gloo")
    needs_group = env.joins_group or (dist.is_available() and dist.is_initialized())
    if requested is not None or needs_group:  # an impossible request fails in plain python too
        check_backend_usable(chosen, device)
    if not needs_group:
        return None, False  # a world of one needs no process group
    if env.exports_contract:
        _export_contract(env, device)
        STATE.kept_environment = env
    if dist.is_initialized():  # the script made its own group: adopt it, leave it to the script to destroy
        if (dist.get_rank(), dist.get_world_size()) != (env.global_rank, env.world_size):
            raise WorkerEnvError(
                f"a process group already exists with rank {dist.get_rank()} of {dist.get_world_size()}, but "
                f"the environment says rank {env.global_rank} of {env.world_size}. Fix: drop the script's own "
                "init_process_group() call and let ddpboot.init() create the group."
            )
        return str(dist.get_backend()), False
    kwargs: dict[str, Any] = {}
    if timeout is not None:
        kwargs["timeout"] = timeout
    if device.type == "cuda" and uses_nccl(chosen):
        kwargs["device_id"] = device  # binds NCCL to this GPU: eager communicator, barrier on the right GPU
    dist.init_process_group(chosen, init_method="env://", rank=env.global_rank, world_size=env.world_size, **kwargs)
    return chosen, True


def _export_contract(env: ClusterEnvironment, device: torch.device) -> None:
    """Publish torchrun's variables so env:// rendezvous, and code that reads them later, see this rank's place.
    As under ddpboot's rank isolation, LOCAL_RANK is the index of the rank's GPU among those it sees."""
    os.environ.update(
        {
            "MASTER_ADDR": str(env.main_address),
            "MASTER_PORT": str(env.main_port),
            "RANK": str(env.global_rank),
            "WORLD_SIZE": str(env.world_size),
            "LOCAL_RANK": str(device.index if device.type == "cuda" else env.local_rank),
            "LOCAL_WORLD_SIZE": str(env.local_world_size),
            "GROUP_RANK": str(env.node_rank),
            "GROUP_WORLD_SIZE": str(env.nnodes),
        }
    )
    os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # no agent hosts a store here: worker rank 0 does


def _place_by_hosts(env: ClusterEnvironment) -> None:
    """The node rank and count from every rank's host (cluster/placement.py), and GROUP_RANK / GROUP_WORLD_SIZE
    with them where init() exported torchrun's variables."""
    mine = Where(host_identity(), env.local_rank, env.local_world_size)
    everyone: list[object] = [None] * env.world_size
    dist.all_gather_object(everyone, tuple(mine))
    ranks = [Where(*w) for w in everyone]  # type: ignore[misc]
    found = place(ranks, env.global_rank, {"mpi": "mpirun", "lsf": "jsrun"}.get(env.name, env.name))
    env.place(found.node_rank, found.nnodes)
    if env.exports_contract:
        os.environ.update(GROUP_RANK=str(found.node_rank), GROUP_WORLD_SIZE=str(found.nnodes))
