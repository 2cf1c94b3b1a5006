"""What the supervisor tells the user: the failure summary of an attempt, the processes that outlive SIGKILL, and
rank isolation's one trap (no rank joined the job)."""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from ddpboot.launch.logs import Console, read_error_file
from ddpboot.launch.observe.death import written_by_ddpboot
from ddpboot.launch.observe.stacks.behind import finding
from ddpboot.launch.observe.stacks.collect import describe_gpus
from ddpboot.launch.observe.stacks.dump import VERDICT_PREFIX
from ddpboot.launch.supervisor.decisions import STUCK_REPORT
from ddpboot.launch.supervisor.workers import AttemptResult, Worker, describe_status
from ddpboot.procfs import wait_channel
from ddpboot.selection.planner import Plan
from ddpboot.units import plural

SUMMARY_LINES = 20


def failure_summary(result: AttemptResult, attempt: int, max_restarts: int, logs: Path | None,
                    cause: str | None = None) -> str:
    """The root cause of a failed attempt: which rank, how it ended (and why, `cause`: observe/death.py), its
    traceback or last lines, the others."""
    root = result.root
    assert root is not None and root.status is not None
    slot = root.slot
    ran = (root.ended or 0.0) - root.started
    when = ""
    if max_restarts:
        left = max_restarts - attempt
        when = f" on attempt {attempt} ({left} restart{'s' if left != 1 else ''} left)"
    lines = [
        f"ddpboot: rank {slot.rank} failed{when}: {describe_status(root.status)}",
        f"  local rank {slot.local_rank} · {describe_gpus(slot)} · pid {root.pid} · ran {ran:.2f} s",
        *([f"  why: {cause}"] if cause else []),
        f"  command: {shlex.join(root.argv)}",
        *_root_output(root),
    ]
    others = [w for w in result.workers if w is not root]
    if others:
        lines.append("  other ranks: " + "; ".join(f"rank {w.slot.rank}: {_how_it_ended(w)}" for w in others))
    lines.extend(_left_early(root, others))
    if logs is not None:
        lines.append(f"  logs: {logs}")
        found = finding(logs)  # post mortem: the dumps NCCL's flight recorder wrote at its timeout, if any
        if found is not None:
            lines.append(f"{VERDICT_PREFIX}flight recorder: {found.text}")
    return "\n".join(lines)


def _left_early(root: Worker, others: Sequence[Worker]) -> list[str]:
    """Ranks that ended with exit code 0 while the job failed: one that leaves early makes the ranks still in a
    collective fail with it, so the failure the summary names is often its consequence."""
    early = [w for w in others if w.status is not None and w.code == 0]
    if not early:
        return []
    names = ", ".join(str(w.slot.rank) for w in early)
    first = min(early, key=lambda w: w.ended or 0.0)
    when = ""
    if first.ended is not None and root.ended is not None and first.ended < root.ended:
        when = f", {root.ended - first.ended:.2f} s before rank {root.slot.rank} failed"
    return [f"  note: rank{'s' if len(early) > 1 else ''} {names} exited 0{when}, while the job failed. A rank that "
            "ends early (a rank-dependent return, break or exit) makes the ranks still in a collective fail "
            "('Connection closed by peer', a timeout): look at why "
            f"rank{'s' if len(early) > 1 else ''} {names} ended first."]


def _root_output(root: Worker) -> list[str]:
    recorded = None if written_by_ddpboot(root.error_file) else read_error_file(root.error_file)
    if recorded:
        return ["  traceback (recorded by @record in TORCHELASTIC_ERROR_FILE):",
                *("  | " + ln for ln in recorded.splitlines()[-60:])]
    tail = root.err.last_lines(SUMMARY_LINES)
    which = "stderr"
    if not tail:
        tail, which = root.out.last_lines(SUMMARY_LINES), "stdout"
    if not tail:
        return ["  it printed nothing."]
    return [f"  last lines of its {which}:", *("  | " + ln for ln in tail)]


def _how_it_ended(w: Worker) -> str:
    how = describe_status(w.status) if w.status is not None else "?"
    if w.signalled:
        how += f" after {', '.join(dict.fromkeys(w.signalled))}"
    return how


def report_unkillable(workers: Sequence[Worker], console: Console) -> None:
    """Processes that outlive SIGKILL are stuck in the kernel (typically a GPU driver call): say which, and
    where, since the launcher can only wait for them."""
    import psutil  # only on this rare path: the launcher stays light

    groups = {w.pid: w for w in workers if not w.group_gone}
    lines = []
    for proc in psutil.process_iter(["pid", "status", "name"]):
        try:
            pgid = os.getpgid(proc.info["pid"])
        except OSError:
            continue
        if pgid in groups:
            lines.append(f"  rank {groups[pgid].slot.rank}: pid {proc.info['pid']} ({proc.info['name']}), state "
                         f"{proc.info['status']}, in {wait_channel(proc.info['pid'])}")
    if lines:
        console.message(
            f"ddpboot: {len(lines)} process{'es' if len(lines) > 1 else ''} still alive {STUCK_REPORT:g} s after "
            "SIGKILL (stuck in the kernel; waiting for them):\n" + "\n".join(lines)
        )


def rank_isolated_gpus(plan: Plan) -> bool:
    """Whether rank isolation hides GPUs from the ranks: each rank sees fewer GPUs than the node's selected ones."""
    return plan.gpus_hidden_by_isolation() is not None


def no_join_report(plan: Plan) -> str:
    """Said after a job in which no rank ever joined the rendezvous, under rank isolation with GPUs: the common
    cause is a script that counted GPUs, saw only its own, and left without training (exit code 0)."""
    counts = plan.gpus_hidden_by_isolation()
    assert counts is not None, "only said when rank isolation hides GPUs"
    per_rank, selected = counts
    return (
        f"ddpboot: warning: no rank joined the job: none of the {plural(len(plan.ranks), 'rank')} used the "
        "rendezvous store (torch.distributed.init_process_group never ran, or ran against another store).\n"
        f"  Under --isolation rank (the default) each rank sees only its own GPU{'s' if per_rank > 1 else ''}: "
        f"torch.cuda.device_count() returns {per_rank} in every rank, not {selected}. A script that checks the "
        "GPU count before training (`if torch.cuda.device_count() < world_size: exit()`) stops there.\n"
        f"  Run it with --isolation node to give every rank all {selected} selected GPUs (torchrun's view). A script "
        "with no distributed code never joins: then this is expected."
    )
