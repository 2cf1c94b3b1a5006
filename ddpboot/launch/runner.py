"""Run a LaunchConfig (built by launch/config.py): block the handled signals, reserve the GPUs (plan and locks), bind
the store's socket, make the run directory, start the fast-start process, then supervise the workers (or the rounds
of an elastic job); the job's exit code. `plan_only` and `dry_run` go through the same planning and checks and start
nothing.

Everything taken is let go on every path, in one ExitStack: locks, socket, temporary directory, fast-start process.
Until the workers start, a stop signal ends the run with 128 + the signal's number and nothing left behind.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from ddpboot.contract import STACKS_SIGNAL, STOP_SIGNALS
from ddpboot.launch.config import LaunchConfig, PlanConfig, RunOptions
from ddpboot.launch.nodewatch import link_verdict, link_watch, node_link
from ddpboot.launch.preflight import ListenQueue, ensure_open_files, listen_queue
from ddpboot.launch.preview import DryRun, dry_run_workers, plan_json
from ddpboot.launch.rundir import job_dir, write_first
from ddpboot.launch.source_checks import isolation_note
from ddpboot.launch.spec import LaunchSpec, StoreBackend
from ddpboot.nodes.binding import BINDING_NOTE, on_launcher_cpus
from ddpboot.nodes.launcher import bind_node_store
from ddpboot.nodes.static import NodeSetup, cluster_info
from ddpboot.nodes.store_allow import store_allow_list
from ddpboot.selection.gpu import Inventory
from ddpboot.selection.inventory import load_inventory
from ddpboot.selection.ledger import failing_gpus
from ddpboot.selection.locks import GpuLocks, current_holders, lock_dir
from ddpboot.selection.planner import FAILING_NOTE, Plan, make_plan
from ddpboot.selection.request import Request
from ddpboot.tcpstore.owner import ensure_owner_check

if TYPE_CHECKING:
    from ddpboot.launch.faststart import FastStartProcess
    from ddpboot.nodes.watch import NodeLink


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


def stop_if_signalled(when: str = "before the start") -> None:
    """A stop signal that arrived while planning or waiting (blocked since block_early) ends the run before anything
    starts."""
    stops = STOP_SIGNALS & signal.sigpending()
    if stops:
        info = signal.sigtimedwait(stops, 0)
        if info is not None:
            raise StoppedBeforeStart(info.si_signo, when)


WAIT_NOTICE_AFTER = 5.0  # seconds a wait of the launcher lasts before it says what it waits for


class WaitTicker:
    """Called by a long wait of the launcher at least twice a second (the nodes' check-in): a stop signal ends the
    wait (StoppedBeforeStart: 130 for SIGINT, 143 for SIGTERM), and once the wait has lasted WAIT_NOTICE_AFTER s it
    says, once, what it waits for and how to end it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.since = clock()
        self.said = False

    def __call__(self, what: Callable[[], str]) -> None:
        stop_if_signalled("while waiting for the other nodes")
        if not self.said and self.clock() - self.since >= WAIT_NOTICE_AFTER:
            self.said = True
            say(f"{what()}; Ctrl-C (SIGINT) or SIGTERM ends the wait")


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
    locked = {u: h.describe() for u, h in held.items()}
    return _with_nodes(_plan_with(request, inventory, env, locked), nodes)


def _with_nodes(plan: Plan, nodes: NodeSetup) -> Plan:
    return replace(plan, cluster=cluster_info(nodes), notes=plan.notes + nodes.notes)


def check_capacity(nodes: NodeSetup, plan: Plan, store: StoreBackend, apply: bool) -> ListenQueue:
    """What the planned ranks need of this machine, the same for `plan`, a dry run and a run: open files for this
    node's ranks and, on node 0, for every rank's store connection (raised to the hard limit only with `apply`), and
    how the store listens. An elastic job sizes its store per round (launch/elastic/driver.py)."""
    if nodes.elastic:
        return ListenQueue()
    served = len(plan.ranks) * nodes.nnodes if nodes.node_rank == 0 else 0
    ensure_open_files(len(plan.ranks), served, nodes.nnodes, apply=apply)
    return listen_queue(served, nodes.nnodes, store)


def _ensure_owner_check(config: LaunchConfig, nodes: NodeSetup) -> None:
    """Where this node may serve the workers' store (node 0; any node of an elastic job, on its --local-addr), that
    store must be able to tell its owner's loopback connections from other users' (tcpstore/owner.py)."""
    if nodes.elastic:
        ensure_owner_check(nodes.master_addr, config.store)
    elif nodes.node_rank == 0:
        ensure_owner_check(config.store_address.bind_addr, config.store)


def plan_only(config: PlanConfig) -> Plan:
    """`ddpboot plan`: the plan a run with these options would get now, refused where the run would refuse it (with
    the run's default store: `plan` takes no --store)."""
    plan = preview_plan(config.request, config.nodes, config.env)
    check_capacity(config.nodes, plan, StoreBackend.parse(RunOptions.store, "--store"), apply=False)
    return plan


def dry_run(config: LaunchConfig) -> DryRun:
    """`--dry-run`: the plan and what the supervisor would run; every check of a run but the locks and the wait for
    GPUs, and nothing started."""
    plan = preview_plan(config.request, config.nodes, config.env)
    check_capacity(config.nodes, plan, config.store, apply=False)
    _ensure_owner_check(config, config.nodes)
    if config.store_address.port and config.nodes.node_rank == 0:  # a port in use is reported now, as the launch
        bind_node_store(config.nodes, config.store_address).close()
    spec = launch_spec(config, plan)
    return DryRun(plan, spec, dry_run_workers(plan, spec, config.env), config.notes)


def launch_spec(config: LaunchConfig, plan: Plan) -> LaunchSpec:
    """What the supervisor runs for this plan; the rank filters and stream maps are checked against it here."""
    store, output = config.store_address, config.output
    return LaunchSpec(**config.shared(), target=config.target, python=config.python, run_id=config.run_id,
                      routing=output.routing(plan), master_addr=store.master_addr, bind_addr=store.bind_addr,
                      master_port=store.port, store_allow=config.store_allow, log_dir=output.log_dir,
                      log_mode=output.log_mode)


def run(config: LaunchConfig, fast_start: FastStartProcess | None = None, gpus: Inventory | None = None) -> int:
    """Run the job; its exit code (the failing rank's, or 128 + a signal that stopped it before the start).
    `fast_start`: a fast-start process that is already running (the pytest plugin's), used and left running;
    otherwise `--fast-start` starts one for this run. `gpus`: the GPUs to plan with instead of the machine's (the
    pytest plugin's CPU tests: no NVML, no inventory, no GPU lock is read or taken)."""
    block_early(config.signals)
    try:
        return _run(config, fast_start, gpus)
    except StoppedBeforeStart as stop:
        print(f"ddpboot: {stop}", file=sys.stderr)
        return stop.exit_code


def _run(config: LaunchConfig, given_fast_start: FastStartProcess | None, gpus: Inventory | None) -> int:
    nodes, env = config.nodes, dict(config.env)
    with contextlib.ExitStack() as stack:  # the one owner of everything the run takes, the GPU locks included
        plan = _planned(config, stack, gpus)
        spec = launch_spec(config, plan)
        _ensure_owner_check(config, nodes)
        if nodes.elastic:  # --nnodes MIN:MAX: rounds of torch's c10d rendezvous, one Supervisor each
            from ddpboot.launch.elastic import run_elastic

            # What follows for a static job the driver does per round: it sizes and binds the round's store (no
            # allow-list: refused for elastic jobs) and makes the round's directory in the job's (rundir.job_dir).
            fast_start = stack.enter_context(_fast_start(config, plan, given_fast_start))
            return run_elastic(spec, plan, env, nodes, conf=config.rdzv_conf, fast_start=fast_start)
        stop_if_signalled()
        queue = check_capacity(nodes, plan, config.store, apply=True)  # before the store listens
        if queue.note is not None:
            say(f"note: {queue.note}")
        listener = bind_node_store(nodes, config.store_address, queue.sockets)
        stack.callback(listener.close)
        allow, allow_notes = store_allow_list(nodes, env, config.store_allow, config.store)
        for note in allow_notes:
            say(f"note: {note}")
        spec = replace(spec, store_allow=allow)
        where = job_dir(spec.log_dir, spec.run_id, spec.log_mode)
        if where.temporary:  # mkdtemp's 0700 whatever --log-mode says: error files, exit marks and stack dumps only
            stack.callback(shutil.rmtree, where.path, True)
        write_first(where.path, where.temporary, json.dumps(plan_json(plan), indent=2) + "\n")  # its plan
        if not where.temporary:
            say(f"logs in {where.path}")
        from ddpboot.launch.supervisor import Supervisor

        fast_start = stack.enter_context(_fast_start(config, plan, given_fast_start))
        link = stack.enter_context(node_link(config))  # before the supervisor: one of the launcher's own children
        return Supervisor(spec, plan, listener, env, where, fast_start=fast_start,
                          before_start=_node_check(config, plan, link),
                          watch=None if link is None else link_watch(link, len(plan.ranks)),
                          after_job=None if link is None else link_verdict(link)).run()


def _planned(config: LaunchConfig, stack: contextlib.ExitStack, gpus: Inventory | None = None) -> Plan:
    """The plan, its GPUs reserved (`stack` lets their locks go), and what the launcher says about it first."""
    for note in config.notes:
        say(f"note: {note}")
    plan, locks = _reserve(config) if gpus is None else (_plan_with(config.request, gpus, config.env, {}), None)
    if locks is not None:
        stack.callback(locks.release)
    for note in plan.notes:
        if note.startswith(BINDING_NOTE):  # an MPI binding narrower than the ranks (nodes/binding.py)
            say(f"note: {note}")
        elif FAILING_NOTE in note:  # a GPU the health ledger marked, named with --gpus
            say(f"warning: {note}")
    plan = _with_nodes(plan, config.nodes)
    for note in config.nodes.notes:
        say(f"note: {note}")
    _say_if_memory_unbound(plan)
    counted = isolation_note(plan, config.target, config.cwd)
    if counted:
        say(f"note: {counted}")
    return plan


def _say_if_memory_unbound(plan: Plan) -> None:
    """--numa-binding's memory half is a preference the kernel may refuse (procs/mempolicy.py): said once."""
    nodes = sorted({n for slot in plan.ranks for n in slot.mem_nodes})
    if not nodes:
        return
    from ddpboot.launch.procs.mempolicy import refused

    why = refused(nodes)
    if why is not None:
        say(f"note: the ranks are bound to their CPUs but their memory is not preferred from their NUMA nodes: "
            f"the kernel refuses it ({why}; in a container, CAP_SYS_NICE lets it)")


def _reserve(config: LaunchConfig) -> tuple[Plan, GpuLocks | None]:
    from ddpboot.selection.reserve import reserve

    env, request = config.env, config.request
    return reserve(
        lambda: load_inventory(env),
        lambda inventory, locked: _plan_with(config.request, inventory, config.env, locked),
        lock_dir(env),
        wait=config.wait_for_gpus,
        progress=say,
        share=request.share,
        sleep=sleep_unless_stopped,
    )


def _plan_with(request: Request, inventory: Inventory, env: Mapping[str, str], locked: Mapping[str, str]) -> Plan:
    """The plan of `request` on `inventory` with these GPUs held (`locked`) and the ledger's failing ones left out,
    on the CPUs the launcher may use."""
    failing = failing_gpus(inventory, env)
    return on_launcher_cpus(lambda cpus: make_plan(request, inventory, env, allowed_cpus=cpus, locked=locked,
                                                   failing=failing), env)


def _node_check(config: LaunchConfig, plan: Plan, link: NodeLink | None) -> Callable[[], None] | None:
    """Several nodes: before starting workers, every node checks in through node 0's store (nodes/check.py); then
    the node link starts watching the other nodes (launch/nodewatch.py)."""
    nodes = config.nodes
    if nodes.nnodes == 1 and link is None:
        return None
    from ddpboot.nodes.check import check_nodes
    from ddpboot.nodes.netprobe import NetCheck

    def check_in() -> None:
        if nodes.nnodes > 1:
            net = NetCheck(nodes.node_rank, nodes.nnodes, plan.backend, config.env) if config.network_check else None
            check_nodes(nodes.master_addr, nodes.master_port or 0, nodes.nnodes, nodes.node_rank, len(plan.ranks),
                        timeout=config.join_timeout, tick=WaitTicker(), hint=nodes.start_hint(), network=net)
        if link is not None:
            link.begin()

    return check_in


@contextlib.contextmanager
def _fast_start(
    config: LaunchConfig, plan: Plan, given: FastStartProcess | None = None
) -> Iterator[FastStartProcess | None]:
    """With --fast-start, the fast-start process (importing while the launcher finishes its own start-up), let go at
    the end; `given`, one already running, which stays; else None. It imports torch with the ranks'
    OMP_NUM_THREADS when they share one value (libgomp and OpenBLAS read it once, at import)."""
    if given is not None or not config.fast_start:
        yield given
        return
    from ddpboot.launch.faststart import FastStartError, FastStartProcess

    env = dict(config.env)
    threads = {env.get("OMP_NUM_THREADS") or str(max(s.omp_threads, 1)) for s in plan.ranks}
    if len(threads) == 1:
        env["OMP_NUM_THREADS"] = threads.pop()
    fast_start: FastStartProcess | None = None
    warm_session = None
    if config.warm:
        from ddpboot.launch.faststart import warm
        from ddpboot.launch.faststart.warmstart import WarmError

        try:
            fast_start = warm_session = warm.open_session(
                config.python, config.target, config.cwd, env, config.preloads, config.warm_idle, say,
                lambda: stop_if_signalled("while the warm process started"), config.signals, config.env)
        except (WarmError, FastStartError, OSError) as exc:
            say(f"note: no warm launch: {exc}; this launch starts cold (as --fast-start)")
    if fast_start is None:
        fast_start = FastStartProcess.start(config.python, config.target, config.cwd, env, config.preloads,
                                            config.signals)
    try:
        yield fast_start
    finally:
        died = warm_session is not None and warm_session.warm_died()
        fast_start.close()
        if warm_session is not None and died:
            say(f"warning: the warm process (pid {warm_session.warm_pid}) died during this launch (the launch "
                "itself went on); the next warm launch starts a fresh one")
