"""The output splitter (console lines whole and prefixed, progress bars live, files unchanged), the error file,
the run directory."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.logs import Console, LogFile, LogMode, RankStream, parse_log_mode, read_error_file, run_dir
from ddpboot.launch.options import Std


class Capture:
    """A Console whose stdout/stderr are pipes we can read back."""

    def __init__(self) -> None:
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.console = Console(out_w, err_w)
        self.w = (out_w, err_w)

    def read(self) -> tuple[bytes, bytes]:
        for fd in self.w:
            os.close(fd)
        got = []
        for fd in (self.out_r, self.err_r):
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            os.close(fd)
            got.append(b"".join(chunks))
        return got[0], got[1]


def test_two_ranks_never_share_a_console_line() -> None:
    cap = Capture()
    a = RankStream(0, Std.OUT, cap.console, None)
    b = RankStream(1, Std.OUT, cap.console, None)
    a.feed(b"hel")
    b.feed(b"wor")
    a.feed(b"lo\nsecond")
    b.feed(b"ld\n")
    a.close()
    b.close()
    out, _ = cap.read()
    assert out == b"[rank0]: hello\n[rank1]: world\n[rank0]: second\n"


def test_progress_redraws_are_live_and_keep_their_prefix() -> None:
    cap = Capture()
    bar = RankStream(0, Std.ERR, cap.console, None)
    other = RankStream(1, Std.OUT, cap.console, None)
    bar.feed(b"\r 10%|#")  # tqdm: \r + bar, no terminator
    bar.feed(b"\r 20%|##")
    other.feed(b"note\n")  # ends the bar's line first
    bar.feed(b"\r100%|###\n")
    bar.close()
    other.close()
    out, err = cap.read()
    assert err == b"[rank0]:  10%|#\r[rank0]:  20%|##\n[rank0]: 100%|###\n"
    assert out == b"[rank1]: note\n"
    assert bar.last_lines(5) == ["100%|###"]  # one line of the rank's own, shown as its last redraw


def test_files_get_the_bytes_unchanged(tmp_path: Path) -> None:
    log = LogFile(tmp_path / "rank0.log")
    cap = Capture()
    out = RankStream(0, Std.OUT, cap.console, log, prefix=False)
    err = RankStream(0, Std.ERR, None, log)
    out.feed(b"a\r\nb")
    err.feed(b"E1\n")
    out.feed(b"c\n\xff partial")
    out.close()
    err.close()
    log.close()
    assert (tmp_path / "rank0.log").read_bytes() == b"a\r\nE1\nbc\n\xff partial"
    console_out, console_err = cap.read()
    assert console_out == b"a\r\nbc\n\xff partial\n" and console_err == b""




def test_launcher_messages_end_an_open_rank_line() -> None:
    cap = Capture()
    s = RankStream(2, Std.ERR, cap.console, None)
    s.feed(b"half")  # text without a terminator waits for one
    s.feed(b"\r 10%")  # a progress redraw is shown at once and leaves the line open
    cap.console.message("ddpboot: note")
    s.close()
    _, err = cap.read()
    assert err == b"[rank2]: half\r[rank2]:  10%\nddpboot: note\n"


def test_the_recorded_traceback_is_read_from_the_error_file(tmp_path: Path) -> None:
    path = tmp_path / "rank0.error.json"
    assert read_error_file(path) is None
    path.write_text(json.dumps({"message": {"message": "boom", "extraInfo": {"py_callstack": "Traceback...\n"}}}))
    assert read_error_file(path) == "Traceback..."
    path.write_text(json.dumps({"message": {"message": "only the message"}}))
    assert read_error_file(path) == "only the message"
    path.write_text("not json")
    assert read_error_file(path) is None


def test_run_dirs_are_never_reused(tmp_path: Path) -> None:
    first = run_dir(tmp_path / "logs", "job")
    second = run_dir(tmp_path / "logs", "job")
    assert first.name == "job" and second.name == "job.1" and first.is_dir() and second.is_dir()


def test_an_unwritable_log_dir_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="cannot create it"):
        run_dir(blocker / "logs", "job")


def test_a_private_run_dir_is_the_owners_only_and_its_base_keeps_its_mode(tmp_path: Path) -> None:
    base = tmp_path / "team-logs"
    base.mkdir(mode=0o775)
    os.chmod(base, 0o775)
    path = run_dir(base, "job")
    assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert stat.S_IMODE(base.stat().st_mode) == 0o775
    attempt = path / "attempt_0"
    LogMode.PRIVATE.make_dir(attempt, exist_ok=True)
    LogMode.PRIVATE.make_dir(attempt, exist_ok=True)  # the next attempt of an elastic round may find it
    assert stat.S_IMODE(attempt.stat().st_mode) == 0o700
    log = LogFile(attempt / "rank0.log")
    log.close()
    assert stat.S_IMODE((attempt / "rank0.log").stat().st_mode) == 0o600


def test_a_shared_run_dir_follows_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        path = run_dir(tmp_path / "logs", "job", LogMode.SHARED)
        log = LogFile(path / "rank0.log", LogMode.SHARED)
        log.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o755
    assert stat.S_IMODE((path / "rank0.log").stat().st_mode) == 0o644


def test_log_modes_are_parsed_by_name() -> None:
    assert parse_log_mode(" Shared ") is LogMode.SHARED and parse_log_mode("private") is LogMode.PRIVATE
    with pytest.raises(UsageError, match="--log-mode 'public': choose private"):
        parse_log_mode("public")
