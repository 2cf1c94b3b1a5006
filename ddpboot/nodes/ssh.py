"""How the launcher of one host is started for a job of several hosts (launch/remote.py): the ssh command, the
command the host runs, and the variables it gets. Pure: nothing here starts anything.

The ssh client is the real one (`ssh`, or the words of DDPBOOT_SSH_COMMAND, as GIT_SSH_COMMAND), so the user's
~/.ssh/config, agent, known_hosts and ProxyJump apply as with any ssh use. ddpboot adds: no terminal (`-T`; the
launcher's stdin is how the launching host reaches it), no prompt (`BatchMode=yes`: with several hosts there is
nobody to answer one), a connect timeout (`ConnectTimeout=5`: a host that does not answer is an error within
seconds) and keep-alives (`ServerAliveInterval=5`, 3 missed: a connection that died ends). Options of one's own
in DDPBOOT_SSH_COMMAND come first, and ssh takes the first value it is given of each.

Every host runs `cd CWD && exec PYTHON -m ddpboot.cli.remote ARGS`: the launching host's working directory and
interpreter path (the hosts share a file system, or have the same layout), its ddpboot options, and the node
options of that host. The variables are not on that command line (another user could read them in the host's
process list): they travel as the first line of the launcher's stdin (launch/tether.py reads them).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from ddpboot.contract import TORCHRUN_MASTER_PORT
from ddpboot.errors import UsageError
from ddpboot.nodes.hostfile import Host

REMOTE_MODULE = "ddpboot.cli.remote"
MARKER = "ddpboot-remote: started"  # a host's launcher says so on stderr once its tether runs (launch/tether.py)
SSH_COMMAND_VAR = "DDPBOOT_SSH_COMMAND"
SSH_DEFAULTS = ("-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5",
                "-o", "ServerAliveCountMax=3")

# The variables a job needs on every host (docs/clusters.md lists them): where programs and libraries are, Python's
# own, the communication libraries' and torch's settings, ddpboot's. CUDA_VISIBLE_DEVICES is each host's own
# (gpus= in the hostfile), and --env NAME forwards more.
FORWARDED_NAMES = ("PATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "VIRTUAL_ENV", "CONDA_PREFIX", "OMP_NUM_THREADS")
FORWARDED_PREFIXES = ("PYTHON", "NCCL_", "GLOO_", "CUDA_", "TORCH_", "PYTORCH_", "DDPBOOT_")
NOT_FORWARDED = ("CUDA_VISIBLE_DEVICES", SSH_COMMAND_VAR)
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class SshOptions:
    command: tuple[str, ...] = ("ssh",)
    port: int | None = None
    identity_file: str | None = None


def ssh_options(env: Mapping[str, str], port: int | None, identity_file: str | None) -> SshOptions:
    """The ssh client to run: DDPBOOT_SSH_COMMAND's words (checked) or `ssh`."""
    text = env.get(SSH_COMMAND_VAR, "").strip()
    if not text:
        return SshOptions(port=port, identity_file=identity_file)
    try:
        words = tuple(shlex.split(text))
    except ValueError as exc:
        raise UsageError(f"{SSH_COMMAND_VAR}={text}: {exc}; give the ssh command as a shell would read it "
                         "(e.g. DDPBOOT_SSH_COMMAND='ssh -F ~/.ssh/cluster.conf').") from None
    return SshOptions(words, port, identity_file)


def forwarded_env(env: Mapping[str, str], extra: Sequence[str]) -> dict[str, str]:
    """The variables every host's launcher gets: FORWARDED_NAMES and FORWARDED_PREFIXES that are set here, and
    each --env NAME (set here) or NAME=VALUE."""
    out = {k: v for k, v in env.items()
           if (k in FORWARDED_NAMES or k.startswith(FORWARDED_PREFIXES)) and k not in NOT_FORWARDED}
    for item in extra:
        name, sep, value = item.partition("=")
        if not _NAME.fullmatch(name):
            raise UsageError(f"--env {item}: {name!r} is not a variable name; give NAME (forwarded from here) or "
                             "NAME=VALUE.")
        if not sep:
            if name not in env:
                raise UsageError(f"--env {name}: {name} is not set here, so there is nothing to forward. Export it, "
                                 f"or give its value: --env {name}=VALUE.")
            value = env[name]
        out[name] = value
    return out


def is_local(host: Host, names: Collection[str]) -> bool:
    """Whether `host` is this machine, where its launcher starts without ssh: a loopback name, or one of this
    machine's names (`names`: its host name, short and fully qualified). A login (user@host) always goes through
    ssh, and so do other loopback addresses (127.0.0.2 is how the tests reach a real sshd)."""
    if "@" in host.name:
        return False
    return host.address in LOCAL_NAMES or host.address in names


def remote_command(cwd: str, python: str, args: Sequence[str]) -> str:
    """What the host's shell runs: into the same directory, then the same interpreter's ddpboot."""
    words = [python, "-m", REMOTE_MODULE, *args]
    return f"cd {shlex.quote(cwd)} && exec {shlex.join(words)}"


def ssh_argv(ssh: SshOptions, host: Host, command: str) -> list[str]:
    """The ssh client's command line for `host` (`--` before it: a host is never read as an option)."""
    argv = [*ssh.command, *SSH_DEFAULTS]
    if ssh.port is not None:
        argv += ["-p", str(ssh.port)]
    if ssh.identity_file is not None:
        argv += ["-i", ssh.identity_file]
    return [*argv, "--", host.name.replace("[", "").replace("]", ""), command]


def local_argv(python: str, args: Sequence[str]) -> list[str]:
    """The launcher of the host the job is started on: the same command, without ssh and a shell."""
    return [python, "-m", REMOTE_MODULE, *args]


def node_args(nnodes: int, node_rank: int, master_addr: str, master_port: int | None) -> list[str]:
    """The node options every host's launcher gets (its own node rank); one host needs no store address (its
    launcher binds a free port on loopback itself) unless one was asked for."""
    if nnodes == 1:
        return ["--nnodes", "1", *(["--master-port", str(master_port)] if master_port else [])]
    return ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--master-addr", master_addr,
            "--master-port", str(master_port or TORCHRUN_MASTER_PORT)]


def connect_failure(host: Host, code: int, lines: Sequence[str], ssh: SshOptions) -> str:
    """Why the launcher of `host` did not start, from ssh's exit code and what it and the host's shell said."""
    said = next((line for line in reversed(lines) if line.strip()), "").strip()
    if code == 255:
        port = f" on port {ssh.port} (--ssh-port)" if ssh.port is not None else ""
        return (f"ssh could not run ddpboot there ({said or 'ssh exit code 255'}). Check that `ssh{_port(ssh)} "
                f"{host.name} true` works without a prompt: its sshd answers{port}, your key is accepted "
                "(--ssh-identity-file, or your agent), and its host key is in known_hosts")
    return f"its launcher did not start (exit code {code}{f': {said}' if said else ''})"


def _port(ssh: SshOptions) -> str:
    return f" -p {ssh.port}" if ssh.port is not None else ""
