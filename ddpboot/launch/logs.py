"""Worker output: pumped from pipes to the console (prefixed by rank) and to per-rank files, piece by piece.

A piece is a run of bytes ending in `\\n` or `\\r`. Pieces are written whole, so two ranks never share a console
line: when another rank (or the launcher) writes while a rank's line is still open, the open line is ended first.
A line drawn with `\\r` is a progress bar (tqdm writes `\\r` + bar and no terminator; others write bar + `\\r`): each
redraw goes to the Console at once, not waiting for a newline, and the Console draws it in place on a terminal or
throttles it in a pipe or file (bars.py); the newline that ends the bar leaves its final state as an ordinary line.
Other text without a terminator waits for one (or for the end of the stream) so that it is not split across lines.

Each console line begins with its rank's prefix (`[rankG]: `, or what `--log-line-prefix-template` makes of it,
spec.LinePrefix), once: a line that already begins with the rank's `[rankG]: ` (torch.distributed's excepthook
prefixes every traceback line so) has that replaced by the prefix, not doubled.

Files get the rank's bytes unchanged (no prefix), stdout and stderr in arrival order, whole pieces at a time; they
are written unbuffered, so what a worker printed before dying is on disk even if the launcher is killed next.

Who may read them (LogMode, `--log-mode`): by default only the job's owner. On a machine several people log into,
a rank's output, its @record traceback and its exit mark can show data paths, hyperparameters or secrets. The run
directory (--log-dir BASE/RUN_ID) and every attempt_N directory are made 0700 and the launcher's log files 0600;
the files the ranks themselves write there (TORCHELASTIC_ERROR_FILE through torch's @record, and the exit mark
beside it) get the ranks' umask, and the 0700 directories above them are what keeps other users out. BASE itself
keeps its mode: it may be a directory the user shares on purpose (a team's log directory).

Without --log-dir, -r/-t still write files, as torchrun's do (it writes them under a fresh `torchelastic_*` temporary
directory and leaves it behind, unnamed): BASE is then the user's own `$TMPDIR/ddpboot-logs-UID` (temporary_log_base),
kept after the run and named on the console like any run directory. It is made 0700 and must stay the user's and
writable by no one else: a directory of that name that another user made first is refused, not written into.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ddpboot.errors import UsageError
from ddpboot.launch.bars import LiveRegion, Throttle, blank, progress_interval, terminal_of
from ddpboot.launch.spec import LogMode, Std

MAX_PENDING = 64 * 1024  # a longer run without a terminator is shown in parts
TAIL_BYTES = 32 * 1024


def write_all(fd: int, data: bytes) -> bool:
    """Write everything (a console may take partial writes); False when the reader has gone (EPIPE)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except BlockingIOError:
            import select

            select.select([], [fd], [], 1.0)
            continue
        except OSError as exc:
            if exc.errno in (errno.EPIPE, errno.EBADF, errno.EIO):
                return False
            raise
        view = view[n:]
    return True


class Console:
    """The launcher's stdout and stderr, shared by every rank and by the launcher's own messages; progress bars
    drawn in place on a terminal and throttled in a pipe or file (bars.py)."""

    def __init__(self, out_fd: int = 1, err_fd: int = 2, clock: Callable[[], float] = time.monotonic,
                 environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.fds = {Std.OUT: out_fd, Std.ERR: err_fd}
        self.open: RankStream | None = None  # whose line is open (the cursor is not at a fresh line)
        self.gone: set[int] = set()
        self.throttle = Throttle(progress_interval(environ), clock)
        # The bars' region lives on stderr's terminal (or stdout's); a stream writing to that terminal is live.
        terms = {std: terminal_of(fd, environ) for std, fd in self.fds.items()}
        term = terms[Std.ERR] if terms[Std.ERR] is not None else terms[Std.OUT]
        self.live = {std: term is not None and terms[std] == term for std in self.fds}
        self.region_fd = err_fd if self.live[Std.ERR] else out_fd
        self.region = LiveRegion(self._width)

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.region_fd).columns or 80
        except OSError:
            return 80

    def _raw(self, fd: int, data: bytes) -> None:
        if fd in self.gone or not data:
            return
        if not write_all(fd, data):
            self.gone.add(fd)  # `ddpboot ... | head`: keep running, keep the files, drop the console

    def _out(self, std: Std, data: bytes, leaves_open: bool = False) -> None:
        """Ordinary output: on the bars' terminal it goes above their region."""
        if self.live[std]:
            data = self.region.erase() + data + (b"" if leaves_open else self.region.draw())
        self._raw(self.fds[std], data)

    def end_open_line(self) -> None:
        if self.open is not None:
            self._out(self.open.stream, b"\n")
            self.open.line_ended_elsewhere()
            self.open = None

    def write(self, owner: RankStream, data: bytes, leaves_open: bool) -> None:
        """Ordinary output of a rank; the last state of its bars in a log is shown first."""
        if self.open is not None and self.open is not owner:
            self.end_open_line()
        for bar in [key for key in self.throttle.bars if isinstance(key, RankStream) and key.rank == owner.rank]:
            self._lines(bar, self.throttle.flush(bar))
        self._out(owner.stream, data, leaves_open)
        self.open = owner if leaves_open else None

    def redraw(self, owner: RankStream, text: bytes) -> None:
        """A progress-bar redraw of `owner`: its line in place on a terminal, throttled lines in a log."""
        self.end_open_line()
        if not self.live[owner.stream]:
            self._lines(owner, self.throttle.redraw(owner, text))
        elif blank(text):
            self._raw(self.region_fd, self.region.remove(owner) + self.region.draw())
        else:
            self._raw(self.region_fd, self.region.update(owner, owner.prefix + text.rstrip(b" ")))

    def end_bar(self, owner: RankStream, final: bytes) -> None:
        """`owner`'s bar line ended (a newline, or the end of its stream) showing `final`: an ordinary line now."""
        self.end_open_line()
        if not self.live[owner.stream]:
            self._lines(owner, self.throttle.end(owner, final))
            return
        erase = self.region.remove(owner)
        self._raw(self.fds[owner.stream], erase + owner.prefix + final.rstrip(b" ") + b"\n" + self.region.draw())

    def wait_time(self, timeout: float | None) -> float | None:
        """`timeout` (None: no limit), shortened to when a bar's held-back redraw is due in a log (`show_due`)."""
        due = self.throttle.due()
        return timeout if due is None else due if timeout is None else min(timeout, due)

    def show_due(self) -> None:
        """Show the held-back redraws whose interval is over: a quiet bar's log line is at most one interval old."""
        for owner, text in self.throttle.show_due():
            if isinstance(owner, RankStream):
                self._lines(owner, [text])

    def _lines(self, owner: RankStream, texts: list[bytes]) -> None:
        if texts:
            self.end_open_line()
        for text in texts:  # without the spaces a shorter redraw pads with to cover a longer one's
            self._out(owner.stream, owner.prefix + text.rstrip(b" ") + b"\n")

    def message(self, text: str, stream: Std = Std.ERR) -> None:
        """A line of the launcher's own (notes, the failure summary)."""
        self.end_open_line()
        self._out(stream, text.encode(errors="replace") + (b"" if text.endswith("\n") else b"\n"))


class LogFile:
    """One rank's file for one attempt: both streams, unbuffered."""

    def __init__(self, path: Path, mode: LogMode = LogMode.PRIVATE) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, mode.file_mode)

    def write(self, data: bytes) -> None:
        if self.fd >= 0:
            write_all(self.fd, data)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class RankStream:
    """One worker stream (stdout or stderr): splits it into pieces and routes them."""

    def __init__(
        self,
        rank: int,
        stream: Std,
        console: Console | None,
        file: LogFile | None,
        prefix: bool | bytes = True,
    ) -> None:
        self.rank = rank
        self.stream = stream
        self.console = console
        self.file = file
        self.own = f"[rank{rank}]: ".encode()  # ddpboot's default prefix, and torch's on a rank's tracebacks
        self.prefix = prefix if isinstance(prefix, bytes) else self.own if prefix else b""
        self.pending = bytearray()
        self.at_line_start = True  # for the console: the next ordinary piece needs the prefix
        self.after_cr = False  # the last terminator was \r: the line is a progress bar being redrawn
        self.redrawing = b""  # the bar's text since that \r
        self.bar: bytes | None = None  # the bar's last (non-blank) state; None: no bar on this line
        self.tail = bytearray()
        self.closed = False

    def line_ended_elsewhere(self) -> None:
        """The console ended our open line (another rank wrote): our next piece starts a fresh prefixed line."""
        self.at_line_start = True

    def feed(self, data: bytes) -> None:
        self.pending += data
        while True:
            cut = _first_terminator(self.pending)
            if cut < 0:
                break
            piece = bytes(self.pending[: cut + 1])
            del self.pending[: cut + 1]
            self._emit(piece)
        if self.pending and (self.after_cr or len(self.pending) >= MAX_PENDING):
            piece = bytes(self.pending)
            self.pending.clear()
            self._emit(piece)

    def close(self) -> None:
        """End of stream: whatever is left is shown (a bar as its last state, ending the console line) and
        written."""
        if self.closed:
            return
        self.closed = True
        if self.pending:
            piece = bytes(self.pending)
            self.pending.clear()
            self._emit(piece)
        if self.console is None:
            return
        if self.bar is not None:
            self.console.end_bar(self, self.bar)
            self.bar = None
        if self.console.open is self:
            self.console.end_open_line()
        self.at_line_start = True

    def _emit(self, piece: bytes) -> None:
        if self.file is not None:
            self.file.write(piece)
        self.tail += piece
        if len(self.tail) > TAIL_BYTES:
            del self.tail[: len(self.tail) - TAIL_BYTES]
        if self.console is not None:
            if self.after_cr or (piece.endswith(b"\r") and self.at_line_start):
                self._bar_piece(self.console, piece)
            else:
                self._line_piece(self.console, piece)

    def _line_piece(self, console: Console, piece: bytes) -> None:
        """Ordinary output: whole lines, or a part of a very long one. A line that begins with this rank's own
        `[rankR]: ` already (torch.distributed's excepthook writes every traceback line so; a script may too) gets
        the console prefix instead of it, not in front of it: one prefix per line."""
        head = self.prefix if self.at_line_start else b""
        if head and piece.startswith(self.own):
            piece = piece[len(self.own):]
        if piece.endswith(b"\r"):  # after a part of a long line: the rest of it is a bar
            console.write(self, head + piece[:-1] + b"\n", leaves_open=False)
            self.at_line_start, self.after_cr = True, True
            return
        ends_line = piece.endswith(b"\n")
        console.write(self, head + piece, leaves_open=not ends_line)
        self.at_line_start = ends_line

    def _bar_piece(self, console: Console, piece: bytes) -> None:
        """A piece of a line drawn with \r: a redraw, or the newline that ends the bar."""
        ends = piece[-1:]
        text = self.redrawing + (piece[:-1] if ends in (b"\r", b"\n") else piece)
        if ends == b"\n":
            self.after_cr, self.redrawing = False, b""
            final = text or self.bar
            self.bar = None
            if final is None:  # the bar was cleared (tqdm.write's message, leave=False) or never drawn
                console.write(self, self.prefix + text + b"\n", leaves_open=False)
            else:
                console.end_bar(self, final)
            return
        self.after_cr = True
        self.redrawing = b"" if ends == b"\r" else text
        if text and text != self.bar:
            self.bar = None if blank(text) else text
            console.redraw(self, text)

    def last_lines(self, n: int) -> list[str]:
        """The last `n` lines as shown on a terminal (a progress bar counts once, as its last redraw)."""
        text = self.tail.decode(errors="replace")
        lines = []
        for line in text.rstrip("\n").split("\n"):
            redraws = [seg for seg in line.split("\r") if seg]
            lines.append(redraws[-1] if redraws else "")
        while lines and not lines[-1].strip():
            lines.pop()
        return lines[-n:]


def _first_terminator(buf: bytearray) -> int:
    nl = buf.find(b"\n")
    cr = buf.find(b"\r")
    if nl < 0:
        return cr
    if cr < 0:
        return nl
    return min(nl, cr)


def read_error_file(path: str | Path) -> str | None:
    """The traceback a worker recorded with torch's `@record` (TORCHELASTIC_ERROR_FILE), if any."""
    with contextlib.suppress(OSError, ValueError):
        data = json.loads(Path(path).read_text())
        message = data.get("message") if isinstance(data, dict) else None
        if isinstance(message, dict):
            extra = message.get("extraInfo") or {}
            stack = extra.get("py_callstack") if isinstance(extra, dict) else None
            if isinstance(stack, str) and stack.strip():
                return stack.rstrip()
            if isinstance(message.get("message"), str):
                return str(message["message"])
        if isinstance(message, str):
            return message
    return None


def temporary_log_base() -> Path:
    """Where -r/-t write without --log-dir: the user's own directory in the temporary directory (module docstring)."""
    return Path(tempfile.gettempdir()) / f"ddpboot-logs-{os.getuid()}"


def _own_base(base: Path) -> None:
    """The temporary log base exists as a real directory of this user's that no one else can write into."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o700)
        st = os.lstat(base)
    except OSError as exc:
        raise UsageError(f"-r/--redirects and -t/--tee without --log-dir write under {base}, which cannot be made "
                         f"({exc.strerror}). Give --log-dir DIR.") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise UsageError(
            f"-r/--redirects and -t/--tee without --log-dir write under {base}, but that is not a directory of yours "
            "that only you can write (another user may have made it). Give --log-dir DIR, or remove it."
        )


def run_dir(base: Path, run_id: str, mode: LogMode = LogMode.PRIVATE) -> Path:
    """BASE/RUN_ID, or BASE/RUN_ID.N when an earlier run used that id: logs are never overwritten. BASE keeps the
    mode it has (or gets the umask's when created); RUN_ID gets `mode`'s. The temporary log base (-r/-t without
    --log-dir) is checked to be the user's own first."""
    if base == temporary_log_base():
        _own_base(base)
    try:
        base.mkdir(parents=True, exist_ok=True)
        for n in range(10000):
            path = base / (run_id if n == 0 else f"{run_id}.{n}")
            try:
                mode.make_dir(path)
                return path
            except FileExistsError:
                continue
    except OSError as exc:
        raise UsageError(
            f"--log-dir {base}: cannot create it ({exc.strerror}); give a directory you can write."
        ) from None
    raise UsageError(f"--log-dir {base}: {run_id} and 9999 numbered variants exist; choose another --rdzv-id.")
