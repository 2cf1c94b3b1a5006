"""One job on several hosts, as the launching host sees it (launch/remote.py does the I/O): pure decisions over
the hosts' launchers, their output lines, their exits, the signals and the clock.

- Output: a host's ranks' lines arrive as its launcher prints them (`[rank5]: ...`, or the prefix template, where
  `${hostname}` names the host); the launcher's own lines (`ddpboot: ...`) get the host after `ddpboot:`
  (`ddpboot: node2: rank 5 failed ...`, `ddpboot: error: node2: ...`). What a host says before its launcher
  started (ssh's and the shell's words) is held back: shown once the launcher starts, or named in the error.
- A host whose launcher never started (ssh could not connect, no interpreter at that path, no such directory)
  fails the whole job at once: one `ddpboot: error:` naming the host, every other host stopped, exit code 2.
- A host whose launcher refused the job (exit 2 with its `ddpboot: error:`) stops the others at once too; any
  other failure leaves the others LINK_GRACE seconds to end through the node link (nodes/link.py), which stops
  them with the root cause's code; whoever still runs then gets SIGTERM.
- A stop signal (Ctrl-C) goes to every host's launcher through its tether (launch/tether.py), as a terminal's
  would; a second Ctrl-C, the same again (it kills the ranks). Hosts that have not ended `kill_after` seconds
  after they were asked to stop lose their connection (their ssh client is killed: their launcher then stops on
  its own, through its tether).
- The job's exit code: 2 for a host that never started, else the first failure's code (every node then exits
  with the root cause's, through the node link), else 0.
"""

from __future__ import annotations

import math
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field

from ddpboot.nodes.ssh import MARKER

LINK_GRACE = 5.0  # seconds the other hosts get to end through the node link after one host's launcher failed
ERROR = "ddpboot: error: "
SAY = "ddpboot: "


@dataclass(frozen=True)
class Send:
    """Send a signal's name to these hosts' tethers."""

    hosts: tuple[int, ...]
    name: str  # INT, TERM, HUP, QUIT


@dataclass(frozen=True)
class Kill:
    """Kill these hosts' ssh clients (or local launchers): their connection ends."""

    hosts: tuple[int, ...]


@dataclass(frozen=True)
class Say:
    text: str


Action = Send | Kill | Say


@dataclass
class HostState:
    label: str  # the host as written
    node: int
    started: bool = False
    code: int | None = None  # its launcher's exit code, once it ended
    held: list[str] = field(default_factory=list)  # its lines before it started
    error: str = ""  # its launcher's first error line, without `ddpboot: error: `


@dataclass
class HostJob:
    """The hosts' launchers, in node order; `kill_after`: seconds from a stop to the end of the connections."""

    hosts: list[HostState]
    kill_after: float
    failure: tuple[int, int] | None = None  # (host, exit code) of the first failure
    refused: str = ""  # the error that ended the job before it ran (a host did not start)
    stop_at: float = math.inf  # when the hosts still running get SIGTERM
    kill_at: float = math.inf  # when the hosts still running lose their connection
    interrupts: int = 0

    @classmethod
    def of(cls, labels: Sequence[str], kill_after: float) -> HostJob:
        return cls([HostState(label, node) for node, label in enumerate(labels)], kill_after)

    def running(self) -> tuple[int, ...]:
        return tuple(i for i, h in enumerate(self.hosts) if h.code is None)

    # --- output ---------------------------------------------------------------------------------------------

    def line(self, i: int, text: str, stderr: bool) -> list[str]:
        """One line from host i (without its newline): the lines to show now, on the same stream."""
        host = self.hosts[i]
        if stderr and not host.started:
            if text.strip() == MARKER:
                host.started = True
                held, host.held = host.held, []
                return [self._tagged(host, line, held=True) for line in held]
            host.held.append(text)
            return []
        if not stderr:
            return [text]
        if text.startswith(ERROR) and not host.error:
            host.error = text[len(ERROR):]
        return [self._tagged(host, text)]

    @staticmethod
    def _tagged(host: HostState, text: str, held: bool = False) -> str:
        """The host after `ddpboot:` in its launcher's own lines; before the others that came before the launcher
        started (ssh's, the shell's); a rank's lines as they are."""
        for start in (ERROR, SAY):
            if text.startswith(start):
                return f"{start}{host.label}: {text[len(start):]}"
        return f"{host.label}: {text}" if held else text

    # --- events ---------------------------------------------------------------------------------------------

    def exited(self, i: int, code: int, now: float, why_not_started: str = "") -> list[Action]:
        """Host i's launcher (or its ssh client) ended with `code`. `why_not_started`: what to say when it ended
        before its launcher started."""
        host = self.hosts[i]
        host.code = code
        if not host.started:
            return self._refuse(i, why_not_started or f"its launcher did not start (exit code {code})", now)
        if code == 0 or self.failure is not None:
            return []
        self.failure = (i, code)
        if code == 2 and host.error:  # it refused the job before it ran: the others wait at the check-in
            return self._stop("TERM", now)
        self.stop_at = min(self.stop_at, now + LINK_GRACE)
        return []

    def _refuse(self, i: int, why: str, now: float) -> list[Action]:
        host = self.hosts[i]
        if self.refused or self.interrupts:  # stopped before it started: no refusal, its code counts as any
            if self.failure is None and host.code:
                self.failure = (i, host.code)
            return []
        self.refused = f"{host.label} (node {host.node}): {why}; nothing runs on any host"
        if self.failure is None:
            self.failure = (i, 2)
        return [Say(ERROR + self.refused), *self._stop("TERM", now)]

    def signalled(self, signo: int, now: float) -> list[Action]:
        """A stop signal reached the launching host: to every host that still runs, as its name."""
        name = signal.Signals(signo).name.removeprefix("SIG")
        said: list[Action] = []
        if signo == signal.SIGINT:
            self.interrupts += 1
            said = [Say(f"{SAY}SIGINT: stopping the ranks of every host"
                        f"{' now (SIGKILL)' if self.interrupts > 1 else '; a second Ctrl-C kills them'}")]
        return [*said, *self._stop(name, now)]

    def _stop(self, name: str, now: float) -> list[Action]:
        self.stop_at = math.inf
        self.kill_at = min(self.kill_at, now + self.kill_after)
        running = self.running()
        return [Send(running, name)] if running else []

    def tick(self, now: float) -> list[Action]:
        """The deadlines: SIGTERM after the grace, the connections' end after `kill_after`."""
        if now >= self.kill_at:
            self.kill_at = math.inf
            running = self.running()
            return [Kill(running)] if running else []
        if now >= self.stop_at:
            return self._stop("TERM", now)
        return []

    def deadline(self) -> float:
        return min(self.stop_at, self.kill_at)

    @property
    def code(self) -> int:
        if self.refused:
            return 2
        return self.failure[1] if self.failure is not None else 0
