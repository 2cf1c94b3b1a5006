"""The tether: how the launcher of one host of a job started over ssh (launch/remote.py) stays tied to the command
that started it. Its stdin is the connection to the launching host; that launcher's signals arrive on it as lines,
and its end is the end of the connection.

At the start (cli/remote.py, before the options are read) the launcher reads the first line of its stdin, the
launching host's hello: its ddpboot version and the variables the job forwards (nodes/ssh.py says which), which
it puts into its environment. Then it forks the tether, a small process that keeps the stdin and reads it: a line
`INT`, `TERM`, `HUP` or `QUIT` is that signal sent to the launcher, which handles it as if a terminal or a
scheduler sent it (SIGINT: the ranks stop, a second SIGINT kills them); the end of the stream (the launching host's
ddpboot was killed, its ssh client died, the connection dropped) is SIGHUP: the launcher stops its ranks, and its
node link tells the other nodes. The launcher's own stdin becomes /dev/null, so that no rank reads the connection.
The tether dies with the launcher (PR_SET_PDEATHSIG), and says that it started with one line on stderr (MARKER),
which the launching host takes out of the output: before it, a failure is ssh's or the shell's, not the job's.

It is forked, not exec'd, for the same reasons as the guardian (launch/procs/guardian.py): no thread runs yet, and
a fork costs no interpreter start.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import sys
import time
from typing import Any

from ddpboot.errors import UsageError
from ddpboot.nodes.ssh import MARKER

HELLO_TIMEOUT = 30.0
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP, "QUIT": signal.SIGQUIT}
PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15


def hello_line(version: str, env: dict[str, str]) -> bytes:
    """What the launching host writes first to each host's launcher."""
    return json.dumps({"version": version, "env": env}).encode() + b"\n"


def read_hello(fd: int = 0, timeout: float = HELLO_TIMEOUT) -> tuple[dict[str, Any], bytes]:
    """The launching host's hello and whatever came after its line; UsageError when none comes."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise UsageError(f"no word from the launching host within {timeout:g} s: `python -m ddpboot.cli.remote` "
                             "is the launcher of one host of a job that `ddpboot --hostfile FILE` (or --hosts) "
                             "starts, which writes to its stdin. Run ddpboot itself.")
        chunk = os.read(fd, 65536)
        if not chunk:
            raise UsageError("the launching host closed the connection before it said anything: nothing started.")
        data += chunk
    line, _, rest = data.partition(b"\n")
    try:
        hello = json.loads(line)
        if not isinstance(hello, dict) or not isinstance(hello.get("env"), dict):
            raise ValueError
    except ValueError:
        raise UsageError("the first line from the launching host is not ddpboot's hello: run `ddpboot --hostfile "
                         "FILE ...` on the launching host, not `python -m ddpboot.cli.remote` by hand.") from None
    return hello, rest


def start(pending: bytes, fd: int = 0) -> int:
    """Fork the tether on `fd` (the bytes after the hello already read), give this process /dev/null as stdin, and
    say so on stderr; the tether's pid."""
    launcher = os.getpid()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the tether
        code = 0
        try:
            _tether(fd, launcher, pending)
        except BaseException:  # nothing of the launcher's may run in this process
            code = 1
        os._exit(code)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, fd)
    os.close(null)
    print(MARKER, file=sys.stderr, flush=True)
    return pid


def _tether(fd: int, launcher: int, pending: bytes) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.prctl(PR_SET_NAME, b"ddpboot-tether", 0, 0, 0)
    if os.getppid() != launcher:  # the launcher died before the death signal was set
        return
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for sig in (*SIGNALS.values(), signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)
    for other in range(3, 256):  # the launcher's descriptors (the hello's pipe aside, there are none yet)
        if other != fd:
            with contextlib.suppress(OSError):
                os.close(other)
    buf = pending
    while True:
        *lines, buf = buf.split(b"\n")
        for line in lines:
            asked = SIGNALS.get(line.strip().decode(errors="replace"))
            if asked is not None:
                _kill(launcher, asked)
        try:
            chunk = os.read(fd, 4096)
        except InterruptedError:
            continue
        if not chunk:
            _say("the connection to the launching host closed: stopping this node (SIGHUP to its launcher)")
            _kill(launcher, signal.SIGHUP)
            return
        buf += chunk


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"ddpboot: {text}\n".encode())
