"""Worker output through the launcher: rank prefixes, whole lines, per-rank files, -r/-t/filters for any rank,
live progress bars, nothing left in the temp dir, and nothing lost from a rank that dies."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import termios
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import (
    BEHAVE,
    ddpboot_exe,
    finish,
    launch_env,
    ranks_named,
    render_terminal,
    run_launcher,
    start_launcher,
    wait_for,
)

LINE = re.compile(r"^\[rank(\d+)\]: (out|err) (\d+) line (\d+) ?(x*)$")


def parse_console(text: str, stream: str) -> dict[int, list[int]]:
    """rank → the line numbers it printed, in console order; every line must be one whole line of one rank."""
    seen: dict[int, list[int]] = {}
    for line in text.splitlines():
        if line.startswith("ddpboot:") or line.startswith("  "):
            continue
        m = LINE.match(line)
        assert m, f"not one whole prefixed line: {line!r}"
        rank, kind, who, number, xs = int(m[1]), m[2], int(m[3]), int(m[4]), m[5]
        assert kind == stream and who == rank, line
        if kind == "out":
            assert len(xs) == number % 37, line
        seen.setdefault(rank, []).append(number)
    return seen


def test_lines_are_prefixed_whole_and_in_order(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", BEHAVE, "--lines", "300"], launch_env(out))
    assert proc.returncode == 0, proc.stderr
    stdout = parse_console(proc.stdout, "out")
    stderr = parse_console(proc.stderr, "err")
    assert stdout == {0: list(range(300)), 1: list(range(300))}
    assert stderr == {0: list(range(0, 300, 2)), 1: list(range(0, 300, 2))}


def test_no_prefix(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", "--no-prefix", BEHAVE, "--lines", "50"], launch_env(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 100
    assert all(re.fullmatch(r"out ([01]) line (\d+) ?x*", ln) for ln in lines), lines[:5]


def test_log_dir_gets_one_unprefixed_file_per_rank_and_attempt(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    args = ["--nproc", "2", "--log-dir", str(logs), "--rdzv-id", "run1", "--max-restarts", "1",
            BEHAVE, "--lines", "20", "--exit", "1:2", "--exit-attempts", "1"]
    proc = run_launcher(args, launch_env(out))
    assert proc.returncode == 0, proc.stderr
    assert f"logs in {logs / 'run1'}" in proc.stderr
    for attempt in (0, 1):
        for rank in (0, 1):
            text = (logs / "run1" / f"attempt_{attempt}" / f"rank{rank}.log").read_text()
            got = text.splitlines()
            outs = [ln for ln in got if ln.startswith("out")]
            errs = [ln for ln in got if ln.startswith("err")]
            want_out = [f"out {rank} line {i} " + "x" * (i % 37) for i in range(20)]
            want_err = [f"err {rank} line {i}" for i in range(0, 20, 2)]
            if attempt == 0 and rank == 0:
                # Stopped when rank 1 failed, possibly before it printed everything: what it printed, in order.
                assert outs == want_out[: len(outs)] and errs == want_err[: len(errs)]
            else:
                assert (outs, errs) == (want_out, want_err)
            assert not any(ln.startswith("[rank") for ln in got)
    # The same id again: a new directory, the first run's logs stay.
    proc = run_launcher(["--nproc", "2", "--log-dir", str(logs), "--rdzv-id", "run1", BEHAVE], launch_env(out))
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in logs.iterdir()) == ["run1", "run1.1"]


def test_nothing_is_left_in_the_temp_dir(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ok = run_launcher(["--nproc", "2", BEHAVE, "--lines", "5"], launch_env(out, tmp))
    failed = run_launcher(["--nproc", "2", BEHAVE, "--exit", "0:9"], launch_env(out, tmp))
    assert ok.returncode == 0 and failed.returncode == 9
    assert list(tmp.iterdir()) == []


def test_progress_bars_render_live(tmp_path: Path) -> None:
    """A \\r fragment reaches the console at once, prefixed, while the rank is still waiting to finish the line."""
    out = tmp_path / "out"
    out.mkdir()
    env = launch_env(out, DDPBOOT_PROGRESS_INTERVAL="60")
    proc = start_launcher(["--nproc", "2", BEHAVE, "--progress", "0"], env, text=False)
    assert proc.stderr is not None
    fd = proc.stderr.fileno()
    seen = b""

    def shown() -> bool:
        nonlocal seen
        if select.select([fd], [], [], 0.05)[0]:
            seen += os.read(fd, 65536)
        return b"[rank0]: step 1/3" in seen

    wait_for(shown, 60, "the first progress fragment on the console (the rank has not ended its line)")
    (out / "go").touch()
    code, _, rest = finish(proc)
    assert code == 0
    # The job writes no key to the store, so the launcher's after-job note on rank isolation may follow.
    text = (seen + rest).split(b"ddpboot: warning: no rank joined")[0]
    # In a pipe: the first redraw at once, then (the interval not yet over) the last state when the bar ends.
    assert text.endswith(b"[rank0]: step 1/3\n[rank0]: step 3/3\n"), repr(text)


BARS = """import os, sys, time
from pathlib import Path
rank, sync = int(os.environ["RANK"]), Path(sys.argv[1])
for i in range(21):  # a tqdm-like bar (\\r + bar), the two ranks in lockstep so that their redraws interleave
    os.write(2, b"\\r%2d/20|%s" % (i, b"#" * i))
    (sync / f"{rank}.{i}").touch()
    deadline = time.monotonic() + 60
    while not (sync / f"{1 - rank}.{i}").exists() and time.monotonic() < deadline:
        time.sleep(0.002)
os.write(2, b"\\n")
print("done", flush=True)
"""


def _bars_job(tmp_path: Path, name: str) -> tuple[list[str], dict[str, str]]:
    out, sync = tmp_path / f"out-{name}", tmp_path / f"sync-{name}"
    out.mkdir()
    sync.mkdir()
    script = tmp_path / "bars.py"
    script.write_text(BARS)
    env = launch_env(out, DDPBOOT_PROGRESS_INTERVAL="60", TERM="xterm")
    return ["--nproc", "2", str(script), str(sync)], env


def _bar_lines(lines: list[str]) -> dict[int, list[str]]:
    seen: dict[int, list[str]] = {}
    for line in lines:
        if "/20|" in line:
            m = re.fullmatch(r"\[rank(\d)\]: (.*)", line)
            assert m, f"a bar line that is not one rank's whole line: {line!r}"
            seen.setdefault(int(m[1]), []).append(m[2])
    return seen


def test_progress_bars_of_two_ranks_in_a_pipe_and_on_a_terminal(tmp_path: Path) -> None:
    """2 ranks x 20 redraws: in a pipe, each rank's first state and its last (no line per redraw); on a terminal
    (a pty), one line per rank, left showing the final state."""
    args, env = _bars_job(tmp_path, "pipe")
    proc = run_launcher(args, env)
    assert proc.returncode == 0, proc.stderr
    first, last = " 0/20|", "20/20|" + "#" * 20
    assert _bar_lines(proc.stderr.splitlines()) == {0: [first, last], 1: [first, last]}, proc.stderr
    assert ranks_named(proc.stdout, "done") == [0, 1], proc.stdout  # once, or once per rank: never lost

    args, env = _bars_job(tmp_path, "tty")
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    term = subprocess.Popen([*ddpboot_exe(), *args], env=env, stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, start_new_session=True)
    os.close(slave)
    shown = b""

    def ended() -> bool:
        nonlocal shown
        try:
            while select.select([master], [], [], 0.05)[0]:
                shown += os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it
            return True
        return False

    wait_for(ended, 120, "the end of the launcher's output on its terminal")
    os.close(master)
    assert term.wait(10) == 0, shown
    screen = render_terminal(shown)
    assert _bar_lines(screen) == {0: [last], 1: [last]}, screen
    assert sorted(ranks_named("\n".join(screen), "done")) == [0, 1], screen


SAME_WARNING = """import os, sys, warnings
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()  # the four ranks warn at the same moment
warnings.warn("this option is deprecated", UserWarning)
sys.stderr.flush()
print(f"rank {rank} has its own line", flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def test_a_warning_every_rank_prints_is_shown_once_naming_the_ranks(tmp_path: Path) -> None:
    """4 gloo ranks warn alike at once: the console shows it once, `[rank0-3]: `; each rank's own line is shown once
    per rank; the log files keep every copy; with --no-collapse every rank's copy is shown."""
    script = tmp_path / "same_warning.py"
    script.write_text(SAME_WARNING)
    logs = tmp_path / "logs"
    warning = f"{script}:6: UserWarning: this option is deprecated"
    env = launch_env(tmp_path)
    proc = run_launcher(["--cpu", "--nproc", "4", "--log-dir", str(logs), "--rdzv-id", "r", str(script)], env)
    assert proc.returncode == 0, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if warning in ln] == [f"[rank0-3]: {warning}"], proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[rank{r}]: rank {r} has its own line" for r in range(4)]
    for r in range(4):
        kept = (logs / "r" / "attempt_0" / f"rank{r}.log").read_text().splitlines()
        assert warning in kept and f"rank {r} has its own line" in kept, kept

    plain = run_launcher(["--cpu", "--nproc", "4", "--no-collapse", str(script)], env)
    assert plain.returncode == 0, plain.stderr
    assert sorted(ln for ln in plain.stderr.splitlines() if warning in ln) == [
        f"[rank{r}]: {warning}" for r in range(4)], plain.stderr
    assert sorted(plain.stdout.splitlines()) == [f"[rank{r}]: rank {r} has its own line" for r in range(4)]
    by_variable = run_launcher(["--cpu", "--nproc", "4", str(script)], {**env, "DDPBOOT_NO_COLLAPSE": "1"})
    assert by_variable.returncode == 0, by_variable.stderr
    assert sum(warning in ln for ln in by_variable.stderr.splitlines()) == 4, by_variable.stderr


def test_collapse_names_only_the_ranks_the_console_shows(tmp_path: Path) -> None:
    """--local-ranks-filter 1,2: the warning of ranks 1 and 2 once, `[rank1-2]: `; -t 2 (stderr teed: on the console
    and in the files): each rank's file keeps its copy, the console shows it once."""
    script = tmp_path / "same_warning.py"
    script.write_text(SAME_WARNING)
    warning = f"{script}:6: UserWarning: this option is deprecated"
    logs = tmp_path / "logs"
    args = ["--cpu", "--nproc", "4", "--local-ranks-filter", "1,2", "--log-dir", str(logs), "--rdzv-id", "r",
            "-t", "2", str(script)]
    proc = run_launcher(args, launch_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if warning in ln] == [f"[rank1-2]: {warning}"], proc.stderr
    assert sorted(proc.stdout.splitlines()) == [f"[rank{r}]: rank {r} has its own line" for r in (1, 2)]
    for r in range(4):  # every rank's file, shown on the console or not; stderr only (-t 2)
        kept = (logs / "r" / "attempt_0" / f"rank{r}.log").read_text().splitlines()
        assert warning in kept and f"rank {r} has its own line" not in kept, kept


def test_redirects_and_tee_maps_work_for_rank_10(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    args = ["--cpu", "--nproc", "11", "--log-dir", str(logs), "--rdzv-id", "r", "-r", "0:1,10:2",
            BEHAVE, "--lines", "2"]
    proc = run_launcher(args, launch_env(out))
    assert proc.returncode == 0, proc.stderr
    console_out, console_err = proc.stdout, proc.stderr
    assert "[rank0]: out" not in console_out and "[rank0]: err" in console_err
    assert "[rank10]: err" not in console_err and "[rank10]: out" in console_out
    assert "[rank5]: out" in console_out and "[rank5]: err" in console_err
    attempt = logs / "r" / "attempt_0"
    assert (attempt / "rank0.log").read_text().startswith("out 0 line 0")
    assert "err" not in (attempt / "rank0.log").read_text()
    assert (attempt / "rank10.log").read_text() == "err 10 line 0\n"
    assert not (attempt / "rank5.log").exists()

    logs2 = tmp_path / "logs2"
    args = ["--cpu", "--nproc", "11", "--log-dir", str(logs2), "--rdzv-id", "r", "-t", "3",
            "--local-ranks-filter", "10", BEHAVE, "--lines", "2"]
    proc = run_launcher(args, launch_env(out))
    assert proc.returncode == 0, proc.stderr
    ranks_shown = {int(m) for m in re.findall(r"^\[rank(\d+)\]", proc.stdout + proc.stderr, re.M)}
    assert ranks_shown == {10}
    assert len(list((logs2 / "r" / "attempt_0").glob("rank*.log"))) == 11


def test_ranks_filter_by_global_rank(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", "--ranks-filter", "1", BEHAVE, "--lines", "3"], launch_env(out))
    assert proc.returncode == 0, proc.stderr
    assert {int(m) for m in re.findall(r"^\[rank(\d+)\]", proc.stdout + proc.stderr, re.M)} == {1}


def test_a_crashing_ranks_output_is_never_lost(tmp_path: Path) -> None:
    """Rank 1 writes 300 kB (more than a pipe holds) and dies of SIGKILL: every byte reaches console and file."""
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    args = ["--nproc", "2", "--log-dir", str(logs), "--rdzv-id", "c", BEHAVE, "--burst", "1:300000", "--hold", "0"]
    proc = start_launcher(args, launch_env(out))
    code, stdout, err = finish(proc)
    assert code == 128 + signal.SIGKILL, err
    lines = [ln for ln in stdout.splitlines() if ln.startswith("[rank1]: burst")]
    n = len(lines)
    assert n > 300000 // 20
    assert lines == [f"[rank1]: burst 1 {i:07d}" for i in range(n)]
    file_lines = (logs / "c" / "attempt_0" / "rank1.log").read_text().splitlines()
    assert file_lines == [f"burst 1 {i:07d}" for i in range(n)]
    assert "rank 1 failed: killed by SIGKILL" in err


def test_failure_summary_shows_the_recorded_traceback(tmp_path: Path) -> None:
    """A rank that used torch's @record leaves its traceback in TORCHELASTIC_ERROR_FILE (torch's JSON format);
    the summary shows it. (This worker writes the file by hand, to stay free of torch imports.)"""
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "recorded.py"
    script.write_text(
        "import json, os, sys\n"
        "if os.environ['RANK'] == '1':\n"
        "    data = {'message': {'message': 'ValueError: bad batch', 'extraInfo': {'py_callstack': "
        "'Traceback (most recent call last):\\n  File \"train.py\", line 7\\nValueError: bad batch\\n', "
        "'timestamp': '0'}}}\n"
        "    open(os.environ['TORCHELASTIC_ERROR_FILE'], 'w').write(json.dumps(data))\n"
        "    sys.exit(1)\n"
    )
    proc = run_launcher(["--nproc", "2", str(script)], launch_env(out))
    assert proc.returncode == 1
    assert "traceback (recorded by @record" in proc.stderr
    assert "  | ValueError: bad batch" in proc.stderr


def test_summary_falls_back_to_the_last_lines_of_stderr(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = tmp_path / "boom.py"
    script.write_text("import os\nif os.environ['RANK'] == '0':\n    raise KeyError('missing-column')\n")
    proc = run_launcher(["--nproc", "2", str(script)], launch_env(out))
    assert proc.returncode == 1
    assert "last lines of its stderr:" in proc.stderr
    assert "  | KeyError: 'missing-column'" in proc.stderr


# --- disks that fill -----------------------------------------------------------------------------------


@pytest.fixture
def mount_tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount a real small filesystem (tmpfs with these options) for the test; unmounted after it."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the test mounts a small tmpfs")
    mounted: list[Path] = []

    def mount(options: str) -> Path:
        disk = tmp_path / f"disk{len(mounted)}"
        disk.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"{options},mode=0755", "tmpfs", str(disk)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(disk)
        return disk

    yield mount
    for disk in mounted:
        subprocess.run(["umount", "-l", str(disk)], check=True)


@pytest.fixture
def small_disk(mount_tmpfs: Callable[[str], Path]) -> Path:
    """256 KiB: room for a few thousand lines."""
    return mount_tmpfs("size=256k")


def fill(disk: Path) -> None:
    with open(disk / "filler", "wb", buffering=0) as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 4096)


def test_a_log_dir_on_a_full_disk_is_refused_before_anything_is_made(small_disk: Path, tmp_path: Path) -> None:
    fill(small_disk)
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", "--log-dir", str(small_disk / "logs"), BEHAVE], launch_env(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"ddpboot: error: --log-dir {small_disk / 'logs'}: its disk is full"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and sorted(p.name for p in small_disk.iterdir()) == ["filler"]
    assert not list(out.glob("rank*.json")), "a rank started"


def test_a_log_dir_that_cannot_take_the_plan_is_refused_and_its_run_directory_removed(
        mount_tmpfs: Callable[[str], Path], tmp_path: Path) -> None:
    """Room left, but no inode for a file after the run's directory (nr_inodes: the root and one more)."""
    disk = mount_tmpfs("size=256k,nr_inodes=2")
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", "--log-dir", str(disk), BEHAVE], launch_env(out))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("ddpboot: error: cannot write ")
    assert "plan.json: No space left on device" in proc.stderr
    assert not list(disk.iterdir()) and not list(out.glob("rank*.json"))


def test_a_log_disk_that_fills_during_the_run_is_said_once_and_the_console_keeps_every_line(
        small_disk: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    proc = run_launcher(["--nproc", "2", "--log-dir", str(small_disk), BEHAVE, "--lines", "8000"], launch_env(out))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("ddpboot: cannot ")]
    assert len(said) == 1 and said[0].startswith("ddpboot: cannot write the log file "), said
    assert "No space left on device" in said[0]
    assert parse_console(proc.stdout, "out") == {0: list(range(8000)), 1: list(range(8000))}
    assert sum(p.stat().st_size for p in small_disk.rglob("rank*.log")) < 8000 * 2 * 20  # the files did miss lines


def test_stdout_on_a_full_disk_is_said_once_and_the_job_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with open("/dev/full", "w") as full:
        proc = subprocess.run([*ddpboot_exe(), "--nproc", "2", BEHAVE, "--lines", "300"], env=launch_env(out),
                              stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    said = [line for line in proc.stderr.splitlines() if line.startswith("ddpboot: cannot ")]
    assert len(said) == 1 and said[0].startswith("ddpboot: cannot write the job's stdout: No space left on device")
    assert parse_console(proc.stderr, "err") == {0: list(range(0, 300, 2)), 1: list(range(0, 300, 2))}
