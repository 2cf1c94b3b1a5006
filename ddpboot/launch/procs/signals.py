"""Signals reach the launcher through a signalfd, with their sender; what to do with each is a pure policy.

Why a signalfd: the supervisor is one thread waiting in select(); a signalfd makes a signal one more readable
descriptor (no handler running at a random point of the loop), and each read says who sent it (si_pid, si_code).
The sender is what makes forwarding idempotent:

- SLURM (slurmstepd) signals every process of a job step itself, workers included (the time-limit SIGTERM and
  `scancel` reach each task's processes directly, not through the launcher). A signal whose
  sender is slurmstepd is therefore not forwarded: each worker already has it, and forwarding would deliver it a
  second time (a second SIGTERM can interrupt the first one's checkpoint handler; a second SIGINT raises a second
  KeyboardInterrupt inside the cleanup of the first).
- A signal from one of our own workers is not echoed back to the workers.
- The same signal is forwarded at most once per REPEAT_WINDOW seconds: a sender that signals the launcher twice in
  a burst (or two senders relaying one event) still reaches each worker group once.
- Anything else (the terminal's Ctrl-C, `kill PID`, a scheduler that signals only the launcher) is forwarded to
  every worker's process group, so the worker and the processes it started get it as if run directly.

Precisely, "idempotent" means: per worker, at most one delivery of a given signal per REPEAT_WINDOW from ddpboot,
and none from ddpboot when the sender is known to deliver it to the workers itself. A sender that signals the
workers directly but is not slurmstepd is not recognised; add its command name to DIRECT_SENDERS. A sender in
another PID namespace (a container boundary) shows as pid 0, like the kernel, and is treated as one that does not
signal the workers.

SIGINT, SIGTERM, SIGHUP and SIGQUIT also stop the job (the workers get `--shutdown-timeout` to exit, then SIGKILL;
SIGHUP only when the launcher did not start with it ignored, as under `nohup`: keep_nohup);
a second SIGINT while stopping means "now": every worker group and what the ranks left running get SIGKILL at once,
with no stack dump and no grace. SIGUSR1 (Lightning's SLURM requeue) and any other handled signal are
only forwarded. STACKS_SIGNAL (SIGUSR2) is the launcher's own: it dumps every rank's stack and is not forwarded,
unless the signals option lists it (then it is forwarded as before); from slurmstepd it is left alone, as before
(the workers have it already). SLURM's SIGTERM (the time limit, scancel) also dumps the stacks, first.
"""

from __future__ import annotations

import ctypes
import os
import signal
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from ddpboot.contract import STACKS_SIGNAL, STOP_SIGNALS

DIRECT_SENDERS = frozenset({"slurmstepd"})
REPEAT_WINDOW = 1.0

_SFD_CLOEXEC = 0o2000000
_SFD_NONBLOCK = 0o4000
_SIGINFO = struct.Struct("=IiiIIiIIIIiiQQQQ")
_SIGINFO_SIZE = 128

_libc = ctypes.CDLL(None, use_errno=True)


class _SigSet(ctypes.Structure):
    _fields_ = [("val", ctypes.c_ulong * (1024 // (8 * ctypes.sizeof(ctypes.c_ulong))))]


class SignalInfo(NamedTuple):
    signo: int
    code: int  # si_code: SI_USER (0) from kill(), SI_KERNEL (0x80) e.g. from the terminal
    pid: int  # the sender (0 when the kernel sent it)


class SignalFd:
    """Block `signals` for normal delivery and read them, with their senders, from one descriptor."""

    def __init__(self, signals: Iterable[int]) -> None:
        self.signals = sorted(set(int(s) for s in signals))
        mask = _SigSet()
        _libc.sigemptyset(ctypes.byref(mask))
        for sig in self.signals:
            _libc.sigaddset(ctypes.byref(mask), sig)
        signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        fd = _libc.signalfd(-1, ctypes.byref(mask), _SFD_NONBLOCK | _SFD_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            signal.pthread_sigmask(signal.SIG_UNBLOCK, self.signals)
            raise OSError(err, f"signalfd: {os.strerror(err)}")
        self.fd = int(fd)

    def fileno(self) -> int:
        return self.fd

    def read(self) -> list[SignalInfo]:
        out: list[SignalInfo] = []
        while True:
            try:
                data = os.read(self.fd, _SIGINFO_SIZE * 16)
            except (BlockingIOError, InterruptedError):
                return out
            if not data:
                return out
            for off in range(0, len(data) - _SIGINFO_SIZE + 1, _SIGINFO_SIZE):
                fields = _SIGINFO.unpack_from(data, off)
                out.append(SignalInfo(signo=fields[0], code=fields[2], pid=fields[3]))

    def close(self) -> None:
        """Stop reading; the signals stay blocked (unblocking would deliver a pending one with its default
        action, killing the launcher on its way out)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def keep_nohup(signals: tuple[signal.Signals, ...]) -> tuple[signal.Signals, ...]:
    """`signals` without SIGHUP when this process started with SIGHUP ignored (`nohup`, or a shell's `trap '' HUP`):
    that says "outlive the terminal", so a hangup neither stops the job nor reaches the ranks, which inherit the
    ignore as they would under `nohup python train.py`. SIGINT is not treated so: a shell starts every background
    job with SIGINT ignored without anyone asking for it."""
    if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
        return tuple(s for s in signals if s != signal.SIGHUP)
    return signals


def sender_name(pid: int) -> str | None:
    """The command name of a signal's sender (/proc/PID/comm), None when unknown or gone."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return None


def signal_label(signo: int) -> str:
    """SIGTERM, SIGUSR1, ...; the number for a signal Python has no name for."""
    return signal.Signals(signo).name if signo in signal.Signals._value2member_map_ else str(signo)


@dataclass(frozen=True)
class Decision:
    forward: bool  # send it to every worker's process group
    stop: bool  # stop the job (graceful: shutdown timeout, then SIGKILL)
    kill: bool  # stop the job now: SIGKILL every worker group
    why: str
    terminate_workers: bool = False  # stopping, and the workers have not been signalled: send them SIGTERM
    dump: bool = False  # dump every rank's stack first


@dataclass
class ForwardPolicy:
    """What to do with each signal the launcher receives (see the module docstring). Pure, given the clock."""

    last_forward: dict[int, float] = field(default_factory=dict)
    stopping_by: int | None = None
    forward_stacks: bool = False  # the signals option lists STACKS_SIGNAL: forward it instead of dumping
    hurried: bool = False  # a second SIGINT (or a stop once every rank exited): what is left is killed at once

    def decide(self, info: SignalInfo, now: float, name: str | None = None, from_worker: bool = False) -> Decision:
        sig = info.signo
        label = signal_label(sig)
        if sig == signal.SIGINT and self.stopping_by == signal.SIGINT:
            self.hurried = True
            return Decision(False, True, True, "second SIGINT: killing every worker now")
        stop = sig in STOP_SIGNALS
        if stop and self.stopping_by is None:
            self.stopping_by = sig
        if name in DIRECT_SENDERS:
            why = f"{label} from {name}, which signals every worker itself: not forwarded"
            return Decision(False, stop, False, why, dump=sig == signal.SIGTERM)
        if sig == STACKS_SIGNAL and not self.forward_stacks:
            return Decision(False, False, False, f"dumping every rank's stack ({label} is not forwarded unless "
                            "--signals-to-handle lists it)", dump=True)
        if from_worker:
            why = f"{label} from worker pid {info.pid}: not sent back to the workers"
            return Decision(False, stop, False, why, terminate_workers=stop)
        last = self.last_forward.get(sig)
        if last is not None and now - last < REPEAT_WINDOW:
            why = f"{label} again {now - last:.2f} s after forwarding it: not forwarded twice"
            return Decision(False, stop, False, why)
        self.last_forward[sig] = now
        return Decision(True, stop, False, f"{label} forwarded to every worker")
