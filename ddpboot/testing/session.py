"""The pytest process's side of warm ranks: start the session server (server.py) once per session, ask it to run one
test's job, and wait for the answer within the test's deadline. Standard library only (the pytest process never
imports torch or the launcher). Its messages call it "the warm process", as the plugin's users know it; it is not
`ddpboot --warm`'s (launch/faststart/warmserver.py).

If the session server cannot run a job in time (a launcher that does not end), the test launcher gets SIGTERM, then
the server is killed (its zygote, the ranks and the launcher die with it) and the next test starts a new one.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from ddpboot.launch.procs.groups import signal_process
from ddpboot.testing.job import PRELOAD_VAR

STOP_AFTER = 1.0  # seconds after the test's timeout (when every rank dumps its stack) before the launcher is stopped
GRACE = 15.0  # seconds a stopped launcher gets to end its ranks and report
START_TIMEOUT = 300.0  # seconds the session server may take to import torch and the test files


class SessionServerError(Exception):
    """The session server could not start or died; the message says why (its log's tail)."""


class SessionServer:
    """The pytest process's handle of its session server: start it, run one test's job in it, end it."""

    def __init__(self, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.proc = proc
        self.log = log
        self._buffer = b""
        self._ready = False

    @classmethod
    def start(cls, modules: list[tuple[str, str]], log: Path) -> SessionServer:
        """Start the session server; it imports torch and `modules` ((name, path) of test files) in the background."""
        env = {**os.environ, PRELOAD_VAR: json.dumps({"sys_path": sys.path, "modules": modules})}
        with log.open("ab") as err:
            proc = subprocess.Popen([sys.executable, "-m", "ddpboot.testing.server"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=err, env=env)
        return cls(proc, log)

    def _line(self, deadline: float) -> dict[str, Any] | None:
        """The next message, or None at the deadline; raises SessionServerError when the server has gone."""
        out = self.proc.stdout
        assert out is not None
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([out], [], [], left)[0]:
                return None
            data = os.read(out.fileno(), 65536)
            if not data:
                raise SessionServerError(f"the warm process exited; its log ends:\n{self._log_tail()}")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        msg: dict[str, Any] = json.loads(line)
        return msg

    def _log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
        return ""

    def wait_ready(self) -> None:
        if self._ready:
            return
        msg = self._line(time.monotonic() + START_TIMEOUT)
        if msg is None or msg.get("op") != "ready":
            raise SessionServerError(f"the warm process is not ready: {msg and msg.get('error')}\n{self._log_tail()}")
        self._ready = True

    def run(self, nproc: int, gpu: bool, results: Path, timeout: float) -> int | None:
        """One job; its exit code, or None when it had to be killed past the deadline."""
        self.wait_ready()
        request = {"nproc": nproc, "gpu": gpu, "results": str(results), "timeout": timeout}
        stdin = self.proc.stdin
        assert stdin is not None
        _write(stdin, json.dumps(request) + "\n")
        started = self._line(time.monotonic() + GRACE)
        if started is None:
            self.close()
            return None
        done = self._line(time.monotonic() + timeout + STOP_AFTER)
        if done is not None:
            return int(done["code"])
        # Past the timeout every rank has dumped its stack: stop the launcher as a user would (it ends its ranks).
        with contextlib.suppress(ProcessLookupError):
            signal_process(int(started["pid"]), signal.SIGTERM)
        if self._line(time.monotonic() + GRACE) is None:
            self.close()
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def close(self) -> None:
        """End the session server: EOF first (it lets its zygote go), then SIGKILL if it lingers."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _write(stream: IO[bytes], text: str) -> None:
    try:
        stream.write(text.encode())
        stream.flush()
    except (BrokenPipeError, OSError) as exc:
        raise SessionServerError(f"the warm process is gone ({exc})") from None
