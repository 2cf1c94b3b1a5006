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

A whole line several ranks say alike within a short window is shown once, its prefix naming them (`[rank0-3]: `,
collapse.py); what a rank holds is shown before its other output (bars are never held) and the launcher's messages.

Files get the rank's bytes unchanged (no prefix), stdout and stderr in arrival order, whole pieces at a time; they
are written unbuffered, so what a worker printed before dying is on disk even if the launcher is killed next.

What cannot be written never stops the job. A console whose reader left (`| head`: EPIPE) is dropped without a
word; one that fails otherwise (`> /dev/full`, a full disk or quota under `> train.log`) is dropped with one
`ddpboot:` line on the other console stream. A log file that cannot be written (its disk filled during the run)
is said once per run, on the console, which keeps showing every line it shows; the files get what the ranks print
again once there is room, and the lines that `-r` sends to the files only are lost meanwhile.

Where the files go (the run directory, who may read it, a disk with no room) is rundir.py's.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ddpboot.launch.bars import LiveRegion, Throttle, blank, progress_interval, terminal_of
from ddpboot.launch.collapse import Collapser, Said
from ddpboot.launch.spec import LinePrefix, LogMode, Std

MAX_PENDING = 64 * 1024  # a longer run without a terminator is shown in parts
TAIL_BYTES = 32 * 1024


READER_GONE = (errno.EPIPE, errno.EBADF, errno.EIO)  # a console whose reader left: dropped without a word


def write_all(fd: int, data: bytes) -> OSError | None:
    """Write everything (a console may take partial writes); the error that stopped it (the reader has gone:
    READER_GONE; a full disk: ENOSPC, EDQUOT, EFBIG), or None."""
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
            return exc
        view = view[n:]
    return None


def why_not_written(exc: OSError) -> str:
    """`No space left on device (the disk is full)`: the error, and what it means where that is not plain."""
    full = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "your disk quota is used up",
            errno.EFBIG: "the file is larger than the file size limit, ulimit -f"}.get(exc.errno or 0)
    return f"{exc.strerror or exc}" + (f" ({full})" if full else "")


class Console:
    """The launcher's stdout and stderr, shared by every rank and by the launcher's own messages; progress bars
    drawn in place on a terminal and throttled in a pipe or file (bars.py)."""

    def __init__(self, out_fd: int = 1, err_fd: int = 2, clock: Callable[[], float] = time.monotonic,
                 environ: Mapping[str, str] | None = None) -> None:
        environ = os.environ if environ is None else environ
        self.fds = {Std.OUT: out_fd, Std.ERR: err_fd}
        self.open: RankStream | None = None  # whose line is open (the cursor is not at a fresh line)
        self.gone: set[int] = set()
        self.clock = clock
        self.throttle = Throttle(progress_interval(environ), clock)
        self.collapser: Collapser[RankStream] = Collapser(unit=lambda stream: stream.rank)
        # The bars' region lives on stderr's terminal (or stdout's); a stream writing to that terminal is live.
        terms = {std: terminal_of(fd, environ) for std, fd in self.fds.items()}
        term = terms[Std.ERR] if terms[Std.ERR] is not None else terms[Std.OUT]
        self.live = {std: term is not None and terms[std] == term for std in self.fds}
        self.region_fd = err_fd if self.live[Std.ERR] else out_fd
        self.region = LiveRegion(self._width)
        self.log_trouble_said = False

    def _width(self) -> int:
        try:
            return os.get_terminal_size(self.region_fd).columns or 80
        except OSError:
            return 80

    def _raw(self, fd: int, data: bytes) -> None:
        if fd in self.gone or not data:
            return
        failed = write_all(fd, data)
        if failed is None:
            return
        self.gone.add(fd)  # `ddpboot ... | head`: keep running, keep the files, drop the console
        other = next((f for f in self.fds.values() if f != fd and f not in self.gone), None)
        if failed.errno not in READER_GONE and other is not None:
            name = "stdout" if fd == self.fds[Std.OUT] else "stderr"
            self.end_open_line()
            self._raw(other, f"ddpboot: cannot write the job's {name}: {why_not_written(failed)}. The job goes on; "
                      f"what its ranks print to {name} is dropped from here on (give --log-dir DIR on another disk "
                      "to keep it in files).\n".encode())

    def log_trouble(self, path: Path, exc: OSError) -> None:
        """A log file could not be written (LogFile): said once per run; the job and the console go on."""
        if self.log_trouble_said:
            return
        self.log_trouble_said = True
        self.message(f"ddpboot: cannot write the log file {path}: {why_not_written(exc)}. The job goes on and the "
                     "console shows every line it shows; the log files miss what the ranks print until there is "
                     "room again (lines that -r sends to the files only are lost meanwhile). Free space there.")

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

    def closed(self, owner: RankStream) -> None:  # its stream ended: the groups that waited for it may go
        self._said(self.collapser.close(owner, self.clock()))

    def write(self, owner: RankStream, data: bytes, leaves_open: bool) -> None:
        """Ordinary output of a rank; what it holds and the last state of its bars in a log are shown first."""
        self._said(self.collapser.before(owner))
        if self.open is not None and self.open is not owner:
            self.end_open_line()
        self._bars_first(owner)
        self._out(owner.stream, data, leaves_open)
        self.open = owner if leaves_open else None

    def said(self, owner: RankStream, line: bytes) -> None:
        """A whole ordinary line of `owner` (no prefix), held to be shown once with the same line of other ranks."""
        self._bars_first(owner)
        self._said(self.collapser.add(owner, line, self.clock()))

    def _bars_first(self, owner: RankStream) -> None:
        for bar in [key for key in self.throttle.bars if isinstance(key, RankStream) and key.rank == owner.rank]:
            self._lines(bar, self.throttle.flush(bar))

    def _said(self, groups: list[Said[RankStream]]) -> None:
        for group in groups:
            first = group.members[0]
            prefix = first.prefix if len(group.members) == 1 or first.group is None else first.group.render_group(
                [m.ids for m in group.members])
            self.end_open_line()
            self._out(first.stream, prefix + group.text)

    def redraw(self, owner: RankStream, text: bytes) -> None:
        """A progress-bar redraw of `owner`: its line in place on a terminal, throttled lines in a log."""
        self._said(self.collapser.before(owner))
        self.end_open_line()
        if not self.live[owner.stream]:
            self._lines(owner, self.throttle.redraw(owner, text))
        elif blank(text):
            self._raw(self.region_fd, self.region.remove(owner) + self.region.draw())
        else:
            self._raw(self.region_fd, self.region.update(owner, owner.prefix + text.rstrip(b" ")))

    def end_bar(self, owner: RankStream, final: bytes) -> None:
        """`owner`'s bar line ended (a newline, or the end of its stream) showing `final`: an ordinary line now."""
        self._said(self.collapser.before(owner))
        self.end_open_line()
        if not self.live[owner.stream]:
            self._lines(owner, self.throttle.end(owner, final))
            return
        erase = self.region.remove(owner)
        self._raw(self.fds[owner.stream], erase + owner.prefix + final.rstrip(b" ") + b"\n" + self.region.draw())

    def wait_time(self, timeout: float | None) -> float | None:
        """`timeout` (None: no limit), shortened to when a held line or a bar's held-back redraw is due (`show_due`)."""
        dues = [d for d in (self.throttle.due(), self.collapser.due(self.clock()), timeout) if d is not None]
        return min(dues) if dues else None

    def show_due(self) -> None:
        """Show the held lines and bar redraws that are due: a quiet bar's log line is at most one interval old."""
        self._said(self.collapser.expired(self.clock()))
        for owner, text in self.throttle.show_due():
            if isinstance(owner, RankStream):
                self._lines(owner, [text])

    def _lines(self, owner: RankStream, texts: list[bytes]) -> None:
        if texts:
            self.end_open_line()
        for text in texts:  # without the spaces a shorter redraw pads with to cover a longer one's
            self._out(owner.stream, owner.prefix + text.rstrip(b" ") + b"\n")

    def message(self, text: str, stream: Std = Std.ERR) -> None:
        """A line of the launcher's own (notes, the failure summary): what the ranks said before it is shown first."""
        self._said(self.collapser.flush())
        self.end_open_line()
        self._out(stream, text.encode(errors="replace") + (b"" if text.endswith("\n") else b"\n"))


class LogFile:
    """One rank's file for one attempt: both streams, unbuffered. What cannot be written is told to `trouble`
    (Console.log_trouble) and lost; later writes are tried again."""

    def __init__(self, path: Path, mode: LogMode = LogMode.PRIVATE,
                 trouble: Callable[[Path, OSError], None] | None = None) -> None:
        self.path = path
        self.trouble = trouble
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, mode.file_mode)
        except OSError as exc:
            self.fd = -1
            self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        if self.trouble is not None:
            self.trouble(self.path, exc)

    def write(self, data: bytes) -> None:
        if self.fd >= 0:
            failed = write_all(self.fd, data)
            if failed is not None:
                self._failed(failed)

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
        group: LinePrefix | None = None,
        slot: tuple[int, int] = (0, 0),
    ) -> None:
        self.rank = rank
        self.group = group  # the template that names the ranks of a collapsed line; None: lines are not held
        self.ids = (rank, *slot)  # rank, local rank, node rank: what the template names
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
        if console is not None and group is not None:
            console.collapser.open(self, stream)

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
        if self.group is not None:
            self.console.closed(self)

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
        if ends_line and self.at_line_start and self.group is not None:
            console.said(self, piece)
            return
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
