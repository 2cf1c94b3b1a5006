"""A job of several hosts from one command: `ddpboot --hostfile FILE ...` or `--hosts h1:N,h2:N` starts one launcher
per host (over the real ssh client, or directly on this host when it is one of them), each a node of one job, and
stays their one console until every host has ended. The hosts and their options are nodes/hostfile.py's, the ssh
command nodes/ssh.py's, the rules (output, failures, signals, the exit code) nodes/hostjob.py's; the other end of
each connection is cli/remote.py and launch/tether.py.

Every guarantee of a node holds per host, because each host runs an ordinary ddpboot launcher with `--nnodes N
--node-rank R --master-addr NODE0 --master-port P`: its ranks' output prefixed, its supervision, its node link
(one host's failure ends every host with the root cause's code). What this module adds is the tie between this
command and them: a stop signal here reaches every host's launcher through its tether, and when this command or
its connection to a host dies, that host's launcher sees its stdin end and stops its ranks.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ddpboot.contract import TORCHRUN_MASTER_PORT
from ddpboot.errors import UsageError
from ddpboot.launch.config import NodeOptions, RunOptions, SelectionOptions, build, parse_selection
from ddpboot.launch.tether import hello_line
from ddpboot.nodes.hostfile import Host, HostList, HostOptions, check_counts, host_selection, read_hosts
from ddpboot.nodes.hostjob import ERROR, HostJob, Kill, Say, Send
from ddpboot.nodes.ssh import (
    MARKER,
    SshOptions,
    connect_failure,
    forwarded_env,
    is_local,
    local_argv,
    node_args,
    remote_command,
    ssh_argv,
    ssh_options,
)
from ddpboot.nodes.static import check_port
from ddpboot.tcpstore.address import is_loopback

STOP_MARGIN = 15.0  # seconds past the shutdown timeout that hosts asked to stop get before their connection ends
PROBE_TIMEOUT = 120.0  # seconds `ddpboot plan` waits for every host's answer
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass(frozen=True)
class HostSpec:
    host: Host
    node: int
    argv: tuple[str, ...]
    local: bool  # this machine: started without ssh

    def shown(self) -> str:
        return shlex.join(self.argv)


@dataclass(frozen=True)
class HostsJob:
    specs: tuple[HostSpec, ...]
    hello: bytes  # what every host's launcher reads first (launch/tether.py)
    variables: tuple[str, ...]  # the names of the variables it carries
    source: str  # the hostfile, or --hosts
    master: tuple[str, int | None]  # node 0's store address (one host, no port asked for: bound at launch)
    ssh: SshOptions
    cwd: Path
    kill_after: float = 30.0 + STOP_MARGIN


def plan_hosts(options: RunOptions, forwarded: Sequence[str], env: Mapping[str, str], cwd: Path,
               version: str) -> HostsJob:
    """The job of `options` on its hosts, every option checked here first (as a one-node run of this host would
    check it, and each host's GPU selection), so that a bad input starts nothing anywhere."""
    hosts = read_hosts(options.hosts)
    local = build(replace(options, hosts=HostOptions(), nodes=NodeOptions()), env, cwd)
    return _job(hosts, options.selection, options.nodes, options.hosts, [], [*forwarded, options.script,
                *options.args], env, cwd, version, local.shutdown_timeout)


def plan_probe(selection: SelectionOptions, nodes: NodeOptions, host_options: HostOptions, forwarded: Sequence[str],
               env: Mapping[str, str], cwd: Path, version: str) -> HostsJob:
    """`ddpboot plan --hostfile FILE`: each host's launcher asked for its plan (`ddpboot plan --json`)."""
    hosts = read_hosts(host_options)
    return _job(hosts, selection, nodes, host_options, ["plan", "--json"], forwarded, env, cwd, version, 0.0)


def _job(hosts: HostList, selection: SelectionOptions, nodes: NodeOptions, host_options: HostOptions,
         head: Sequence[str], tail: Sequence[str], env: Mapping[str, str], cwd: Path, version: str,
         shutdown: float) -> HostsJob:
    _refuse_node_options(nodes, hosts.source)
    check_counts(hosts, selection)
    n = len(hosts.hosts)
    names = {socket.gethostname(), socket.getfqdn(), socket.gethostname().split(".")[0]}
    addr = nodes.master_addr or _node0_address(hosts, names)
    port = check_port(nodes.master_port, "--master-port") if nodes.master_port else None
    ssh = ssh_options(env, host_options.ssh_port, host_options.ssh_identity_file)
    python = sys.executable
    specs = []
    for node, host in enumerate(hosts.hosts):
        mine = host_selection(host, selection)
        parse_selection(mine, n, node)  # its syntax, now
        args = [*head, *node_args(n, node, addr, port), *_selection_args(mine), *tail]
        local = is_local(host, names)
        argv = local_argv(python, args) if local else ssh_argv(ssh, host, remote_command(str(cwd), python, args))
        specs.append(HostSpec(host, node, tuple(argv), local))
    variables = forwarded_env(env, host_options.env)
    return HostsJob(tuple(specs), hello_line(version, variables), tuple(sorted(variables)), hosts.source,
                    (addr, port or (TORCHRUN_MASTER_PORT if n > 1 else None)), ssh, cwd, shutdown + STOP_MARGIN)


def _refuse_node_options(nodes: NodeOptions, source: str) -> None:
    given = {"--nnodes": nodes.nnodes, "--node-rank": nodes.node_rank, "--rdzv-endpoint": nodes.rdzv_endpoint or None,
             "--local-addr": nodes.local_addr, "--standalone": nodes.standalone or None}
    for option, value in given.items():
        if value is not None:
            raise UsageError(f"{option} with the hosts of {source}: every host is a node, the first node 0, so the "
                             f"hosts say the node count and each node's rank. Drop {option} (--master-addr and "
                             "--master-port still name node 0's store).")
    if nodes.rdzv_backend.strip().lower() not in ("static", ""):
        raise UsageError(f"--rdzv-backend {nodes.rdzv_backend} with the hosts of {source}: a job of fixed hosts "
                         "meets at node 0's store (static); drop --rdzv-backend.")


def _node0_address(hosts: HostList, names: set[str]) -> str:
    """Where the other hosts reach node 0's store: the first host as written; this machine's host name where it is
    written as a loopback name and the other hosts are elsewhere."""
    first = hosts.hosts[0]
    elsewhere = any(not is_local(h, names) for h in hosts.hosts[1:])
    if is_local(first, names) and is_loopback(first.address) and elsewhere:
        return socket.gethostname()
    return first.address


def _selection_args(selection: SelectionOptions) -> list[str]:
    out = []
    for option, value in (("--nproc", selection.nproc), ("--gpus", selection.gpus), ("--exclude", selection.exclude)):
        if value is not None:
            out += [option, value]
    return out


# --- the dry run ------------------------------------------------------------------------------------------------


def store_text(job: HostsJob) -> str:
    if job.master[1] is None:
        return "one node: its store on loopback, on a port it binds itself"
    return f"node 0's store at {job.master[0]}:{job.master[1]}"


def dry_run_lines(job: HostsJob) -> list[str]:
    lines = [f"{len(job.specs)} host{'s' if len(job.specs) > 1 else ''} from {job.source}, {store_text(job)}"]
    for spec in job.specs:
        how = "this machine, no ssh" if spec.local else "over ssh"
        lines.append(f"node {spec.node} on {spec.host.name} ({how}): {spec.shown()}")
    lines.append(f"sent to every host's launcher on its stdin: ddpboot's version and {', '.join(job.variables)}")
    return lines


def dry_run_json(job: HostsJob) -> dict[str, object]:
    return {"source": job.source, "store": {"master_addr": job.master[0], "port": job.master[1]},
            "variables": list(job.variables),
            "hosts": [{"host": s.host.name, "node_rank": s.node, "local": s.local, "argv": list(s.argv)}
                      for s in job.specs]}


# --- running ----------------------------------------------------------------------------------------------------


class _Conn:
    """One host's launcher: its process (the ssh client, or the launcher itself), its pipes, its exit."""

    def __init__(self, spec: HostSpec, job: HostsJob) -> None:
        self.spec = spec
        self.proc = subprocess.Popen(spec.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True, cwd=job.cwd)
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self.pidfd = os.pidfd_open(self.proc.pid)
        self.fds = {self.proc.stdout.fileno(): False, self.proc.stderr.fileno(): True}  # fd → is stderr
        self.bufs = {fd: b"" for fd in self.fds}
        self.all_lines: list[str] = []  # what it said on stderr, for a failure's message
        self.send(job.hello)

    def send(self, data: bytes) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            self.proc.stdin.flush()

    def read(self, fd: int, line: Callable[[str, bool], None]) -> bool | None:
        """Read what is there on `fd`; each whole line to `line(text, stderr)`; False at its end, None when
        nothing was there."""
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return None
        buf = self.bufs[fd] + data
        *whole, buf = buf.split(b"\n")
        if (not data and buf) or len(buf) > 1 << 20:  # its last line, or a line of more than a MiB: as it is
            whole, buf = [*whole, buf], b""
        self.bufs[fd] = buf
        for raw in whole:
            text = raw.decode(errors="surrogateescape")
            if self.fds[fd]:
                self.all_lines.append(text)
                del self.all_lines[:-50]
            line(text, self.fds[fd])
        return bool(data)

    def code(self) -> int:
        rc = self.proc.wait()
        return 128 - rc if rc < 0 else rc


class _Out:
    """This command's stdout and stderr; one whose reader left is dropped, as a launcher's console is."""

    def __init__(self) -> None:
        self.streams = {False: sys.stdout.buffer, True: sys.stderr.buffer}

    def write(self, stderr: bool, text: str) -> None:
        stream = self.streams.get(stderr)
        if stream is None:
            return
        try:
            stream.write(text.encode(errors="surrogateescape") + b"\n")
            stream.flush()
        except (OSError, ValueError):
            del self.streams[stderr]


def run_hosts(job: HostsJob) -> int:
    """Start every host's launcher, be their console, carry out nodes/hostjob.py's decisions; the job's code."""
    state = HostJob.of([s.host.name for s in job.specs], job.kill_after)
    out = _Out()
    wake_r, wake_w = os.pipe()
    for fd in (wake_r, wake_w):
        os.set_blocking(fd, False)
    got: list[int] = []
    previous = {sig: signal.signal(sig, lambda signo, _frame: got.append(signo)) for sig in STOP_SIGNALS}
    old_wakeup = signal.set_wakeup_fd(wake_w)
    conns: list[_Conn] = []
    try:
        conns = [_Conn(spec, job) for spec in job.specs]
        _loop(job, state, conns, out, wake_r, got)
    finally:
        signal.set_wakeup_fd(old_wakeup)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for conn in conns:
            if conn.proc.poll() is None:
                conn.proc.kill()
            conn.proc.wait()
            os.close(conn.pidfd)
        os.close(wake_r)
        os.close(wake_w)
    return state.code


def _loop(job: HostsJob, state: HostJob, conns: list[_Conn], out: _Out, wake_r: int, got: list[int]) -> None:
    open_fds = {fd: i for i, c in enumerate(conns) for fd in c.fds}
    exits = {c.pidfd: i for i, c in enumerate(conns)}
    drain_until = math.inf
    while open_fds and time.monotonic() < drain_until:
        timeout = min(state.deadline(), drain_until) - time.monotonic()
        ready = select.select([wake_r, *open_fds, *exits], [], [], max(timeout, 0.0) if timeout < 1e6 else None)[0]
        now = time.monotonic()
        actions = []
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 64)
            while got:
                actions += state.signalled(got.pop(0), now)
        for fd in ready:
            if fd in open_fds:
                i = open_fds[fd]
                if conns[i].read(fd, functools.partial(_show, state, out, i)) is False:
                    del open_fds[fd]
        for fd in ready:
            if fd in exits:
                i = exits.pop(fd)
                actions += _exited(job, state, conns[i], out, now)
        actions += state.tick(now)
        _carry_out(actions, conns, out)
        if not exits and drain_until == math.inf:
            drain_until = time.monotonic() + 2.0  # what the hosts' last processes still write (their guardians)


def _show(state: HostJob, out: _Out, i: int, text: str, stderr: bool) -> None:
    for line in state.line(i, text, stderr):
        out.write(stderr, line)


def _exited(job: HostsJob, state: HostJob, conn: _Conn, out: _Out, now: float) -> list[Say | Send | Kill]:
    for fd in conn.fds:  # what it wrote before it ended comes first (its launcher's start above all)
        with contextlib.suppress(OSError):
            os.set_blocking(fd, False)
            while conn.read(fd, functools.partial(_show, state, out, conn.spec.node)):
                pass  # until nothing more is there (None) or its end (False)
    code = conn.code()
    why = connect_failure(conn.spec.host, code, conn.all_lines, job.ssh)
    return state.exited(conn.spec.node, code, now, why)


def _carry_out(actions: Sequence[Say | Send | Kill], conns: list[_Conn], out: _Out) -> None:
    for action in actions:
        if isinstance(action, Say):
            out.write(True, action.text)
        elif isinstance(action, Send):
            for i in action.hosts:
                conns[i].send(f"{action.name}\n".encode())
        else:
            for i in action.hosts:
                with contextlib.suppress(ProcessLookupError):
                    conns[i].proc.kill()


# --- asking every host for its plan ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    spec: HostSpec
    code: int
    out: str
    err: list[str]


def probe_hosts(job: HostsJob, timeout: float = PROBE_TIMEOUT) -> list[Answer]:
    """Every host's `ddpboot plan --json`, asked at once; its exit code, stdout and stderr lines."""
    conns = [_Conn(spec, job) for spec in job.specs]
    outs: list[list[str]] = [[] for _ in conns]
    errs: list[list[str]] = [[] for _ in conns]
    open_fds = {fd: i for i, c in enumerate(conns) for fd in c.fds}
    deadline = time.monotonic() + timeout
    try:
        while open_fds and time.monotonic() < deadline:
            for fd in select.select(list(open_fds), [], [], max(deadline - time.monotonic(), 0.0))[0]:
                i = open_fds[fd]
                if conns[i].read(fd, functools.partial(_collect, outs[i], errs[i])) is False:
                    del open_fds[fd]
    finally:
        for i in set(open_fds.values()):
            conns[i].proc.kill()
    answers = [Answer(c.spec, c.code(), "\n".join(outs[i]), errs[i]) for i, c in enumerate(conns)]
    for conn in conns:
        os.close(conn.pidfd)
        for stream in (conn.proc.stdin, conn.proc.stdout, conn.proc.stderr):
            if stream is not None:  # the hello still buffered for a host that left at once (its ssh refused) cannot
                with contextlib.suppress(OSError):  # be flushed now: its exit code says why, not this close
                    stream.close()
    if open_fds:
        slow = ", ".join(sorted({conns[i].spec.host.name for i in open_fds.values()}))
        raise UsageError(f"no plan from {slow} within {timeout:g} s: check that `ssh HOST true` answers at once.")
    return answers


def _collect(outs: list[str], errs: list[str], text: str, stderr: bool) -> None:
    (errs if stderr else outs).append(text)


def answer_error(answer: Answer, ssh: SshOptions) -> str | None:
    """Why a host gave no plan, as one message naming it; None when it gave one."""
    if answer.code == 0:
        return None
    said = next((line[len(ERROR):] for line in answer.err if line.startswith(ERROR)), None)
    started = any(line.strip() == MARKER for line in answer.err)
    why = said if said is not None else connect_failure(answer.spec.host, answer.code, answer.err, ssh) if not started \
        else f"its plan failed (exit code {answer.code}): {answer.err[-1] if answer.err else ''}"
    return f"{answer.spec.host.name} (node {answer.spec.node}): {why}"
