"""Run a LaunchConfig: reserve the GPUs (plan and locks), bind the store's socket, make the run directory, start the
fast-start process, then supervise the workers (or the rounds of an elastic job); the job's exit code.

Everything taken is let go on every path, in one ExitStack: locks, socket, temporary directory, fast-start process.
Until the workers start, a stop signal ends the run with 128 + the signal's number and nothing left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from ddpboot.contract import STACKS_SIGNAL, STOP_SIGNALS
from ddpboot.launch.config import LaunchConfig
from ddpboot.launch.logs import run_dir
from ddpboot.launch.preflight import ensure_open_files, listen_queue
from ddpboot.launch.source_checks import isolation_note
from ddpboot.launch.spec import LaunchSpec
from ddpboot.nodes.launcher import bind_node_store, new_run_id
from ddpboot.nodes.static import NodeSetup, cluster_info
from ddpboot.nodes.store_allow import store_allow_list
from ddpboot.selection.inventory import load_inventory
from ddpboot.selection.locks import GpuLocks, current_holders, lock_dir
from ddpboot.selection.planner import Plan, make_plan
from ddpboot.selection.request import Request

if TYPE_CHECKING:
    from ddpboot.launch.faststart import FastStartProcess


class StoppedBeforeStart(Exception):
    """A stop signal arrived before any worker started."""

    def __init__(self, signo: int, when: str) -> None:
        super().__init__(f"{signal.Signals(signo).name} {when}: nothing was started")
        self.exit_code = 128 + signo


def say(message: str) -> None:
    """A line from the launcher itself, on stderr (stdout belongs to the workers)."""
    print(f"ddpboot: {message}", file=sys.stderr, flush=True)


def block_early(signals: tuple[signal.Signals, ...]) -> None:
    """Block the handled signals and SIGCHLD now, before planning, for every thread to come.

    Why here: NVML (libnvidia-ml) leaves a thread of its own in the launcher even after nvmlShutdown (seen on
    2×H200: a thread named `cuda00001800007`), and a thread inherits its creator's signal mask. A process-directed
    signal goes to any thread that does not block it: a SIGCHLD taken by NVML's thread is discarded (the
    supervisor would never learn that a worker exited) and a SIGTERM kills the launcher with its default action.
    Blocked everywhere, they wait for the supervisor's signalfd. Until then, a stop signal is seen by
    `sleep_unless_stopped` while waiting for GPUs; planning otherwise takes well under a second."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {*signals, STACKS_SIGNAL, signal.SIGCHLD})


def stop_if_signalled() -> None:
    """A stop signal that arrived while planning (blocked since block_early) ends the run before anything starts."""
    stops = STOP_SIGNALS & signal.sigpending()
    if stops:
        info = signal.sigtimedwait(stops, 0)
        if info is not None:
            raise StoppedBeforeStart(info.si_signo, "before the start")


def sleep_unless_stopped(seconds: float) -> None:
    """Sleep while waiting for GPUs; a blocked stop signal ends the wait and the run."""
    stops = STOP_SIGNALS & signal.pthread_sigmask(signal.SIG_BLOCK, [])
    if not stops:
        time.sleep(seconds)
        return
    info = signal.sigtimedwait(stops, seconds)
    if info is not None:
        raise StoppedBeforeStart(info.si_signo, "while waiting for GPUs")


def preview_plan(request: Request, nodes: NodeSetup, env: Mapping[str, str]) -> Plan:
    """The plan this node would run now, from the request and the environment (inventory, CUDA_VISIBLE_DEVICES,
    GPUs other ddpboot jobs hold, the node setup). Takes no lock: `ddpboot plan` and a dry run."""
    inventory = load_inventory(env)
    held = current_holders([u.uuid for u in inventory.units()], lock_dir(env))
    plan = make_plan(
        request,
        inventory,
        env,
        allowed_cpus=sorted(os.sched_getaffinity(0)),
        locked={u: h.describe() for u, h in held.items()},
    )
    return _with_nodes(plan, nodes)


def _with_nodes(plan: Plan, nodes: NodeSetup) -> Plan:
    return replace(plan, cluster=cluster_info(nodes), notes=plan.notes + nodes.notes)


def launch_spec(config: LaunchConfig, plan: Plan) -> LaunchSpec:
    """What the supervisor runs for this plan; the rank filters and stream maps are checked against it here."""
    store = config.store_address
    return LaunchSpec(
        target=config.target,
        python=config.python,
        run_id=config.given_run_id or new_run_id(config.nodes, config.env),
        role=config.role,
        max_restarts=config.max_restarts,
        shutdown_timeout=config.shutdown_timeout,
        monitor_interval=config.monitor_interval,
        routing=config.output.routing(plan),
        signals=config.signals,
        master_addr=store.master_addr,
        bind_addr=store.bind_addr,
        master_port=store.port,
        store=config.store,
    )


def check_store_port(config: LaunchConfig) -> None:
    """A dry run reports a port in use now, as the launch would."""
    if config.store_address.port and config.nodes.node_rank == 0:
        bind_node_store(config.nodes, config.store_address).close()


def run(config: LaunchConfig) -> int:
    """Run the job; its exit code (the failing rank's, or 128 + a signal that stopped it before the start)."""
    try:
        return _run(config)
    except StoppedBeforeStart as stop:
        print(f"ddpboot: {stop}", file=sys.stderr)
        return stop.exit_code


def _run(config: LaunchConfig) -> int:
    nodes, env = config.nodes, dict(config.env)
    with contextlib.ExitStack() as stack:
        plan, locks = _reserve(config)
        if locks is not None:
            stack.callback(locks.release)
        plan = _with_nodes(plan, nodes)
        for note in nodes.notes:
            say(f"note: {note}")
        counted = isolation_note(plan, config.target, config.cwd)
        if counted:
            say(f"note: {counted}")
        spec = launch_spec(config, plan)
        log_dir = config.output.log_dir
        if nodes.source == "elastic":  # --nnodes MIN:MAX: rounds of torch's c10d rendezvous, one Supervisor each
            from ddpboot.launch.elastic import run_elastic

            fast_start = stack.enter_context(_fast_start(config, plan))
            return run_elastic(spec, plan, env, nodes, locks=locks, rdzv_id=config.rdzv_id,
                               rdzv_backend=config.rdzv_backend, rdzv_conf=dict(config.rdzv_conf),
                               max_restarts=config.max_restarts, log_dir=str(log_dir) if log_dir else None,
                               supervisor_kwargs={"fast_start": fast_start, "log_mode": config.output.log_mode,
                                                  "stall_timeout": config.stall_timeout})
        stop_if_signalled()
        # before the store listens: room for this node's ranks and, on node 0, every rank's store connection
        served = len(plan.ranks) * nodes.nnodes if nodes.node_rank == 0 else 0
        ensure_open_files(len(plan.ranks), served, nodes.nnodes)
        queue = listen_queue(served, nodes.nnodes, config.store)
        if queue.note is not None:
            say(f"note: {queue.note}")
        listener = bind_node_store(nodes, config.store_address, queue.sockets)
        stack.callback(listener.close)
        allow, allow_notes = store_allow_list(nodes, env, config.store_allow, config.store)
        for note in allow_notes:
            say(f"note: {note}")
        if log_dir is not None:
            workdir, temporary = run_dir(log_dir, spec.run_id, config.output.log_mode), False
            say(f"logs in {workdir}")
        else:  # mkdtemp makes it 0700 whatever --log-mode says: it holds the error files and exit marks only
            workdir, temporary = Path(tempfile.mkdtemp(prefix="ddpboot-")), True
            stack.callback(shutil.rmtree, workdir, True)
        from ddpboot.launch.supervisor import Supervisor

        fast_start = stack.enter_context(_fast_start(config, plan))
        supervisor = Supervisor(spec, plan, listener, env, workdir, temporary,
                                before_start=_node_check(config, plan), fast_start=fast_start,
                                log_mode=config.output.log_mode, store_allow=allow,
                                stall_timeout=config.stall_timeout)
        return supervisor.run()


def _reserve(config: LaunchConfig) -> tuple[Plan, GpuLocks | None]:
    from ddpboot.selection.reserve import reserve

    env, request = config.env, config.request
    cpus = sorted(os.sched_getaffinity(0))
    return reserve(
        lambda: load_inventory(env),
        lambda inventory, locked: make_plan(request, inventory, env, allowed_cpus=cpus, locked=locked),
        lock_dir(env),
        wait=config.wait_for_gpus,
        progress=say,
        share=request.share,
        sleep=sleep_unless_stopped,
    )


def _node_check(config: LaunchConfig, plan: Plan) -> Callable[[], None] | None:
    """Several nodes: before starting workers, every node checks in through node 0's store (nodes/check.py)."""
    nodes = config.nodes
    if nodes.nnodes == 1:
        return None
    from ddpboot.nodes.check import check_nodes

    def check_in() -> None:
        check_nodes(nodes.master_addr, nodes.master_port or 0, nodes.nnodes, nodes.node_rank, len(plan.ranks),
                    timeout=config.join_timeout, progress=say)

    return check_in


@contextlib.contextmanager
def _fast_start(config: LaunchConfig, plan: Plan) -> Iterator[FastStartProcess | None]:
    """With --fast-start, the fast-start process (importing while the launcher finishes starting), let go at the
    end; else None. It imports torch with the ranks' OMP_NUM_THREADS when they share one value (libgomp and
    OpenBLAS read it once, at import)."""
    if not config.fast_start:
        yield None
        return
    from ddpboot.launch.faststart import FastStartProcess

    env = dict(config.env)
    threads = {env.get("OMP_NUM_THREADS") or str(max(s.omp_threads, 1)) for s in plan.ranks}
    if len(threads) == 1:
        env["OMP_NUM_THREADS"] = threads.pop()
    fast_start = FastStartProcess.start(config.python, config.target, config.cwd, env, config.preloads)
    try:
        yield fast_start
    finally:
        fast_start.close()
