"""One stack dump: collect every live rank's stack, summarise, judge (verdict.py: the rank to look at), write
`stacks-N.txt` and `stacks-N.json` into the run directory and print the text on the launcher's console (and so into
its log). The text's last lines are the verdict (VERDICT_PREFIX) and the one that starts with STACKS_END_LINE; the
JSON file appears last (written whole, then renamed), so a reader that waits for it reads a complete dump.
`StackDumps` is the observer that takes one whenever the supervisor's decisions ask (DumpStacks).
"""

from __future__ import annotations

import json
import linecache
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ddpboot.contract import STACKS_END_LINE, stacks_file
from ddpboot.launch.observe.base import Job, Observer, Rank, Running
from ddpboot.launch.observe.stacks.behind import Finding, combined
from ddpboot.launch.observe.stacks.behind import judge as judge_flight
from ddpboot.launch.observe.stacks.collect import CPU, RankStack, RankTarget, collect, describe_gpus
from ddpboot.launch.observe.stacks.flight import Flight, merge, read_dir
from ddpboot.launch.observe.stacks.gather import FRESH, NodeReport, gather, publish
from ddpboot.launch.observe.stacks.summary import classify, main_frames, parse, without_launch_frames
from ddpboot.launch.observe.stacks.verdict import Left, Seen, Verdict, judge
from ddpboot.launch.rundir import RunPaths, write_whole

VERDICT_PREFIX = "ddpboot: verdict: "


@dataclass(frozen=True)
class Dump:
    reason: str
    stacks: list[RankStack]
    seconds: float
    left: tuple[Left, ...] = ()  # the attempt's ranks that had exited
    world_size: int | None = None  # the job's (None: unknown)
    node: int | None = None  # this node's rank, in a job of several nodes
    others: tuple[NodeReport, ...] = ()  # node 0: the other nodes' reports (gather.py)
    silent: tuple[int, ...] = ()  # node 0: the nodes without a fresh report
    flight: Flight | None = None  # NCCL's flight recorder dumps in the attempt directory (flight.py)

    def summary_lines(self) -> list[str]:
        return [summary_line(s) for s in self.stacks]

    def seen(self) -> list[Seen]:
        return [Seen(s.target.rank, classify(parse(s.text), source_line, gpu=s.target.gpus != CPU) if s.text else None,
                     self.node) for s in self.stacks]

    def verdict(self) -> Verdict:
        seen = [*self.seen(), *(s for r in self.others for s in r.seen)]
        left = [*(replace(x, node=self.node) for x in self.left), *(x for r in self.others for x in r.left)]
        verdict = judge(seen, left, self.world_size, self.silent)
        found = self.flight_finding()
        return combined(verdict, found) if found is not None else verdict

    def flight_finding(self) -> Finding | None:
        """What the flight recorder's dumps say, this node's with the other nodes' (behind.py)."""
        flight = merge([self.flight, *(r.flight for r in self.others)])
        return judge_flight(flight) if flight is not None else None

    def text(self) -> str:
        backends = sorted({s.backend for s in self.stacks if s.backend}) or ["none"]
        lines = [f"ddpboot: stacks of every rank ({self.reason}; backend: {', '.join(backends)})"]
        lines += [f"ddpboot:   {line}" for line in self.summary_lines()]
        for s in self.stacks:
            t = s.target
            lines.append(f"--- rank {t.rank} ({t.gpus}, pid {t.pid}, {s.backend or 'no stack'}) ---")
            body = without_launch_frames(s.text).rstrip("\n") if s.text else f"(no stack: {s.problem})"
            lines += [f"[rank{t.rank}]: {ln}" for ln in body.splitlines()]
        n = len(self.stacks)
        lines.append(VERDICT_PREFIX + self.verdict().text)
        lines.append(f"{STACKS_END_LINE} ({n} rank{'s' if n != 1 else ''}, {self.seconds:.1f} s)")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        verdict = self.verdict()
        return {
            "reason": self.reason,
            "seconds": round(self.seconds, 3),
            "verdict": verdict.text,
            "look_at": list(verdict.look_at),
            "flight": found.to_json() if (found := self.flight_finding()) is not None else None,
            "exited": [{"rank": x.rank, "code": x.code, "at": x.at} for x in self.left],
            "ranks": [{"rank": s.target.rank, "pid": s.target.pid, "gpus": s.target.gpus, "backend": s.backend,
                       "summary": where(s) if s.text else None, "problem": s.problem,
                       "stack": s.text} for s in self.stacks],
        }


def fingerprint(dump: Dump) -> tuple[object, ...] | None:
    """Each rank's main-thread frames, to compare two snapshots; None when a rank's stack could not be read."""
    if any(not s.text for s in dump.stacks):
        return None
    return tuple((s.target.pid, main_frames(parse(s.text))) for s in dump.stacks)


def source_line(file: str, line: int) -> str:
    """A frame's source line; py-spy shortens paths (`hang_job.py`), so an unreadable one is simply unknown."""
    return linecache.getline(file, line).strip() if file.startswith("/") else ""


def where(s: RankStack) -> str:
    """The one-line summary of where a rank whose stack was read waits."""
    return classify(parse(s.text), source_line, gpu=s.target.gpus != CPU).text


def summary_line(s: RankStack) -> str:
    t = s.target
    return f"rank {t.rank} ({t.gpus}, pid {t.pid}): {where(s) if s.text else f'no stack ({s.problem})'}"


def take(targets: Sequence[RankTarget], reason: str, env: Mapping[str, str], left: Sequence[Left] = (),
         world_size: int | None = None) -> Dump:
    t0 = time.monotonic()
    stacks = collect(targets, env, native=env.get("DDPBOOT_STACKS_NATIVE", "") == "1")
    directory = attempt_dir(targets)
    return Dump(reason, stacks, time.monotonic() - t0, tuple(left), world_size,
                flight=read_dir(directory) if directory is not None else None)


def attempt_dir(targets: Sequence[RankTarget]) -> Path | None:
    """The attempt directory the ranks' stacks files are in (where NCCL's flight recorder dumps with --log-dir)."""
    dirs = {t.stacks_file.parent for t in targets if t.stacks_file is not None}
    return dirs.pop() if len(dirs) == 1 else None


def shared(dump: Dump, node: int, nnodes: int, store: tuple[str, int], run_id: str) -> tuple[Dump, str | None]:
    """A dump of a job of several nodes (gather.py): node 0's with the other nodes' fresh reports, another node's
    after writing its own report into node 0's store; and why that could not be done, or None."""
    now = time.time()
    mine = replace(dump, node=node)
    if node != 0:
        left = tuple(replace(x, node=node) for x in dump.left)
        return mine, publish(*store, run_id, NodeReport(node, socket.gethostname(), tuple(mine.seen()), left, now,
                                                                dump.flight))
    others, silent = gather(*store, run_id, list(range(1, nnodes)), now - FRESH)
    return replace(mine, others=tuple(others), silent=tuple(silent)), None


def left_at(rank: int, code: int, ago: float, now: float | None = None) -> Left:
    """A rank that exited `ago` seconds before the dump, with the wall-clock time of its exit."""
    return Left(rank, code, time.strftime("%H:%M:%S", time.localtime((now or time.time()) - ago)), ago)


def write(dump: Dump, run_dir: Path, say: Callable[[str], None], kept: bool = True) -> Path | None:
    """Print the dump and write its files; the text file's path (None when the directory cannot be written).
    `kept`: the run directory stays after the run (--log-dir); a temporary one goes when the launcher exits, and
    the line that names the file says so."""
    text_path, json_path = RunPaths(run_dir).next_dump()
    text = dump.text()
    try:
        text_path.write_text(text + "\n", encoding="utf-8")
        write_whole(json_path, json.dumps(dump.to_json(), indent=1) + "\n")
    except OSError as exc:
        say(f"ddpboot: cannot write the stacks into {run_dir}: {exc}")
        say(text)
        return None
    head, _, rest = text.partition("\n")
    until = "" if kept else " until ddpboot exits (its temporary run directory goes then; --log-dir DIR keeps it)"
    say(f"{head}\nddpboot: stacks in {text_path}{until}\n{rest}")
    return text_path


def targets(workers: Sequence[Rank]) -> list[RankTarget]:
    """The running workers, as ranks whose stacks are wanted."""
    return [RankTarget(w.slot.rank, w.pid, describe_gpus(w.slot), stacks_file(str(w.error_file)))
            for w in workers if w.pid and w.status is None]


class StackDumps(Observer):
    """Every running rank's stack, into the console (and so the log) and the run directory, with the verdict (the
    ranks of the attempt that exited are part of it), whenever the decisions ask."""

    def __init__(self, job: Job) -> None:
        self.job = job

    @classmethod
    def start(cls, job: Job) -> StackDumps:
        return cls(job)

    def on_dump(self, reason: str, now: float, running: Running) -> None:
        job, plan = self.job, self.job.plan
        left = [left_at(w.slot.rank, w.code, now - w.ended) for w in running.workers
                if w.status is not None and w.ended is not None]
        dump = take(targets(running.workers), reason, job.env, left, plan.world_size)
        if plan.nnodes > 1:  # the verdict covers the job: node 0 reads the other nodes' reports
            dump, problem = shared(dump, plan.node_rank, plan.nnodes, (job.spec.master_addr, job.port),
                                   f"{job.spec.run_id}/attempt{job.attempt}")
            if problem:
                job.say(f"ddpboot: {problem}")
        write(dump, job.paths.root, job.say, kept=not job.temporary)
