"""Collect each rank's current Python stack, with py-spy when it is there and permitted, else through the
faulthandler the rank registered (ddpboot/contract.py STACKS_VAR).

py-spy (`pip install ddpboot[debug]`) reads a process's memory with ptrace: it sees every thread, whatever it waits
in, and needs no cooperation from the rank; it fails where ptrace is restricted (Yama's ptrace_scope, a container
without CAP_SYS_PTRACE), and then says so. The fallback sends RANK_STACKS_SIGNAL to a rank that registered
faulthandler on it (every Python rank, before its script's first line: the rank bootstrap, launch/bootstrap.py, and
the fast-start process; `ddpboot.init()` too) and reads what it appended to its stacks file; a rank whose /proc
status does not show the signal caught is never sent it (its default action would kill the rank).
DDPBOOT_STACKS_BACKEND=py-spy|faulthandler forces one backend (auto: the default).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ddpboot.contract import RANK_STACKS_SIGNAL
from ddpboot.launch.procs.groups import signal_process
from ddpboot.selection.planner import RankSlot
from ddpboot.units import short_uuid

BACKEND_VAR = "DDPBOOT_STACKS_BACKEND"
BACKENDS = ("auto", "py-spy", "faulthandler")
PYSPY_TIMEOUT = 10.0  # seconds for one `py-spy dump`
FAULTHANDLER_TIMEOUT = 3.0  # seconds for a rank's faulthandler to write its stacks
SETTLE = 0.1  # a stacks file unchanged this long after it grew is complete


CPU = "CPU"  # RankTarget.gpus of a rank without a GPU


def describe_gpus(slot: RankSlot) -> str:
    """A rank's GPUs as the dumps and the failure summary name them: CPU, or "GPU 0 (GPU-1234abcd…)"."""
    if not slot.gpus:
        return CPU
    return ", ".join(f"GPU {g.label} ({short_uuid(g.uuid)})" for g in slot.gpus)


@dataclass(frozen=True)
class RankTarget:
    """A rank whose stack is wanted."""

    rank: int
    pid: int
    gpus: str  # CPU or "GPU 0 (GPU-1234abcd…)"
    stacks_file: Path | None  # where its faulthandler writes (None: not registered through ddpboot)


@dataclass(frozen=True)
class RankStack:
    target: RankTarget
    text: str  # the stack text ("" when none was had)
    backend: str | None  # "py-spy" or "faulthandler"; None: neither worked
    problem: str | None = None  # why a backend failed or was skipped


def find_py_spy(env: Mapping[str, str]) -> str | None:
    """py-spy on PATH or beside this interpreter (a virtual environment's bin/), unless the backend is forced."""
    if env.get(BACKEND_VAR, "auto") == "faulthandler":
        return None
    found = shutil.which("py-spy", path=env.get("PATH"))
    beside = Path(sys.executable).parent / "py-spy"
    return found or (str(beside) if beside.is_file() and os.access(beside, os.X_OK) else None)


def collect(targets: Sequence[RankTarget], env: Mapping[str, str], native: bool = False) -> list[RankStack]:
    """Every target's stack: py-spy first (all ranks at once), faulthandler for the ranks py-spy did not get."""
    forced = env.get(BACKEND_VAR, "auto")
    py_spy = find_py_spy(env)
    got: dict[int, RankStack] = {}
    problems: dict[int, str] = {}
    if py_spy is not None:
        got, problems = _py_spy(py_spy, targets, native)
    elif forced != "faulthandler":
        problems = dict.fromkeys((t.pid for t in targets), "py-spy is not installed (pip install ddpboot[debug])")
    rest = [t for t in targets if t.pid not in got]
    if rest and forced != "py-spy":
        got.update(_faulthandler(rest, problems))
    return [got.get(t.pid) or RankStack(t, "", None, problems.get(t.pid, "no backend")) for t in targets]


def _py_spy(exe: str, targets: Sequence[RankTarget], native: bool) -> tuple[dict[int, RankStack], dict[int, str]]:
    procs = {}
    got: dict[int, RankStack] = {}
    problems: dict[int, str] = {}
    for t in targets:
        cmd = [exe, "dump", "--full-filenames", "--pid", str(t.pid), *(["--native"] if native else [])]
        try:
            procs[t.pid] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            stdin=subprocess.DEVNULL)
        except OSError as exc:  # out of processes (ulimit -u) or files: the rank's faulthandler may still answer
            problems[t.pid] = f"py-spy could not be started: {exc.strerror or exc}"
    deadline = time.monotonic() + PYSPY_TIMEOUT
    for t in targets:
        p = procs.get(t.pid)
        if p is None:
            continue
        try:
            out, err = p.communicate(timeout=max(deadline - time.monotonic(), 0.1))
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            problems[t.pid] = f"py-spy did not answer within {PYSPY_TIMEOUT:g} s"
            continue
        if p.returncode == 0 and out.strip():
            got[t.pid] = RankStack(t, out, "py-spy")
        else:
            problems[t.pid] = "py-spy failed: " + _first_line(err or out, f"exit code {p.returncode}") + (
                " (ptrace is restricted: run as root, give CAP_SYS_PTRACE, or set kernel.yama.ptrace_scope=0)"
                if "ermission" in (err or "") else "")
    return got, problems


def _first_line(text: str, default: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[0] if lines else default


def catches(pid: int, signo: int) -> bool:
    """Whether /proc/PID/status shows a handler for `signo` (SigCgt)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signo - 1) & 1)
    except (OSError, ValueError, IndexError):
        return False
    return False


def _faulthandler(targets: Sequence[RankTarget], problems: Mapping[int, str]) -> dict[int, RankStack]:
    sent: dict[int, int] = {}  # pid -> the stacks file's size before the signal
    out: dict[int, RankStack] = {}
    for t in targets:
        why = problems.get(t.pid)
        if t.stacks_file is None or not catches(t.pid, RANK_STACKS_SIGNAL):
            reason = "the rank registered no faulthandler (a --no-python program registers none)"
            out[t.pid] = RankStack(t, "", None, f"{why}; {reason}" if why else reason)
            continue
        sent[t.pid] = _size(t.stacks_file)
        with contextlib.suppress(ProcessLookupError):
            signal_process(t.pid, RANK_STACKS_SIGNAL)
    texts = _read_new(targets, sent)
    for t in targets:
        if t.pid in sent:
            text = texts.get(t.pid, "")
            out[t.pid] = RankStack(t, text, "faulthandler" if text else None,
                                   None if text else f"faulthandler wrote nothing in {FAULTHANDLER_TIMEOUT:g} s")
    return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_new(targets: Sequence[RankTarget], sent: Mapping[int, int]) -> dict[int, str]:
    """What each signalled rank appended, once every file has grown and stayed unchanged for SETTLE seconds."""
    files = {t.pid: t.stacks_file for t in targets if t.pid in sent and t.stacks_file is not None}
    deadline = time.monotonic() + FAULTHANDLER_TIMEOUT
    sizes = {pid: sent[pid] for pid in files}
    stable_since = time.monotonic()
    while time.monotonic() < deadline:
        now_sizes = {pid: _size(path) for pid, path in files.items()}
        if now_sizes != sizes:
            sizes, stable_since = now_sizes, time.monotonic()
        elif all(sizes[p] > sent[p] for p in files) and time.monotonic() - stable_since >= SETTLE:
            break
        time.sleep(0.02)  # polling a file another process writes from a signal handler
    out = {}
    for pid, path in files.items():
        try:
            with open(path, "rb") as f:
                f.seek(sent[pid])
                out[pid] = f.read().decode("utf-8", "replace")
        except OSError:
            out[pid] = ""
    return out
