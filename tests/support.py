"""Helpers shared by the test suites (not tests themselves): a clean environment, the real `ddpboot` console
script, launching it and waiting for what it does. Tests wait for conditions, never for a fixed time."""

from __future__ import annotations

import atexit
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest

from ddpboot.selection.gpu import GPU, Inventory

REPO = Path(__file__).resolve().parent.parent
GIB = 1024**3
# GPU locks taken by the processes tests start go here, not into the machine's shared lock directory.
_LOCK_DIR = tempfile.mkdtemp(prefix="ddpboot-test-locks-")
atexit.register(shutil.rmtree, _LOCK_DIR, True)


def ddpboot_exe() -> list[str]:
    """The installed console script (what users run), else `python -m ddpboot`."""
    exe = Path(sys.executable).with_name("ddpboot")
    if exe.exists():
        return [str(exe)]
    found = shutil.which("ddpboot")
    return [found] if found else [sys.executable, "-m", "ddpboot"]


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without anything that would steer ddpboot or torch.distributed."""
    drop_prefixes = ("DDPBOOT_", "PET_", "SLURM_", "TORCHELASTIC_")
    drop = {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "OMP_NUM_THREADS",
    }
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(drop_prefixes)}
    env["DDPBOOT_LOCK_DIR"] = _LOCK_DIR
    env.update(extra)
    return env


def run_ddpboot(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ddpboot_exe(), *args],
        env=clean_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )


# --- launching real jobs ---------------------------------------------------------------------------

SCRIPTS = Path(__file__).resolve().parent / "process" / "scripts"
BEHAVE = str(SCRIPTS / "launch_behave.py")
DDP = str(SCRIPTS / "launch_ddp.py")
ENVDUMP = str(SCRIPTS / "launch_env.py")
TIMEOUT = 120



def wait_for(cond: Callable[[], Any], timeout: float, what: str, interval: float = 0.01) -> Any:
    """Poll `cond` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def launch_env(out: Path, tmp: Path | None = None, **extra: str) -> dict[str, str]:
    """A clean environment for the launcher: two simulated GPUs, reports into `out`, its own TMPDIR."""
    env = clean_env(LAUNCH_TEST_OUT=str(out), DDPBOOT_FAKE_GPUS="2", **extra)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    return env


def run_launcher(
    args: Sequence[str], env: dict[str, str], timeout: float = TIMEOUT, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ddpboot_exe(), *args], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def start_launcher(args: Sequence[str], env: dict[str, str], text: bool = True) -> subprocess.Popen[Any]:
    """The launcher in its own session (as if started from a shell), so a test can clean up everything.
    `text=False` keeps the output's bytes as they are (text mode turns \\r into \\n)."""
    return subprocess.Popen(
        [*ddpboot_exe(), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen[Any], timeout: float = TIMEOUT) -> tuple[int, Any, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"the launcher did not exit within {timeout} s:\n{out}\n{err}") from None
    return proc.returncode, out, err


def reports(out: Path) -> dict[int, dict[str, Any]]:
    found = {}
    for path in out.glob("rank*.json"):
        data = json.loads(path.read_text())
        found[int(data.get("rank", path.stem[4:]))] = data
    return found


def gone(pid: int) -> bool:
    """Dead: no such process, or a zombie waiting for whoever adopted it."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def descendants(pid: int) -> list[int]:
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def base_keys() -> set[str]:
    return set(launch_env(Path("/nonexistent")))


# Ports handed to tests: below the kernel's ephemeral range (32768-60999 by default), where no outgoing connection
# takes one between free_port() and the launcher's bind, and one slice per pytest-xdist worker, so that two tests
# running at once never get the same port (torchrun's own defaults left out).
PORT_SLICE = 1500
_given: set[int] = set()


def free_port() -> int:
    """A port free at this moment (for tests that must name one; the launcher itself binds its own), in this
    worker's slice of the ports below the ephemeral range, not given before in this session."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    low = 20000 + (int(worker) if worker.isdigit() else 0) % 8 * PORT_SLICE
    candidates = [p for p in range(low, low + PORT_SLICE) if p not in _given and p not in (29400, 29500)]
    random.shuffle(candidates)
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise AssertionError(f"no free port left in {low}-{low + PORT_SLICE - 1}")


def as_uid(uid: int, work: Callable[[], list[str]]) -> list[str]:
    """What `work` returns when run in a forked child that dropped to `uid` (and no groups): a stranger on this
    machine. Needs root. The child never returns into pytest; an error in it comes back as ["error ..."]."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.write(write_end, json.dumps(work()).encode())
            code = 0
        except BaseException as exc:
            os.write(write_end, json.dumps([f"error {exc!r}"]).encode())
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    result: list[str] = json.loads(data)
    return result



# --- torch's TCPStore requests, written out by hand (not with ddpboot.tcpstore.protocol, which tests check) ------

VALIDATE = struct.pack("=BI", 0, 0x3C85F7CE)  # every client's first request: VALIDATE with torch's magic number
GETNUMKEYS = struct.pack("=B", 7)  # answered with 8 bytes


def vec(data: bytes) -> bytes:
    """A byte string as the protocol sends it: its length (a native uint64), then the bytes."""
    return struct.pack("=Q", len(data)) + data


def set_request(key: bytes, value: bytes) -> bytes:
    return struct.pack("=B", 1) + vec(key) + vec(value)


def talk(port: int, request: bytes, source: str | None = None) -> str:
    """Connect to the store on loopback `port` (from address `source` when given), send `request`, and say what
    came back: `closed` (end of stream or reset) or `answered b'...'` with the answer's first bytes."""
    bind = (source, 0) if source else None
    with socket.create_connection(("127.0.0.1", port), timeout=20, source_address=bind) as sock:
        try:
            sock.sendall(request)
            answer = sock.recv(64)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        return "closed" if not answer else f"answered {answer!r}"


# --- machines and launchers' environments, as the unit tests build them ---------------------------------------


def mig_machine() -> Inventory:
    """Two simulated A100s of 80 GiB: GPU 0 split into two MIG instances of 40 GiB, GPU 1 whole."""
    parent = GPU(0, "GPU-0000aaaa", "00000000:01:00.0", "A100", 80 * GIB, 0)
    migs = tuple(
        GPU(0, f"MIG-{j}{j}{j}{j}cccc", parent.pci_bus_id, "A100 MIG 3g", 40 * GIB, 0, mig_index=j) for j in range(2)
    )
    plain = GPU(1, "GPU-1111bbbb", "00000000:02:00.0", "A100", 80 * GIB, 0)
    return Inventory((GPU(**{**parent.__dict__, "mig_devices": migs}), plain), "fake")


def srun_env(node: int, nodelist: str) -> dict[str, str]:
    """What srun gives the launcher on node `node` (0 or 1) of a two-node step with --ntasks-per-node=1."""
    return {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": str(node),
        "SLURM_NODEID": str(node),
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_NODELIST": nodelist,
    }


def gpu_count() -> int:
    """How many GPUs `nvidia-smi -L` lists; skips the test where there is no nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi on this machine: GPU tests need NVIDIA GPUs and their driver")
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


# --- what a terminal shows -------------------------------------------------------------------------


def render_terminal(data: bytes) -> list[str]:
    """The lines a terminal shows after `data`: text, `\\r`, `\\n` (as a terminal's default onlcr does: to the start
    of the next line) and the escapes the launcher draws progress bars with (cursor up/down `ESC[nA`/`ESC[nB`,
    erase to the end of the line `ESC[K` and of the screen `ESC[J`). The screen has no bottom: nothing scrolls off."""
    import re

    rows: list[list[str]] = [[]]
    row = col = 0
    for m in re.finditer(r"\x1b\[(\d*)([ABJK])|\r|\n|[^\x1b\r\n]", data.decode(errors="replace")):
        token = m.group(0)
        if m.group(2) == "A":
            row = max(0, row - int(m.group(1) or 1))
        elif m.group(2) == "B":
            row += int(m.group(1) or 1)
        elif m.group(2) in ("J", "K"):
            del rows[row][col:]
            if m.group(2) == "J":
                del rows[row + 1:]
        elif token == "\r":
            col = 0
        elif token == "\n":
            row, col = row + 1, 0
        else:
            rows[row].extend(" " * (col - len(rows[row])))
            rows[row][col:col + 1] = [token]
            col += 1
        rows.extend([] for _ in range(row + 1 - len(rows)))
    lines = ["".join(r).rstrip() for r in rows]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def tagged(tag: str, var: str = "CORPUS_JOB") -> list[psutil.Process]:
    """The live processes whose environment carries var=tag (how a test finds every process of one job)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(var) == tag and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stderr_until(proc: subprocess.Popen[Any], done: Callable[[list[str]], bool], timeout: float) -> list[str]:
    """The lines of a running process's stderr (a pipe) as they come, until `done(lines)` or its end or the
    timeout. Reads the pipe's descriptor itself: a text file's readline() may buffer lines that select() no longer
    sees. What was read is not left for communicate(); the caller has it here."""
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    lines: list[str] = []
    pending = b""
    deadline = time.monotonic() + timeout
    while not done(lines):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        data = os.read(fd, 65536)
        if not data:
            break
        pending += data
        *complete, pending = pending.split(b"\n")
        lines += [ln.decode(errors="replace") for ln in complete]
    return lines


def ranks_named(text: str, said: str) -> list[int]:
    """The ranks named by the prefixes of the console lines that show `said` (`[rank0-3]: said` names 0, 1, 2 and
    3; `[rank2]: said` names 2), in console order: a line said alike by several ranks is shown once or once per rank
    (collapsed or not), and either way each rank that said it is named once."""
    named: list[int] = []
    for m in re.finditer(rf"^\[rank([\d,-]+)\]: {re.escape(said)}$", text, re.M):
        for part in m[1].split(","):
            first, _, last = part.partition("-")
            named += range(int(first), int(last or first) + 1)
    return named


def launch_spec(**changes: Any) -> Any:
    """A LaunchSpec for unit tests: the command line's defaults as launch/config.py parses them (no signals
    forwarded), one node's store on loopback, no log directory; `changes` replace any field."""
    from ddpboot.launch.config import RunOptions, supervision
    from ddpboot.launch.pymain import TargetKind
    from ddpboot.launch.spec import LaunchSpec, LogMode, Routing, Target

    base = {**supervision(RunOptions(script="train.py")).shared(), "signals": (),
            "target": Target(TargetKind.SCRIPT, "train.py"), "python": sys.executable, "run_id": "run-1",
            "routing": Routing(),
            "master_addr": "127.0.0.1", "bind_addr": "127.0.0.1", "master_port": None, "store_allow": None,
            "log_dir": None, "log_mode": LogMode.PRIVATE}
    return LaunchSpec(**{**base, **changes})
