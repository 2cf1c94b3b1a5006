"""A rank stuck in the kernel while the job runs: its process in uninterruptible sleep (state D: a GPU driver call, a
hung network filesystem, a frozen cgroup), which no signal ends until the kernel call returns.

Every CHECK_INTERVAL seconds the observer reads each running rank's state (/proc/PID/stat) and, in D, its wait
channel (/proc/PID/wchan). With torchrun's TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT=SECONDS in the ranks'
environment, a rank in D that long is said once per stay (a warning: on the console and in status.json); ddpboot
stops nothing for it (a stop could not end the rank anyway). At every stack dump, each rank in D is named in one
more verdict line (a stack read from such a rank is its last one before the kernel call, or none)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpboot.launch.observe.base import Answer, Job, Observer, Running
from ddpboot.launch.observe.stacks.dump import VERDICT_PREFIX
from ddpboot.procfs import PROC, read_stat, wait_channel

TIMEOUT_VAR = "TORCHELASTIC_UNINTERRUPTIBLE_STATE_TIMEOUT"
CHECK_INTERVAL = 1.0  # seconds between two reads of the ranks' states


def read_state(pid: int, proc: Path = PROC) -> tuple[str, str] | None:
    """The process's state letter and, in D, its wait channel ('?' when unreadable); None when gone."""
    stat = read_stat(pid, proc)
    if stat is None:
        return None
    return stat.state, wait_channel(pid, proc) if stat.state == "D" else ""


def parse_timeout(env: Mapping[str, str]) -> float | None:
    """The variable's seconds (None: unset, not a number, or not positive)."""
    try:
        value = float(env.get(TIMEOUT_VAR, ""))
    except ValueError:
        return None
    return value if value > 0 else None


@dataclass
class Stay:
    """One rank's stay in D: since when (the loop's clock), where, and whether it was said."""

    pid: int
    since: float
    wchan: str
    said: bool = False


def stuck_text(rank: int, pid: int, seconds: float, wchan: str) -> str:
    return (f"rank {rank} (pid {pid}) is stuck in the kernel: in uninterruptible sleep (D state) for {seconds:.0f} s, "
            f"in {wchan}")


class Uninterruptible(Observer):
    def __init__(self, timeout: float | None, warn: Callable[[str], None], say: Callable[[str], None],
                 read: Callable[[int], tuple[str, str] | None] = read_state) -> None:
        self.timeout = timeout
        self.warn = warn
        self.say = say
        self.read = read
        self.stays: dict[int, Stay] = {}  # rank → its stay in D
        self.next_check = -float("inf")

    @classmethod
    def start(cls, job: Job) -> Uninterruptible:
        return cls(parse_timeout(job.env), job.warn, job.say)

    def due(self, now: float) -> float | None:
        return self.next_check if self.timeout is not None else None

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        if now < self.next_check:
            return ()
        self.next_check = now + CHECK_INTERVAL
        self.look(now, running)
        if self.timeout is not None:
            for rank, stay in self.stays.items():
                if not stay.said and now - stay.since >= self.timeout:
                    stay.said = True
                    self.warn(f"ddpboot: warning: {stuck_text(rank, stay.pid, now - stay.since, stay.wchan)} "
                              f"({TIMEOUT_VAR}={self.timeout:g}); no signal ends it until the call returns")
        return ()

    def look(self, now: float, running: Running) -> None:
        for w in running.workers:
            rank = w.slot.rank
            state = self.read(w.pid) if w.pid and w.status is None else None
            if state is None or state[0] != "D":
                self.stays.pop(rank, None)
            elif rank not in self.stays or self.stays[rank].pid != w.pid:
                self.stays[rank] = Stay(w.pid, now, state[1])
            else:
                self.stays[rank].wchan = state[1]

    def on_dump(self, reason: str, now: float, running: Running) -> None:
        self.look(now, running)
        for rank, stay in sorted(self.stays.items()):
            self.say(VERDICT_PREFIX + stuck_text(rank, stay.pid, now - stay.since, stay.wchan))
