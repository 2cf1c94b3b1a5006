"""`ddpboot smoke`: is this machine, with these GPUs, ready for DDP? A verdict per check and rank.

The driver plans exactly as a job would (the same selection options), runs the planned ranks through the
launcher with the checks of `ddpboot.smoke.rank`, watches the GPUs outside the plan through NVML while they run,
and reports a table (or `--json`, `--junit-xml`). `--timeout` bounds the whole run: a collective that hangs
becomes a failed check naming the rank that never arrived, not a hung CI job; before stopping the launcher at the
timeout, the driver asks it for every rank's stack (ddpboot/launch/observe/stacks/) and adds the summary to the notes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddpboot.errors import UsageError
from ddpboot.launch.procs.groups import signal_group
from ddpboot.selection.inventory import load_inventory
from ddpboot.selection.planner import Plan
from ddpboot.smoke.checks import DRIVER_CHECKS
from ddpboot.smoke.checks import RANK_CHECKS as CHECKS
from ddpboot.units import format_size


@dataclass
class Verdict:
    check: str
    rank: int | None  # None: a check of the whole job (isolation)
    status: str  # pass, fail, skip
    detail: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Report:
    plan: Plan
    verdicts: list[Verdict]
    launcher_exit: int | None
    wall_seconds: float
    notes: list[str]

    @property
    def passed(self) -> bool:
        return all(v.status != "fail" for v in self.verdicts)

    @property
    def backend(self) -> str:
        """The backend the ranks initialised (simulated GPUs run gloo where the plan says nccl); the plan's when no
        rank got that far."""
        used = {v.figures["backend"] for v in self.verdicts if v.check == "init" and "backend" in v.figures}
        return ",".join(sorted(used)) or self.plan.backend

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "world_size": self.plan.world_size,
            "backend": self.backend,
            "wall_seconds": self.wall_seconds,
            "launcher_exit": self.launcher_exit,
            "notes": self.notes,
            "plan": self.plan.to_json(),
            "checks": [v.__dict__ for v in self.verdicts],
        }


def parse_checks(text: str | None) -> list[str]:
    if not text:
        return list(CHECKS + DRIVER_CHECKS)
    names = [c.strip() for c in text.split(",") if c.strip()]
    unknown = [c for c in names if c not in CHECKS + DRIVER_CHECKS]
    if unknown:
        raise UsageError(
            f"--checks: no check named {', '.join(map(repr, unknown))}. The checks are: "
            f"{', '.join(CHECKS + DRIVER_CHECKS)}."
        )
    return names


def cap_max_bytes(requested: int, plan: Plan, notes: list[str]) -> int:
    """All-reduce buffers must fit in the free memory of every planned GPU (with room for NCCL's own)."""
    if requested <= 0:
        raise UsageError(f"--max-bytes {requested}: give a positive size, e.g. 256MiB.")
    free = [g.memory_free for slot in plan.ranks for g in slot.gpus]
    if not free:
        return requested
    limit = min(free) // 4
    if requested > limit:
        notes.append(
            f"--max-bytes {format_size(requested)} does not fit the free memory of every planned GPU "
            f"(smallest free: {format_size(min(free))}); capped at {format_size(limit)}"
        )
        return limit
    return requested


def launcher_args(plan: Plan) -> list[str]:
    """Options that make the launcher run exactly this plan."""
    if not plan.ranks[0].gpus:
        return ["--nproc", str(len(plan.ranks)), "--cpu"]
    uuids = ",".join(g.uuid for slot in plan.ranks for g in slot.gpus)
    per = len(plan.ranks[0].gpus)
    return ["--gpus", uuids, "--gpus-per-proc", str(per), "--isolation", plan.isolation, "--share"]


class MemoryWatch:
    """The most memory each GPU outside the plan gained over its level at the start (NVML)."""

    def __init__(self, plan: Plan, env: Mapping[str, str]) -> None:
        self.env = env
        planned = {g.uuid for slot in plan.ranks for g in slot.gpus}
        inv = load_inventory(env)
        self.enabled = inv.source == "nvml"
        self.baseline = {g.uuid: g.memory_used for g in inv.units() if g.uuid not in planned}
        self.labels = {g.uuid: g.label for g in inv.units()}
        self.gained = dict.fromkeys(self.baseline, 0)

    def sample(self) -> None:
        if not self.enabled or not self.baseline:
            return
        for g in load_inventory(self.env).units():
            if g.uuid in self.baseline:
                self.gained[g.uuid] = max(self.gained[g.uuid], g.memory_used - self.baseline[g.uuid])


def run_smoke(
    plan: Plan,
    checks: Sequence[str],
    max_bytes: int,
    timeout: float,
    env: Mapping[str, str] | None = None,
    extra_launcher_args: Sequence[str] = (),
) -> Report:
    env = dict(os.environ if env is None else env)
    notes: list[str] = list(plan.notes)
    max_bytes = cap_max_bytes(max_bytes, plan, notes)
    rank_checks = [c for c in checks if c in CHECKS]
    watch = MemoryWatch(plan, env)
    with tempfile.TemporaryDirectory(prefix="ddpboot-smoke-") as tmp:
        out = Path(tmp)
        child_env = {
            **env,
            "DDPBOOT_SMOKE_DIR": str(out),
            "DDPBOOT_SMOKE_CHECKS": ",".join(rank_checks),
            "DDPBOOT_SMOKE_MAX_BYTES": str(max_bytes),
            "DDPBOOT_SMOKE_TIMEOUT": str(max(timeout - 5, 5)),
            "NCCL_DEBUG": env.get("NCCL_DEBUG", "INFO"),
            "NCCL_DEBUG_SUBSYS": env.get("NCCL_DEBUG_SUBSYS", "INIT,P2P"),
            "NCCL_DEBUG_FILE": str(out / "nccl.%h.%p.log"),
        }
        cmd = [sys.executable, "-m", "ddpboot", *launcher_args(plan), "--shutdown-timeout", "3",
               *extra_launcher_args, "-m", "ddpboot.smoke.rank"]
        start = time.time()
        proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        deadline = time.monotonic() + timeout
        timed_out = False
        while proc.poll() is None:
            watch.sample()
            if time.monotonic() > deadline:
                timed_out = True
                notes += stacks_at_timeout(proc.pid)
                _stop(proc)
                break
            time.sleep(0.2)  # the NVML sampling period, not a wait for a condition
        output = proc.stdout.read() if proc.stdout else ""
        proc.wait()
        wall = time.time() - start
        verdicts = collect(out, plan, ["init", *rank_checks], timed_out, timeout)
        if "isolation" in checks:
            verdicts.append(isolation_verdict(watch))
        if "timing" in checks:
            verdicts.extend(timing_verdicts(out, plan, start))
        transport = nccl_transport(out)
        if transport:
            for v in verdicts:
                if v.check == "bandwidth" and v.status == "pass":
                    v.figures["transport"] = transport
                    v.detail += f" via {transport}"
    if proc.returncode not in (0, None) and all(v.status != "fail" for v in verdicts):
        verdicts.append(Verdict("launcher", None, "fail", f"the launcher exited {proc.returncode}:\n{output[-2000:]}"))
    return Report(plan, verdicts, proc.returncode, wall, notes)


def stacks_at_timeout(pid: int) -> list[str]:
    """Ask the launcher (pid) for a stack dump; the notes that say where each rank was."""
    from ddpboot.launch.observe.stacks.find import find, request_dump

    try:
        path = request_dump(find(str(pid)), timeout=20)
    except (UsageError, OSError) as exc:
        return [f"no stacks at the timeout: {exc}"]
    if path is None:
        return ["no stacks at the timeout: the launcher wrote no dump within 20 s"]
    dump = json.loads(path.read_text(encoding="utf-8"))
    return [f"at the timeout, rank {r['rank']} ({r['gpus']}, pid {r['pid']}) was in: "
            f"{r['summary'] or r['problem']}" for r in dump["ranks"]]


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM the launcher (it stops its workers), SIGKILL its session if it has not gone after a grace."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=8)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            signal_group(proc.pid, signal.SIGKILL)  # its own session (start_new_session)


def _events(out: Path, rank: int) -> list[dict[str, Any]]:
    path = out / f"rank{rank}.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill
    return events


def collect(out: Path, plan: Plan, checks: Sequence[str], timed_out: bool, timeout: float) -> list[Verdict]:
    ranks = [slot.rank for slot in plan.ranks]
    per_rank = {r: _events(out, r) for r in ranks}
    finished: dict[int, dict[str, dict[str, Any]]] = {r: {} for r in ranks}
    started: dict[int, set[str]] = {r: set() for r in ranks}
    for r, events in per_rank.items():
        for event in events:
            if event["status"] == "start":
                started[r].add(event["check"])
            else:
                finished[r][event["check"]] = event
    verdicts = []
    for check in checks:
        arrived = [r for r in ranks if check in started[r]]
        for r in ranks:
            done = finished[r].get(check)
            if done is not None:
                verdicts.append(Verdict(check, r, done["status"], done.get("detail", ""), done.get("figures") or {},
                                        done.get("seconds", 0.0)))
                continue
            if not arrived:
                verdicts.append(Verdict(check, r, "skip", "not reached: the run stopped earlier"))
                continue
            missing = [x for x in ranks if x not in arrived]
            if check in started[r]:
                why = "hung" if timed_out else "did not finish"
                blame = f"; rank(s) {', '.join(map(str, missing))} never reached it" if missing else ""
                verdicts.append(Verdict(check, r, "fail", f"{why} (timeout {timeout:.0f} s){blame}"))
            else:
                last = [e["check"] for e in per_rank[r] if e["status"] != "start"]
                after = f" (stuck after {last[-1]})" if last else ""
                verdicts.append(Verdict(check, r, "fail", f"rank {r} never reached {check}{after}"))
    return verdicts


def isolation_verdict(watch: MemoryWatch) -> Verdict:
    if not watch.enabled:
        return Verdict("isolation", None, "skip", "no NVML (simulated or no GPUs): memory of other GPUs not read")
    if not watch.baseline:
        return Verdict("isolation", None, "pass", "every GPU of the machine is in the plan", {})
    gained = {watch.labels[u]: g for u, g in watch.gained.items()}
    bad = {k: v for k, v in gained.items() if v > 0}
    if bad:
        text = ", ".join(f"GPU {k} +{format_size(v)}" for k, v in bad.items())
        return Verdict("isolation", None, "fail", f"GPUs outside the plan gained memory: {text}", {"gained": gained})
    return Verdict("isolation", None, "pass", f"GPUs {', '.join(gained)} outside the plan gained 0 bytes",
                   {"gained": gained})


def timing_verdicts(out: Path, plan: Plan, start: float) -> list[Verdict]:
    verdicts = []
    for slot in plan.ranks:
        done = [e for e in _events(out, slot.rank) if e["check"] == "init" and e["status"] == "pass"]
        if done:
            secs = done[0]["figures"]["first_collective_at"] - start
            verdicts.append(Verdict("timing", slot.rank, "pass", f"first collective {secs:.2f} s after launch",
                                    {"first_collective_seconds": secs}))
        else:
            verdicts.append(Verdict("timing", slot.rank, "skip", "no collective completed"))
    return verdicts


def nccl_transport(out: Path) -> str:
    """The transport NCCL reported for its channels (e.g. P2P/CUMEM, SHM, NET/Socket), when it logged one."""
    seen: list[str] = []
    for f in out.glob("nccl.*.log"):
        for line in f.read_text(errors="replace").splitlines():
            if " via " in line and "Channel" in line:
                t = line.split(" via ", 1)[1].split()[0]
                if t not in seen:
                    seen.append(t)
    return ", ".join(seen)


def junit_xml(report: Report) -> str:
    """JUnit XML as Jenkins, GitLab and GitHub test reporters read it: one testcase per check and rank."""
    suite = ET.Element("testsuite", name="ddpboot smoke", tests=str(len(report.verdicts)),
                       failures=str(sum(v.status == "fail" for v in report.verdicts)), errors="0",
                       skipped=str(sum(v.status == "skip" for v in report.verdicts)),
                       time=f"{report.wall_seconds:.3f}", timestamp=time.strftime("%Y-%m-%dT%H:%M:%S"))
    for v in report.verdicts:
        case = ET.SubElement(suite, "testcase", classname=f"ddpboot.smoke.{v.check}",
                             name=f"rank{v.rank}" if v.rank is not None else "job", time=f"{v.seconds:.3f}")
        if v.status == "fail":
            ET.SubElement(case, "failure", message=v.detail.splitlines()[0] if v.detail else "failed",
                          type="SmokeCheckFailure").text = v.detail
        elif v.status == "skip":
            ET.SubElement(case, "skipped", message=v.detail)
        elif v.figures:
            ET.SubElement(case, "system-out").text = json.dumps(v.figures)
    root = ET.Element("testsuites", name="ddpboot smoke", tests=suite.get("tests", "0"),
                      failures=suite.get("failures", "0"), errors="0", time=suite.get("time", "0"))
    root.append(suite)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
