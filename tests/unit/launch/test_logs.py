"""The output splitter (console lines whole and prefixed, progress bars live, files unchanged), the error file,
the run directory."""

from __future__ import annotations

import json
import os
import select
import tty
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch import logs
from ddpboot.launch.logs import Console, LogFile, RankStream, read_error_file
from ddpboot.launch.spec import LinePrefix, LogMode, Routing, Std
from tests.support import render_terminal


class Clock:
    """A fake clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Capture:
    """A Console whose stdout/stderr are pipes we can read back."""

    def __init__(self, clock: Clock | None = None, interval: str = "5") -> None:
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        self.console = Console(out_w, err_w, clock or Clock(), {"DDPBOOT_PROGRESS_INTERVAL": interval})
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


def test_bars_in_a_log_are_throttled_and_their_last_state_kept() -> None:
    """2 ranks x 20 tqdm-like redraws 0.9 s apart, 5 s apart at most in a log: the first at once, then one per
    interval, and the final state when the bar's line ends."""
    clock = Clock()
    cap = Capture(clock)
    ranks = [RankStream(r, Std.ERR, cap.console, None) for r in (0, 1)]
    for i in range(21):
        for s in ranks:
            s.feed(b"\r%2d/20|%s" % (i, b"#" * i))  # tqdm: \r + bar, no terminator
        clock.now += 0.9
    for s in ranks:
        s.feed(b"\n")
        s.close()
    _, err = cap.read()
    want = [b"[rank%d]: %2d/20|%s\n" % (r, i, b"#" * i) for i in (0, 6, 12, 18, 20) for r in (0, 1)]
    assert err == b"".join(want)


def test_a_bars_last_state_is_shown_before_other_output_of_its_rank_and_at_the_end() -> None:
    clock = Clock()
    cap = Capture(clock)
    bar, out, other = (RankStream(0, Std.ERR, cap.console, None), RankStream(0, Std.OUT, cap.console, None),
                       RankStream(1, Std.ERR, cap.console, None))
    bar.feed(b"\r1/9")
    other.feed(b"\r5/9")
    clock.now = 1
    bar.feed(b"\r2/9")  # too soon: held back
    other.feed(b"\r6/9  ")  # tqdm pads a redraw with spaces over a longer one: not in the log
    out.feed(b"epoch done\n")  # rank 0 speaks: its bar's state first
    other.feed(b"\r     \r")  # tqdm.write clears the bar before its message: its state first
    other.feed(b"saved\n")
    bar.feed(b"\r3/9")  # held back again, then the stream ends (the rank exited)
    bar.close()
    other.close()
    out.close()
    stdout, err = cap.read()
    assert stdout == b"[rank0]: epoch done\n"
    assert err == b"[rank0]: 1/9\n[rank1]: 5/9\n[rank0]: 2/9\n[rank1]: 6/9\n[rank1]: saved\n[rank0]: 3/9\n"


def test_a_quiet_bars_held_back_state_is_shown_when_its_interval_is_over() -> None:
    """A bar that stops redrawing (a long evaluation after step 2) does not leave a stale state in the log: the
    supervisor's loop waits at most until the interval is over (`wait_time`), then shows it (`show_due`)."""
    clock = Clock()
    cap = Capture(clock)
    bar = RankStream(0, Std.ERR, cap.console, None)
    bar.feed(b"\r1/9")
    assert cap.console.wait_time(None) is None  # nothing held back: the loop may wait for ever
    clock.now = 1
    bar.feed(b"\r2/9")
    assert cap.console.wait_time(None) == 4 and cap.console.wait_time(2.5) == 2.5
    clock.now = 4.5
    cap.console.show_due()  # too soon
    clock.now = 5
    cap.console.show_due()
    assert cap.console.wait_time(None) is None
    bar.close()
    assert cap.read()[1] == b"[rank0]: 1/9\n[rank0]: 2/9\n"


class Terminal:
    """A Console whose stdout and stderr are one pseudo-terminal (raw: the bytes arrive as written)."""

    def __init__(self, term: str = "xterm") -> None:
        self.master, self.slave = os.openpty()
        tty.setraw(self.slave)
        self.console = Console(self.slave, self.slave, Clock(), {"TERM": term})
        self.seen = b""

    def take(self) -> bytes:
        """What was written since the last take."""
        got = b""
        while select.select([self.master], [], [], 0.05)[0]:
            got += os.read(self.master, 65536)
        self.seen += got
        return got

    def screen(self) -> list[str]:
        self.take()
        return render_terminal(self.seen)


def test_on_a_terminal_each_ranks_bar_is_one_line_redrawn_in_place() -> None:
    term = Terminal()
    ranks = [RankStream(r, Std.ERR, term.console, None) for r in (0, 1)]
    out1 = RankStream(1, Std.OUT, term.console, None)
    for s in ranks:
        s.feed(b"\r 0/20")
    assert term.take() == b"[rank0]:  0/20\n[rank1]:  0/20\n"  # a region of two lines, the cursor below
    ranks[0].feed(b"\r 1/20")  # rank 0's line, in place: up 2, rewrite, erase the rest, back down
    assert term.take() == b"\x1b[2A\r[rank0]:  1/20\x1b[K\x1b[2B\r"
    for i in range(2, 21):
        for s in ranks:
            s.feed(b"\r%2d/20" % i)
        if i == 10:
            out1.feed(b"hello\n")  # ordinary output goes above the bars
            assert term.screen() == ["[rank1]: hello", "[rank0]: 10/20", "[rank1]: 10/20"]
    ranks[0].feed(b"\n")  # rank 0's bar ends: an ordinary line now, rank 1's bar stays below
    assert term.screen() == ["[rank1]: hello", "[rank0]: 20/20", "[rank1]: 20/20"]
    ranks[1].feed(b"\r" + b" " * 6 + b"\r")  # cleared (leave=False): gone from the screen
    assert term.screen() == ["[rank1]: hello", "[rank0]: 20/20"]
    term.console.message("ddpboot: done")
    assert term.screen() == ["[rank1]: hello", "[rank0]: 20/20", "ddpboot: done"]


def test_a_dumb_terminal_gets_what_a_log_gets() -> None:
    term = Terminal("dumb")
    s = RankStream(0, Std.ERR, term.console, None)
    s.feed(b"\r1/3")
    s.feed(b"\r2/3")
    s.feed(b"\r3/3\n")
    assert term.take() == b"[rank0]: 1/3\n[rank0]: 3/3\n"


def test_a_bad_progress_interval_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="DDPBOOT_PROGRESS_INTERVAL='soon': give the seconds"):
        Console(environ={"DDPBOOT_PROGRESS_INTERVAL": "soon"})
    cap = Capture(interval="0")  # 0: every redraw
    s = RankStream(0, Std.OUT, cap.console, None, prefix=False)
    s.feed(b"\ra\rb\rc\n")
    s.close()
    assert cap.read()[0] == b"a\nb\nc\n"


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
    assert console_out == b"a\nbc\n\xff partial\n" and console_err == b""  # the \r of \r\n: no second line




def test_a_full_disk_under_stdout_is_said_once_on_stderr_and_the_job_goes_on() -> None:
    """`ddpboot ... > /dev/full`: the console's stdout fails with ENOSPC (a real /dev/full); one line on stderr,
    stdout dropped from then on, stderr still shown. A reader that left (`| head`) is dropped without a word."""
    full = os.open("/dev/full", os.O_WRONLY)
    err_r, err_w = os.pipe()
    console = Console(full, err_w, Clock(), {})
    out = RankStream(0, Std.OUT, console, None)
    err = RankStream(0, Std.ERR, console, None)
    for _ in range(3):
        out.feed(b"a line\n")
    err.feed(b"still shown\n")
    os.close(full)
    os.close(err_w)
    said = os.read(err_r, 65536).decode()
    os.close(err_r)
    lines = said.splitlines()
    assert lines[0].startswith("ddpboot: cannot write the job's stdout: No space left on device (the disk is full). "
                               "The job goes on") and lines[1:] == ["[rank0]: still shown"], said
    gone_r, gone_w = os.pipe()
    os.close(gone_r)
    cap = Capture()
    quiet = Console(gone_w, cap.w[1], Clock(), {})
    quiet.message("to nobody", Std.OUT)
    os.close(gone_w)
    assert cap.read() == (b"", b"")


def test_a_log_file_that_cannot_be_written_is_said_once_and_the_console_keeps_every_line() -> None:
    cap = Capture()
    log = LogFile(Path("/dev/full"), trouble=cap.console.log_trouble)  # every write: ENOSPC
    streams = [RankStream(r, Std.OUT, cap.console, log) for r in (0, 1)]
    for n in range(5):
        for s in streams:
            s.feed(f"line {n}\n".encode())
    log.close()
    out, err = cap.read()
    assert out.decode().splitlines() == [f"[rank{r}]: line {n}" for n in range(5) for r in (0, 1)]
    assert err.decode().count("ddpboot: cannot write the log file /dev/full: No space left on device") == 1, err
    assert LogFile(Path("/nonexistent/rank0.log"), trouble=cap.console.log_trouble).fd == -1  # not made: said


def test_launcher_messages_end_an_open_rank_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "MAX_PENDING", 8)
    cap = Capture()
    s = RankStream(2, Std.ERR, cap.console, None)
    s.feed(b"x" * 8)  # a very long line is shown in parts, leaving the console line open
    cap.console.message("ddpboot: note")
    s.feed(b"y\n")
    s.close()
    _, err = cap.read()
    assert err == b"[rank2]: xxxxxxxx\nddpboot: note\n[rank2]: y\n"


def test_the_recorded_traceback_is_read_from_the_error_file(tmp_path: Path) -> None:
    path = tmp_path / "rank0.error.json"
    assert read_error_file(path) is None
    path.write_text(json.dumps({"message": {"message": "boom", "extraInfo": {"py_callstack": "Traceback...\n"}}}))
    assert read_error_file(path) == "Traceback..."
    path.write_text(json.dumps({"message": {"message": "only the message"}}))
    assert read_error_file(path) == "only the message"
    path.write_text("not json")
    assert read_error_file(path) is None


def test_log_modes_are_parsed_by_name() -> None:
    assert LogMode.parse(" Shared ", "--log-mode") is LogMode.SHARED
    assert LogMode.parse("private", "--log-mode") is LogMode.PRIVATE
    with pytest.raises(UsageError, match=r"^--log-mode 'public': choose private \(the run's logs readable by you only, "
                       r"the default\) or shared \(readable as your umask allows\)\.$"):
        LogMode.parse("public", "--log-mode")


def test_a_line_that_carries_its_ranks_prefix_already_gets_one_prefix() -> None:
    """torch.distributed's excepthook writes `[rank0]: ` before every traceback line; ddpboot's prefix replaces it."""
    cap = Capture()
    s = RankStream(0, Std.ERR, cap.console, None)
    other = RankStream(1, Std.ERR, cap.console, None, prefix=b"host:1| ")
    s.feed(b"[rank0]: Traceback (most recent call last):\n[rank0]:   File \"x.py\", line 5\n")
    other.feed(b"[rank1]: RuntimeError: boom\n[rank0]: from rank 0 says rank 1\n")
    s.feed(b"[rank00]: not the prefix\n")
    s.close()
    other.close()
    _, err = cap.read()
    assert err.decode().splitlines() == [
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "x.py", line 5',
        "host:1| RuntimeError: boom",  # a template's prefix replaces torch's too
        "host:1| [rank0]: from rank 0 says rank 1",  # another rank's prefix is text
        "[rank0]: [rank00]: not the prefix",
    ]


def test_without_a_prefix_the_ranks_own_prefix_stays(tmp_path: Path) -> None:
    log = LogFile(tmp_path / "rank0.log")
    cap = Capture()
    s = RankStream(0, Std.ERR, cap.console, log, prefix=False)
    s.feed(b"[rank0]: Traceback\n")
    s.close()
    log.close()
    assert cap.read()[1] == b"[rank0]: Traceback\n"
    assert (tmp_path / "rank0.log").read_bytes() == b"[rank0]: Traceback\n"  # files: the bytes unchanged


def test_the_line_prefix_template_fills_every_field() -> None:
    prefix = LinePrefix("${hostname} n${node_rank} ${role_name}${local_rank} r$rank $$ ", "trainer", "gpu07")
    assert prefix.render(13, 5, 1) == b"gpu07 n1 trainer5 r13 $ "
    assert Routing(prefix=prefix).line_prefix(2, 2, 0) == b"gpu07 n0 trainer2 r2 $ "
    assert Routing().line_prefix(9, 1, 1) == b"[rank9]: " and Routing(prefix=None).line_prefix(9, 1, 1) == b""


# --- lines several ranks say alike, shown once (collapse.py's rule, the Console's side) -------------------------


def collapsing(cap: Capture, n: int, std: Std = Std.ERR, prefix: LinePrefix | None = None,
               file: LogFile | None = None) -> list[RankStream]:
    line = prefix or LinePrefix()
    return [RankStream(r, std, cap.console, file, prefix=line.render(r, r, 0), group=line, slot=(r, 0))
            for r in range(n)]


def ended(cap: Capture, ranks: list[RankStream]) -> tuple[bytes, bytes]:
    """The console's stdout and stderr once every rank's stream has ended."""
    for s in ranks:
        s.close()
    return cap.read()


def test_a_line_every_rank_says_is_shown_once_naming_the_ranks() -> None:
    cap = Capture()
    ranks = collapsing(cap, 4)
    for s in ranks:
        s.feed(b"UserWarning: deprecated\n")
    for r, s in enumerate(ranks):
        s.feed(b"rank %d done\n" % r)
    _, err = ended(cap, ranks)
    assert err == (b"[rank0-3]: UserWarning: deprecated\n"
                   + b"".join(b"[rank%d]: rank %d done\n" % (r, r) for r in range(4)))


def test_a_held_line_waits_for_its_window_then_is_shown() -> None:
    clock = Clock()
    cap = Capture(clock)
    ranks = collapsing(cap, 3)
    ranks[0].feed(b"W\n")
    ranks[2].feed(b"W\n")
    assert cap.console.wait_time(None) == pytest.approx(0.2) and cap.console.wait_time(0.05) == 0.05
    clock.now = 0.1
    cap.console.show_due()
    ranks[1].feed(b"W\n")  # within the window: joins
    clock.now = 0.2
    cap.console.show_due()
    assert cap.console.wait_time(None) is None
    ranks[1].feed(b"W\n")  # a new window
    clock.now = 0.5
    cap.console.show_due()
    _, err = ended(cap, ranks)
    assert err == b"[rank0-2]: W\n[rank1]: W\n"


def test_the_template_names_the_ranks_in_each_field() -> None:
    cap = Capture()
    line = LinePrefix("${hostname}:${node_rank}:${local_rank}/${rank} ${role_name}| ", "trainer", "node7")
    ranks = [RankStream(r + 4, Std.OUT, cap.console, None, prefix=line.render(r + 4, r, 1), group=line,
                        slot=(r, 1)) for r in range(3)]
    for s in (ranks[2], ranks[0]):
        s.feed(b"same\n")
    ranks[1].feed(b"other\n")
    out, _ = ended(cap, ranks)
    assert out == b"node7:1:0,2/4,6 trainer| same\nnode7:1:1/5 trainer| other\n"


def test_what_a_rank_holds_is_shown_before_its_other_output_and_the_launchers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs, "MAX_PENDING", 8)
    cap = Capture()
    a, b, c = collapsing(cap, 3)
    a.feed(b"held\n")
    a.feed(b"p" * logs.MAX_PENDING)  # a part of a long line, left open: what rank 0 holds goes first
    b.feed(b"mine\n")
    cap.console.message("ddpboot: a note")  # the launcher's own line: everything held goes first
    c.feed(b"\r1/9")  # a bar is never held
    _, err = ended(cap, [a, b, c])
    long = b"p" * 8
    assert err == b"[rank0]: held\n[rank0]: " + long + b"\n[rank1]: mine\nddpboot: a note\n[rank2]: 1/9\n"


def test_a_bars_redraw_shows_what_its_rank_holds_first() -> None:
    cap = Capture()
    a, b = collapsing(cap, 2)
    a.feed(b"starting\n")
    a.feed(b"\r1/9")
    b.feed(b"starting\n")
    a.feed(b"\n")
    _, err = ended(cap, [a, b])
    assert err == b"[rank0]: starting\n[rank0]: 1/9\n[rank1]: starting\n"


def test_files_get_every_ranks_copy(tmp_path: Path) -> None:
    cap = Capture()
    files = [LogFile(tmp_path / f"rank{r}.log") for r in range(2)]
    ranks = [RankStream(r, Std.OUT, cap.console, files[r], group=LinePrefix(), slot=(r, 0)) for r in range(2)]
    for s in ranks:
        s.feed(b"same\n")
        s.close()
    out, _ = cap.read()
    assert out == b"[rank0-1]: same\n"
    assert [(tmp_path / f"rank{r}.log").read_bytes() for r in range(2)] == [b"same\n", b"same\n"]


def test_without_a_group_prefix_every_copy_is_shown() -> None:
    cap = Capture()
    ranks = [RankStream(r, Std.OUT, cap.console, None) for r in range(2)]
    for s in ranks:
        s.feed(b"same\n")
    out, _ = ended(cap, ranks)
    assert out == b"[rank0]: same\n[rank1]: same\n"


def test_torchs_own_prefix_is_collapsed_like_the_rest() -> None:
    cap = Capture()
    ranks = collapsing(cap, 2)
    for r, s in enumerate(ranks):
        s.feed(b"[rank%d]: Traceback (most recent call last):\n" % r)
    _, err = ended(cap, ranks)
    assert err == b"[rank0-1]: Traceback (most recent call last):\n"


def test_routing_collapses_only_with_a_prefix_and_not_under_no_collapse() -> None:
    assert Routing().group_prefix() == LinePrefix()
    assert Routing(collapse=False).group_prefix() is None
    assert Routing(prefix=None).group_prefix() is None
