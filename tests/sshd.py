"""A real OpenSSH server for the tests of jobs of several hosts (tests/process/test_hostfile.py).

Debian's sshd (scripts/ci/sshd-up installs it; `make test` runs that), started by the tests as root on the loopback
addresses 127.0.0.2 and 127.0.0.3, with a config, a host key and a client key of its own made for the session. The
client is the real ssh: it gets the key with --ssh-identity-file and a known_hosts file that lists the server's host
key through DDPBOOT_SSH_COMMAND (StrictHostKeyChecking stays on). Nothing of the machine's ssh setup is changed:
the system's sshd, if one runs, keeps running, and /etc/ssh is not read by this one.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = Path("/usr/sbin/sshd")
ADDRESSES = ("127.0.0.2", "127.0.0.3")


def unavailable() -> str | None:
    """Why no test sshd can run here, or None."""
    if os.getuid() != 0:
        return "the ssh tests start an sshd of their own as root (its sessions log in as root): run them as root"
    if not SSHD.exists() or shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "no OpenSSH server here: scripts/ci/sshd-up installs Debian's openssh-server (make test runs it)"
    return None


@dataclass
class Sshd:
    dir: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def key(self) -> Path:
        return self.dir / "id"

    def args(self) -> list[str]:
        """The ddpboot options that reach this server."""
        return ["--ssh-port", str(self.port), "--ssh-identity-file", str(self.key)]

    def env(self) -> dict[str, str]:
        """What the client needs: this server's host key as known, and only the test's key offered."""
        return {"DDPBOOT_SSH_COMMAND": f"ssh -o UserKnownHostsFile={self.dir / 'known_hosts'} "
                                       "-o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes "
                                       "-o IdentitiesOnly=yes"}

    def ssh(self, host: str, *command: str) -> subprocess.CompletedProcess[str]:
        words = self.env()["DDPBOOT_SSH_COMMAND"].split()
        return subprocess.run([*words, "-T", "-o", "BatchMode=yes", "-p", str(self.port), "-i", str(self.key), host,
                               *command], capture_output=True, text=True, timeout=30)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def free_port_on(addresses: tuple[str, ...]) -> int:
    """A port free on every one of `addresses` at this moment."""
    while True:
        with socket.socket() as s:
            s.bind((addresses[0], 0))
            port = int(s.getsockname()[1])
        try:
            for addr in addresses[1:]:
                with socket.socket() as s:
                    s.bind((addr, port))
        except OSError:
            continue
        return port


def start(where: Path, addresses: tuple[str, ...] = ADDRESSES, timeout: float = 30.0) -> Sshd:
    """An sshd of its own on `addresses`, answering once `ssh ... true` goes through on each."""
    where.mkdir(parents=True, exist_ok=True)
    for name in ("host_key", "id"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(where / name)], check=True)
    shutil.copy(where / "id.pub", where / "authorized_keys")
    port = free_port_on(addresses)
    listen = "".join(f"ListenAddress {addr}:{port}\n" for addr in addresses)
    (where / "sshd_config").write_text(
        f"{listen}HostKey {where / 'host_key'}\nPidFile {where / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {where / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
        "MaxStartups 100\nMaxSessions 100\n")
    host_key = " ".join((where / "host_key.pub").read_text().split()[:2])
    (where / "known_hosts").write_text("".join(f"[{addr}]:{port} {host_key}\n" for addr in addresses))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen([str(SSHD), "-D", "-f", str(where / "sshd_config"), "-E", str(where / "log")],
                            stdin=subprocess.DEVNULL, start_new_session=True)
    server = Sshd(where, port, proc)
    deadline = time.monotonic() + timeout
    for addr in addresses:
        while True:
            answer = server.ssh(addr, "true")
            if answer.returncode == 0:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                server.stop()
                log = (where / "log").read_text() if (where / "log").exists() else ""
                raise RuntimeError(f"the test sshd does not answer on {addr}:{port}: {answer.stderr}\n{log}")
            time.sleep(0.1)
    return server
