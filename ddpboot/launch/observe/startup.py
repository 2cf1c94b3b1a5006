"""The start-up waterfall's observer (waterfall.py decides): while the ranks start it reads each one's phases file
(contract.phases_file, beside its error file: the marks launch/pymain.py appends) every POLL_INTERVAL seconds, and
notes each rank's first output after its process group is up. Once every rank's group is up (or at the attempt's
end, when one failed before), it publishes the table (status.json's `phases`) and says the one `ddpboot:
start-up` line when a rank lost noticeably more than the others; then it stops reading them, and reads each GPU
rank's NCCL init log (contract.nccl_init_file: NCCL initialises a communicator at its first collective) for NCCL's
own init time, for NCCL_WAIT seconds at most, publishing the table again as each one comes."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ddpboot.contract import nccl_init_file, phases_file
from ddpboot.launch.observe.base import Answer, Job, Observer, Rank, Running, Status
from ddpboot.launch.observe.waterfall import current_phase, phases, slowest, startup_line

POLL_INTERVAL = 1.0  # seconds between two reads of the phases files while the ranks start
NCCL_WAIT = 60.0  # seconds after the line that NCCL's init (lazy: at the first collective) is still looked for
NCCL_TIMINGS = re.compile(r"NCCL INFO Init timings - \S+: rank \d+ nranks \d+ total ([0-9.]+)")


def read_nccl_init(path: Path) -> float | None:
    """NCCL's own time for the rank's first communicator's init, in seconds ("Init timings ... total T", NCCL 2.23
    and later), from the rank's NCCL init log; None: none (yet)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                found = NCCL_TIMINGS.search(line)
                if found:
                    return float(found[1])
    except OSError:
        return None
    return None


def read_marks(path: Path) -> dict[str, float]:
    """`NAME UNIX_TIME` lines, the first of each name (a line being written is left for the next read)."""
    marks: dict[str, float] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return marks
    for line in text.split("\n")[:-1]:
        name, _, at = line.partition(" ")
        try:
            marks.setdefault(name, float(at))
        except ValueError:
            continue
    return marks


class Startup(Observer):
    def __init__(self, status: Status, say: Callable[[str], None], clock: Callable[[], float],
                 wall: Callable[[], float] = time.time) -> None:
        self.status = status
        self.say = say
        self.clock = clock
        self.wall = wall
        self.marks: dict[int, dict[str, float]] = {}
        self.sizes: dict[int, int] = {}
        self.first_output: dict[int, float] = {}
        self.workers: Sequence[Rank] = ()
        self.nccl: dict[int, float] = {}
        self.next_poll = -float("inf")
        self.done = False  # the line was said (or not): the phases files are no longer read
        self.nccl_until: float | None = None  # NCCL's init logs are read until then, after the line

    @classmethod
    def start(cls, job: Job) -> Startup | None:
        if not job.spec.target.kind.is_python:  # a --no-python program writes no marks
            return None
        return cls(job.status, job.say, job.clock)

    def due(self, now: float) -> float | None:
        return None if self.done and self.nccl_until is None else self.next_poll

    def on_output(self, rank: int, data: bytes) -> None:
        if rank not in self.first_output and "pg" in self.marks.get(rank, {}):
            self.first_output[rank] = self.wall()

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        self.workers = running.workers
        if now < self.next_poll:
            return ()
        self.next_poll = now + POLL_INTERVAL
        if self.done:
            if self.nccl_until is not None:
                self._read_nccl(now)
            return ()
        self._read()
        if self.workers and all("pg" in self.marks.get(w.slot.rank, {}) for w in self.workers):
            self._finish()
            self.nccl_until = now + NCCL_WAIT
            self._read_nccl(now)
        return ()

    def _read_nccl(self, now: float) -> None:
        """NCCL's init times, once each rank's is written; the table published again with them."""
        assert self.nccl_until is not None
        for w in self.workers:
            if w.slot.gpus and w.slot.rank not in self.nccl:
                took = read_nccl_init(nccl_init_file(str(w.error_file)))
                if took is not None:
                    self.nccl[w.slot.rank] = took
                    self.status.phases(w.slot.rank, self.table()[w.slot.rank])
        if now >= self.nccl_until or all(w.slot.rank in self.nccl for w in self.workers if w.slot.gpus):
            self.nccl_until = None

    def _read(self) -> None:
        for w in self.workers:
            path = phases_file(str(w.error_file))
            try:
                size = path.stat().st_size
            except OSError:
                size = -1
            if size >= 0 and size != self.sizes.get(w.slot.rank):
                self.sizes[w.slot.rank] = size
                self.marks[w.slot.rank] = read_marks(path)
        for w in self.workers:
            if w.pid and w.status is None:
                self.status.phase(w.slot.rank, current_phase(self.marks.get(w.slot.rank, {})))

    def table(self) -> dict[int, dict[str, float]]:
        """Every started rank's phases so far."""
        wall, now = self.wall(), self.clock()
        return {w.slot.rank: phases(wall - (now - w.started), self.marks.get(w.slot.rank, {}),
                                    self.first_output.get(w.slot.rank), self.nccl.get(w.slot.rank))
                for w in self.workers if w.pid}

    def _finish(self) -> None:
        self.done = True
        for w in self.workers:
            self.status.phase(w.slot.rank, None)
        table = self.table()
        for rank, row in table.items():
            self.status.phases(rank, row)
        slow = slowest(table)
        if slow is not None:
            total = max(sum(v for k, v in row.items() if k != "first_output") for row in table.values())
            self.say(startup_line(slow, total))

    def close(self) -> None:
        if not self.done and self.workers:
            self._read()
            self._finish()
        elif self.first_output or self.nccl:  # the first outputs seen after the line: the table gains them
            for rank, row in self.table().items():
                self.status.phases(rank, row)
