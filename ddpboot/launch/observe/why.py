"""Why a rank died by a signal, from what the machine recorded: the facts the death observer (death.py) gathered at
the rank's start and at its end, in; one sentence and a short tag out. Pure: no I/O, no clock.

The evidence, in the order it is weighed for a SIGKILL: an OOM kill counted in the rank's memory cgroup (or the
kernel log's `Killed process PID` line), ddpboot's own signals, a hard CPU-time limit, an OOM kill counted on the
node, and otherwise "cannot tell" with what was looked at. SIGTERM, SIGINT and SIGHUP: ddpboot's, or another
process's. SIGXCPU: the CPU-time limit. A crash (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL): its traceback, or how to
get one. Other signals get no sentence (None)."""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass

from ddpboot.launch.observe.memcg import Counters
from ddpboot.units import format_size, plural

OOM_FIX = ("Likely fix: load checkpoints with mmap=True (torch.load) or on one rank and broadcast, use fewer "
           "DataLoader workers or a smaller batch, or raise the limit (a SLURM job's --mem, a container's memory "
           "limit)")
CRASHES = {
    signal.SIGSEGV: "a segmentation fault: native code touched memory it does not own",
    signal.SIGBUS: "a bus error: often a memory-mapped file that shrank, or a full /dev/shm",
    signal.SIGABRT: "an abort: native code (a C++ exception, an assertion) gave up",
    signal.SIGFPE: "an arithmetic fault in native code",
    signal.SIGILL: "an illegal instruction: a binary built for another CPU",
}
ENDINGS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Death:
    """What was recorded about one rank that died by signal `signo`."""

    rank: int
    signo: int
    at: float  # unix time of its death
    before: tuple[Counters, ...] | None  # its memory cgroup and those above it, at its start (None: not recorded)
    after: tuple[Counters, ...] | None  # ... at its death
    node_ooms: tuple[int | None, int | None] = (None, None)  # the node's OOM kills (/proc/vmstat) before, after
    peak_rss: int | None = None  # its peak resident memory at the last sample
    node_rss: int | None = None  # the node's ranks' peaks together
    ranks_on_node: int = 1
    cpu_limit: tuple[float | None, float | None] | None = None  # RLIMIT_CPU (soft, hard) at its start
    cpu_used: float | None = None  # seconds of CPU at the last sample
    sent: tuple[str, ...] = ()  # what ddpboot sent it, as the summary names it ("SIGTERM (forwarded)")
    kernel_line: str | None = None  # the kernel log's `Killed process PID` line
    kernel_unread: str | None = None  # why the kernel log could not be read
    traceback: bool = False  # a faulthandler traceback ("Fatal Python error") is in its stderr


@dataclass(frozen=True)
class Verdict:
    tag: str  # "the kernel's OOM killer"
    text: str  # the sentence


def explain(d: Death) -> Verdict | None:
    """Why the rank died, as far as the facts tell (None: a signal this says nothing about)."""
    if d.signo == signal.SIGKILL:
        return _killed(d)
    if d.signo == signal.SIGXCPU:
        return _cpu_time(d)
    if d.signo in CRASHES:
        return _crash(d)
    if d.signo in ENDINGS:
        return _ended(d)
    return None


def _name(signo: int) -> str:
    return signal.Signals(signo).name


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _oom_cgroup(d: Death) -> Counters | None:
    """The first cgroup (the rank's own, then upwards) whose OOM kill count rose while the rank ran."""
    if d.before is None or d.after is None:
        return None
    for b, a in zip(d.before, d.after, strict=False):
        if b.oom_kills is not None and a.oom_kills is not None and a.oom_kills > b.oom_kills:
            return a
    return None


def _tightest(counters: Sequence[Counters]) -> Counters | None:
    limited = [c for c in counters if c.limit is not None]
    return min(limited, key=lambda c: c.limit or 0) if limited else None


def _held(d: Death) -> str:
    parts = []
    if d.peak_rss is not None:
        parts.append(f"rank {d.rank} held {format_size(d.peak_rss)} at its peak when last sampled")
    if d.node_rss is not None and d.ranks_on_node > 1:
        parts.append(f"the node's {plural(d.ranks_on_node, 'rank')} {format_size(d.node_rss)}")
    return "; " + ", ".join(parts) if parts else ""


def _kernel(d: Death) -> str:
    if d.kernel_line is not None:
        return f". The kernel logged: {d.kernel_line}"
    if d.kernel_unread is not None:
        return f". {d.kernel_unread[0].upper()}{d.kernel_unread[1:]}"
    return ""


def _killed(d: Death) -> Verdict:
    oom = _oom_cgroup(d)
    if oom is not None or d.kernel_line is not None:
        return Verdict("the kernel's OOM killer", _oom(d, oom))
    if d.sent:
        return Verdict("by ddpboot", f"rank {d.rank} was killed by ddpboot, which sent it {', '.join(d.sent)}")
    hard = d.cpu_limit[1] if d.cpu_limit is not None else None
    if hard is not None and d.cpu_used is not None and d.cpu_used >= hard - 1.0:
        return Verdict("its CPU-time limit", f"rank {d.rank} was killed by the kernel at its hard CPU-time limit "
                       f"(ulimit -Ht {hard:g} s; it had used {d.cpu_used:.0f} s of CPU at the last sample). Raise "
                       "the limit (ulimit -t, the scheduler's CPU-time limit)")
    before, after = d.node_ooms
    node_rose = before is not None and after is not None and after > before
    if node_rose and d.after is None:
        return Verdict("probably the kernel's OOM killer",
                       f"rank {d.rank} was probably killed by the kernel's OOM killer at {_clock(d.at)}: the node "
                       f"counted {plural((after or 0) - (before or 0), 'OOM kill')} while it ran (its memory cgroup "
                       f"was not recorded){_held(d)}{_kernel(d)}. {OOM_FIX}")
    return Verdict("cannot tell", _unexplained(d, node_rose))


FILES = {1: "memory.limit_in_bytes, memory.max_usage_in_bytes, memory.oom_control",
         2: "memory.max, memory.peak, memory.events"}


def _oom(d: Death, oom: Counters | None) -> str:
    chain = d.after or ()
    limit = _tightest(chain)
    own = chain[0] if chain else oom
    if limit is None:
        where = "the node's memory was full (its memory cgroup has no limit)"
    else:
        which = "its memory cgroup" if own is None or own.name == limit.name else "the memory cgroup above its own,"
        facts = [f"limit {format_size(limit.limit)}"]
        if limit.peak is not None:
            facts.append(f"peak {format_size(limit.peak)}")
        where = f"{which} {limit.name} was full ({', '.join(facts)}{_kills(d, oom)}: {FILES[limit.version]})"
    return (f"rank {d.rank} was killed by the kernel's OOM killer at {_clock(d.at)}: {where}{_held(d)}"
            f"{_kernel(d)}. {OOM_FIX}")


def _kills(d: Death, oom: Counters | None) -> str:
    """`, oom_kill 0 → 1` for the cgroup whose count rose."""
    if oom is None or d.before is None or d.after is None:
        return ""
    before = next((b for b, a in zip(d.before, d.after, strict=False) if a is oom), None)
    return f", oom_kill {before.oom_kills} → {oom.oom_kills}" if before is not None else ""


def _unexplained(d: Death, node_rose: bool) -> str:
    looked = []
    if d.after is not None and d.before is not None and d.after:
        c, b = d.after[0], d.before[0]
        looked.append(f"its memory cgroup {c.name} counted no OOM kill (oom_kill {b.oom_kills} → {c.oom_kills})")
    else:
        looked.append("its memory cgroup was not recorded")
    if node_rose:
        looked.append("the node counted an OOM kill of another process")
    return (f"rank {d.rank} was killed by SIGKILL from outside the job at {_clock(d.at)}; ddpboot did not send it, "
            f"{', '.join(looked)}: cannot tell who sent it (a user's kill -9, a scheduler, a watchdog)"
            f"{_kernel(d) if d.kernel_unread is not None else ''}")


def _cpu_time(d: Death) -> Verdict:
    if d.cpu_limit is None or d.cpu_limit[0] is None:
        return Verdict("a CPU-time limit", f"rank {d.rank} got SIGXCPU, which the kernel sends at a CPU-time limit "
                       "(ulimit -t, RLIMIT_CPU): cannot tell which, none was recorded at its start")
    soft, hard = d.cpu_limit
    used = f"; it had used {d.cpu_used:.0f} s of CPU at the last sample" if d.cpu_used is not None else ""
    hard_text = f", hard {hard:g} s" if hard is not None else ""
    return Verdict("its CPU-time limit", f"rank {d.rank} reached its CPU-time limit (ulimit -t {soft:g} s"
                   f"{hard_text}){used}. Raise the limit (ulimit -t, the scheduler's CPU-time limit)")


def _crash(d: Death) -> Verdict:
    what = CRASHES[signal.Signals(d.signo)]
    where = ("its faulthandler traceback is in its output above" if d.traceback else
             "no traceback was printed: PYTHONFAULTHANDLER=1 prints the Python stack of a crash")
    return Verdict("a crash", f"rank {d.rank} crashed with {_name(d.signo)}, {what}; {where}")


def _ended(d: Death) -> Verdict:
    name = _name(d.signo)
    if d.sent:
        return Verdict("by ddpboot", f"rank {d.rank} was ended by {name}, which ddpboot sent it: {', '.join(d.sent)}")
    return Verdict("another process", f"rank {d.rank} was ended by {name} from another process: ddpboot did not "
                   "send it, and cannot tell who did (a scheduler's preemption or time limit, a user's kill)")
