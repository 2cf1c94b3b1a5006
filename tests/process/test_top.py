"""`ddpboot top` against a real 2-rank job on CPU (ranks that print, draw a progress bar and wait for a release
file): `--json` names each rank's pid, state, memory, bar and GPU memory from the simulated inventory's process
list, and the GPU watch's warning; the live table in a real pty fits 80 columns, is redrawn in place when a rank
exits, and leaves on `q`; after the job, `top` says so (exit 2)."""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path
from typing import Any

from tests.support import (
    TIMEOUT,
    clean_env,
    ddpboot_exe,
    descendants,
    finish,
    launch_env,
    render_terminal,
    run_ddpboot,
    start_launcher,
    wait_for,
)

RANK = """\
import os, sys, time
from pathlib import Path
rank, release = int(os.environ["RANK"]), Path(sys.argv[1])
print(f"rank {rank} ready", flush=True)
sys.stderr.write(f"\\rtrain:  40%|####      | 4/10 r{rank}")
sys.stderr.flush()
while not (release / "all").exists() and not (release / f"rank{rank}").exists():
    time.sleep(0.02)
"""
MIB = 1 << 20


def start_job(tmp_path: Path, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen[Any], Path, dict[str, Any]]:
    """The job, its run directory, and its first status that shows both ranks' bars."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = start_launcher(["--nproc", "2", "--log-dir", str(tmp_path / "logs"), *extra, str(script),
                           str(tmp_path)], env)

    def both_bars() -> tuple[Path, dict[str, Any]] | None:
        assert proc.poll() is None, proc.communicate()
        for path in (tmp_path / "logs").glob("*/status.json"):
            status = json.loads(path.read_text())
            if all(r["bar"] for r in status["ranks"]) and len(status["ranks"]) == 2:
                return path.parent, status
        return None

    run_dir, status = wait_for(both_bars, 60, "the job's status with both ranks' bars")
    return proc, run_dir, status


def top_json(run: str, env: dict[str, str]) -> dict[str, Any]:
    got = run_ddpboot("top", run, "--json", "--interval", "0.2", env=env, timeout=60)
    assert got.returncode == 0, got.stderr
    return dict(json.loads(got.stdout))


def inventory(path: Path, processes: list[list[dict[str, int]]]) -> None:
    path.write_text(json.dumps([{"index": i, "uuid": f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd",
                                 "memory_total": 80 << 30, "utilization": 2 * i + 1, "processes": procs}
                                for i, procs in enumerate(processes)]))


def test_top_json_shows_each_rank_and_the_gpu_watchs_warning(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus.json"
    inventory(gpus, [[], []])
    env = launch_env(tmp_path)
    env["DDPBOOT_FAKE_GPUS"] = str(gpus)
    proc, run_dir, status = start_job(tmp_path, env, "--gpu-watch-interval", "0.1")
    try:
        snap = top_json(str(run_dir), env)
        pids = [r["pid"] for r in snap["ranks"]]
        assert set(pids) <= set(descendants(proc.pid)) and len(set(pids)) == 2, snap
        assert (snap["launcher_pid"], snap["run_id"], snap["world_size"]) == (proc.pid, status["run_id"], 2)
        for i, row in enumerate(snap["ranks"]):
            assert (row["rank"], row["state"], row["node"]) == (i, "running", 0), row
            assert row["rss"] > MIB and row["cpu_percent"] is not None and row["since_output"] >= 0
            assert row["progress"] == f"train:  40%|####      | 4/10 r{i}"
            assert [(g["label"], g["used_memory"], g["utilization"]) for g in row["gpus"]] == [(str(i), 0, 2 * i + 1)]
        # rank 0 takes 700 MiB on its GPU; this test process takes 300 MiB there, a stranger the watch names
        inventory(gpus, [[{"pid": pids[0], "used_memory": 700 * MIB}, {"pid": os.getpid(), "used_memory": 300 * MIB}],
                         []])
        wait_for(lambda: json.loads((run_dir / "status.json").read_text())["warnings"], 30, "the watch's warning")
        snap = top_json(str(proc.pid), env)
        assert snap["ranks"][0]["gpus"][0]["used_memory"] == 700 * MIB
        [warning] = snap["warnings"]
        assert f"pid {os.getpid()} " in warning and "is not this job's and uses 300 MiB on GPU 0" in warning
        # into a pipe (`ddpboot top RUN | cat`, `watch`): the table once, while the job runs, and exit 0
        piped = run_ddpboot("top", str(proc.pid), "--interval", "0.2", env={**env, "COLUMNS": "100"}, timeout=60)
        assert piped.returncode == 0 and piped.stdout.startswith(f"run {status['run_id']} · launcher pid {proc.pid}")
        rows = [line.split("│") for line in piped.stdout.splitlines() if "│" in line]
        assert [(r[0].strip(), r[2].strip()) for r in rows] == [("0", str(pids[0])), ("1", str(pids[1]))], piped
        # (the warning names the stranger's command line, pytest's own here: where it wraps depends on how pytest ran)
        assert "is not this job's" in " ".join(piped.stdout.split()) and "q or Ctrl-C" not in piped.stdout
    finally:
        (tmp_path / "all").touch()
    code, _, err = finish(proc, TIMEOUT)
    assert code == 0, err
    assert not (run_dir / "status.json").exists()
    after = run_ddpboot("top", str(run_dir), env=env)
    assert after.returncode == 2 and "no running ddpboot job" in after.stderr and after.stdout == "", after


def read_screen(fd: int, seen: bytearray, done: Any, timeout: float) -> list[str]:
    """Read the pty until the screen it shows satisfies `done`; the screen's lines."""
    deadline = time.monotonic() + timeout
    while True:
        lines = render_terminal(re.sub(rb"\x1b\[[0-9;?]*[hlm]", b"", bytes(seen)))
        if done(lines):
            return lines
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError("the screen never showed what was awaited:\n" + "\n".join(lines))
        if select.select([fd], [], [], left)[0]:
            try:
                seen += os.read(fd, 1 << 16)
            except OSError:  # EIO: `top` has exited
                raise AssertionError("top exited before showing what was awaited:\n" + "\n".join(lines)) from None


def test_top_in_a_terminal_fits_80_columns_redraws_in_place_and_leaves_on_q(tmp_path: Path) -> None:
    env = launch_env(tmp_path)
    proc, _, status = start_job(tmp_path, env)
    main, side = os.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    top = subprocess.Popen([*ddpboot_exe(), "top", str(status["pid"]), "--interval", "0.2"],
                           env=clean_env(TERM="xterm"), stdin=side, stdout=side, stderr=side, start_new_session=True)
    os.close(side)
    seen = bytearray()
    try:
        def rows(lines: list[str]) -> list[str]:
            return [ln for ln in lines if re.match(r"[01] +│", ln)]

        lines = read_screen(main, seen, lambda ls: len([r for r in rows(ls) if "running" in r]) == 2, 30)
        assert lines[0].startswith(f"run {status['run_id']} · launcher pid {status['pid']}"), lines
        assert all("train: 40% 4/10" in r for r in rows(lines)), lines
        (tmp_path / "rank1").touch()  # rank 1 ends (exit 0); rank 0 runs on
        lines = read_screen(main, seen, lambda ls: any("exited 0" in r for r in rows(ls) if r.startswith("1")), 30)
        assert max(len(ln) for ln in lines) <= 80, lines
        assert len([ln for ln in lines if ln.startswith("rank")]) == 1, lines  # redrawn in place, not appended
        assert "q or Ctrl-C to leave" in lines[-1], lines
        os.write(main, b"q")
        assert top.wait(timeout=30) == 0
    finally:
        if top.poll() is None:
            top.kill()
            top.wait()
        os.close(main)
        (tmp_path / "all").touch()
    code, _, err = finish(proc, TIMEOUT)
    assert code == 0, err
