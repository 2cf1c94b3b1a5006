"""The job's GPUs, watched while it runs (`--gpu-watch warn`, the default; `strict`; `off`).

Every --gpu-watch-interval seconds the launcher reads NVML's compute processes of every GPU of the machine (through one
NVML session kept open for the attempt, or the simulated inventory's `processes`) and the process table (/proc),
and maps each pid to a rank: the rank's process and every descendant of it, or a process that still carries the
rank's mark in its environment (see procs/leftovers.py). Then, once per (rank, GPU) or (pid, GPU):

- a rank's process holding memory on a GPU that is not one of the rank's: the rank, the pid and what it is (the
  rank itself, a child such as a DataLoader worker), the MiB, the GPU, and the likely causes. Under `strict` the
  job then ends with exit code GPU_WATCH_EXIT;
- a process that is not the job's on one of the job's GPUs: its pid, user and command, and the MiB;
- a GPU of the job whose memory is within 5% of full, that slows its clocks for a reason other than a power cap or
  idling (hardware or thermal slowdown, power brake), whose uncorrected ECC error count grew, or that reported a
  critical Xid error: the GPU and its ranks (once per GPU and kind). What means the GPU itself is failing (a
  critical Xid of selection/ledger.py's FAILING, uncorrected ECC errors that grew) is marked in the GPU health
  ledger beside the GPU locks, for later jobs' plans to leave out.

NVML in a container sees the host's pids, which this process cannot see: when none of the pids NVML lists on the
job's GPUs exists here, the watch says so once and says nothing about strangers (it cannot tell them apart).
The decisions (`findings`) are a pure function of the readings.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddpboot.launch.observe.base import Answer, End, Job, Observer, Running
from ddpboot.launch.procs import leftovers
from ddpboot.launch.procs.leftovers import Proc
from ddpboot.launch.spec import GPU_WATCH_EXIT, WatchMode
from ddpboot.selection.activity import GpuHealth, GpuProcess, GpuReader
from ddpboot.selection.ledger import mark, xid_reason
from ddpboot.selection.locks import lock_dir
from ddpboot.selection.planner import Plan

MIB = 1024 * 1024
CAUSES = ("a barrier() or init_process_group() without device_id, torch.load() without map_location, .cuda() or a "
          "CUDA call before torch.cuda.set_device(), or cuda:N with N other than 0 under rank isolation")


@dataclass(frozen=True)
class RankGpus:
    """What the watch knows of one running rank: its pid and the UUIDs and labels of its GPUs."""

    rank: int
    pid: int
    uuids: frozenset[str]
    labels: str
    mig_parents: frozenset[str] = frozenset()  # NVML indices of the GPUs whose MIG instances the rank has


@dataclass(frozen=True)
class Finding:
    key: tuple[object, ...]  # said once per key
    text: str
    wrong_gpu: bool = False  # what `strict` ends the job for
    failing: tuple[str, str, str] | None = None  # (uuid, label, why): the GPU is failing, for the health ledger


def owners(table: Mapping[int, Proc], ranks: Sequence[RankGpus], run_dir: Path | None) -> dict[int, int]:
    """pid → rank index for every process of the job: each rank's process and its descendants, and processes
    carrying a rank's mark (its TORCHELASTIC_ERROR_FILE under `run_dir`)."""
    out: dict[int, int] = {}
    for i, r in enumerate(ranks):
        for pid in leftovers.descendants(table, [r.pid]):
            out.setdefault(pid, i)
    if run_dir is not None:
        by_rank = {r.rank: i for i, r in enumerate(ranks)}
        for pid in leftovers.marked(table, run_dir, os.getuid()):
            rank = leftovers.rank_of(table[pid])
            if rank in by_rank:
                out.setdefault(pid, by_rank[rank])
    return out


def _gpu_ranks(ranks: Sequence[RankGpus]) -> dict[str, list[int]]:
    """GPU UUID → the ranks that run on it."""
    out: dict[str, list[int]] = {}
    for r in ranks:
        for u in r.uuids:
            out.setdefault(u, []).append(r.rank)
    return out


def _mib(used: int | None) -> str:
    return "an unknown amount of memory" if used is None else f"{used / MIB:.0f} MiB"


def _who(pid: int, rank: RankGpus, table: Mapping[int, Proc]) -> str:
    if pid == rank.pid:
        return "the rank itself"
    p, parent = table.get(pid), table.get(rank.pid)
    if p is not None and parent is not None and p.cmd == parent.cmd:
        return f"a process forked by the rank, such as a DataLoader worker, pid {pid}"
    return f"a process the rank started, pid {pid}" + (f" ({p.cmd[:60]})" if p is not None else "")


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def findings(
    procs: Iterable[GpuProcess],
    ranks: Sequence[RankGpus],
    table: Mapping[int, Proc],
    owner: Mapping[int, int],
    launcher: int,
) -> list[Finding]:
    """What is wrong in one reading (every finding; the caller says each key once)."""
    procs = list(procs)
    job_gpus = _gpu_ranks(ranks)
    on_job = [gp for gp in procs if gp.uuid in job_gpus]
    out: list[Finding] = []
    if on_job and not any(gp.pid in table for gp in on_job):
        out.append(Finding(("unseen",), "ddpboot: gpu watch: NVML lists processes on this job's GPUs that this "
                           "launcher cannot see (another pid namespace: a container); the watch cannot tell the "
                           "job's processes from others and stays quiet about them"))
        return out
    for gp in procs:
        if gp.pid in owner:
            r = ranks[owner[gp.pid]]
            # NVML lists a MIG instance's processes under its physical GPU: one of the rank's own parents is no finding
            if gp.uuid not in r.uuids and gp.label not in r.mig_parents and gp.used != 0:
                out.append(Finding(("wrong", r.rank, gp.uuid), (
                    f"ddpboot: gpu watch: rank {r.rank} ({_who(gp.pid, r, table)}) holds {_mib(gp.used)} on GPU "
                    f"{gp.label}, which is not its GPU (rank {r.rank} runs on {r.labels}). Likely causes: {CAUSES}"
                ), wrong_gpu=True))
        elif gp.uuid in job_gpus and gp.pid != launcher and gp.pid in table:
            p = table[gp.pid]
            holders = ", ".join(map(str, job_gpus[gp.uuid]))
            out.append(Finding(("stranger", gp.pid, gp.uuid), (
                f"ddpboot: gpu watch: pid {gp.pid} ({_user(p.uid)}: {p.cmd[:60]}) is not this job's and uses "
                f"{_mib(gp.used)} on GPU {gp.label}, the GPU of rank{'s' if ',' in holders else ''} {holders}")))
    return out


FULL = 0.95  # a GPU whose memory is this full is said to be nearly full


def _about(gpu: str, key: tuple[object, ...], what: str, failing: tuple[str, str, str] | None = None) -> Finding:
    """A finding about one of the job's GPUs: `gpu` names it and its ranks, `what` says what is wrong with it;
    `failing`: (uuid, label, why) where it means the GPU is failing (the health ledger's)."""
    return Finding(key, f"ddpboot: gpu watch: {gpu} {what}", failing=failing)


def health_findings(states: Iterable[GpuHealth], ranks: Sequence[RankGpus],
                    ecc_before: Mapping[str, int | None]) -> list[Finding]:
    """What is wrong with the job's GPUs (`ecc_before`: each GPU's uncorrected ECC count at the first reading)."""
    whose = _gpu_ranks(ranks)
    out = []
    for st in states:
        if st.uuid not in whose:
            continue
        names = ", ".join(map(str, whose[st.uuid]))
        gpu = f"GPU {st.label} (rank{'s' if ',' in names else ''} {names})"
        if st.memory_total and st.memory_used >= FULL * st.memory_total:
            out.append(_about(gpu, ("memory", st.uuid), (
                f"is {st.memory_used / st.memory_total:.0%} full ({st.memory_used / 2**30:.1f} of "
                f"{st.memory_total / 2**30:.1f} GiB): the next allocation may fail with CUDA out of memory")))
        out += [_about(gpu, ("slow", st.uuid, why), (
            f"slows its clocks: {why}; the job runs slower than it should (nvidia-smi -q -d PERFORMANCE shows why; "
            "check the machine's cooling and power)")) for why in st.slowdowns]
        before = ecc_before.get(st.uuid)
        if st.ecc_uncorrected is not None and before is not None and st.ecc_uncorrected > before:
            new = st.ecc_uncorrected - before
            out.append(_about(gpu, ("ecc", st.uuid, st.ecc_uncorrected), (
                f"reports {new} new uncorrected ECC error{'s' if new > 1 else ''} during this job "
                f"({st.ecc_uncorrected} since the driver loaded): its memory is failing, results computed on it may "
                "be wrong"), failing=(st.uuid, st.label, f"uncorrected ECC errors grew by {new}")))
        out += [_xid(st, gpu, xid) for xid in st.xids]
    return out


def _xid(st: GpuHealth, gpu: str, xid: int) -> Finding:
    """An Xid the GPU reported; one that means the GPU is failing (ledger.FAILING) is for the health ledger."""
    bad = xid_reason(xid)
    return _about(gpu, ("xid", st.uuid, xid), (
        f"reported Xid {xid}, a GPU error the driver logged (NVIDIA's Xid list says what it means; `dmesg` has the "
        "driver's line)"), failing=None if bad is None else (st.uuid, st.label, bad))


def rank_gpus(plan: Plan, pids: Mapping[int, int]) -> list[RankGpus]:
    """The running ranks of `plan` (`pids`: rank → pid, 0 or absent: not running)."""
    out = []
    for slot in plan.ranks:
        pid = pids.get(slot.rank, 0)
        if pid and slot.gpus:
            labels = "GPU " + ", ".join(g.label for g in slot.gpus)
            parents = frozenset(str(g.index) for g in slot.gpus if g.mig_index is not None)
            out.append(RankGpus(slot.rank, pid, frozenset(g.uuid for g in slot.gpus), labels, parents))
    return out


@dataclass
class GpuWatch(Observer):
    """The watch of one attempt: `reader` gives one reading (fake or NVML); `say` tells the user; `check` returns
    whether `strict` must end the job. As an observer: a reading every `interval` seconds while it is active (a
    watch that cannot read the GPUs says so once and stops), `strict` answering End(GPU_WATCH_EXIT)."""

    mode: WatchMode
    plan: Plan
    env: Mapping[str, str]
    run_dir: Path | None
    say: Callable[[str], None]
    interval: float  # --gpu-watch-interval: seconds between two readings
    said: set[tuple[object, ...]] = field(default_factory=set)
    reader: GpuReader | None = None
    broken: bool = False
    ended: bool = False  # strict has ended the attempt
    ecc_before: dict[str, int | None] | None = None  # each GPU's uncorrected ECC count at the first reading
    next_look: float = 0.0  # the loop's clock
    ledger: Path | None = None  # the lock directory, where a failing GPU is marked (None: not marked)
    run_id: str = ""

    @classmethod
    def start(cls, job: Job) -> GpuWatch | None:
        watch = cls(job.spec.gpu_watch, job.plan, job.env, job.paths.root, job.warn, job.spec.gpu_watch_interval,
                    ledger=lock_dir(job.env), run_id=job.spec.run_id)
        if not watch.active:
            return None
        watch.next_look = job.clock() + watch.interval
        return watch

    @property
    def active(self) -> bool:
        return self.mode is not WatchMode.OFF and not self.broken and any(s.gpus for s in self.plan.ranks)

    def _read(self) -> tuple[list[GpuProcess], list[GpuHealth]]:
        if self.reader is None:
            self.reader = GpuReader(self.env)
        return self.reader.processes(), self.reader.health()

    def check(self, pids: Mapping[int, int]) -> bool:
        """One reading; True when `strict` must end the job (a rank on a GPU not its own)."""
        if not self.active:
            return False
        try:
            procs, health = self._read()
        except Exception as exc:  # InventoryError, OSError, ImportError, NVMLError (no common base to name)
            self.broken = True
            self.say(f"ddpboot: gpu watch: cannot read the GPUs' processes ({exc}); the watch is off for this job")
            return False
        ranks = rank_gpus(self.plan, pids)
        table = leftovers.snapshot()
        found = findings(procs, ranks, table, owners(table, ranks, self.run_dir), os.getpid())
        if self.ecc_before is None:
            self.ecc_before = {h.uuid: h.ecc_uncorrected for h in health}
        found += health_findings(health, ranks, self.ecc_before)
        end = False
        for f in found:
            if f.key not in self.said:
                self.said.add(f.key)
                self.say(f.text + self._marked(f) + (f"; --gpu-watch strict: ending the job (exit code "
                                                     f"{GPU_WATCH_EXIT})"
                                                     if f.wrong_gpu and self.mode is WatchMode.STRICT else ""))
            end = end or (f.wrong_gpu and self.mode is WatchMode.STRICT)
        return end

    def _marked(self, f: Finding) -> str:
        """A failing GPU marked in the health ledger (selection/ledger.py), as the finding's line goes on."""
        if f.failing is None or self.ledger is None:
            return ""
        uuid, label, why = f.failing
        if not mark(self.ledger, uuid, why, self.run_id, label):
            return f"; it could not be marked failing for later jobs (the GPU lock directory {self.ledger} refused)"
        return (f"; GPU {label} is marked failing for the later jobs of this machine, whose automatic choice leaves "
                f"it out (`ddpboot gpus` shows why, `ddpboot gpus --clear {label}` clears the mark)")

    # Started only when active (`start`): what can end that is a broken reading.
    def due(self, now: float) -> float | None:
        return None if self.broken else self.next_look

    def on_wake(self, now: float, running: Running) -> Sequence[Answer]:
        if self.broken or now < self.next_look:
            return ()
        self.next_look = now + self.interval
        pids = {w.slot.rank: w.pid for w in running.workers if w.pid and w.status is None}
        if self.check(pids) and not self.ended:
            self.ended = True
            return (End(GPU_WATCH_EXIT, "--gpu-watch strict"),)
        return ()

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
            self.reader = None
