"""How each host's launcher is started (ddpboot/nodes/ssh.py): the ssh command line, the command the host runs,
the variables it gets, which host is this one."""

from __future__ import annotations

import shlex

import pytest

from ddpboot.errors import UsageError
from ddpboot.nodes.hostfile import Host
from ddpboot.nodes.ssh import (
    SshOptions,
    connect_failure,
    forwarded_env,
    is_local,
    local_argv,
    node_args,
    remote_command,
    ssh_argv,
    ssh_options,
)


def test_the_ssh_command_line_is_the_real_client_with_ddpboots_options() -> None:
    argv = ssh_argv(SshOptions(port=2222, identity_file="/k/id"), Host("user@node1"), "CMD")
    assert argv == ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-o", "ServerAliveInterval=5",
                    "-o", "ServerAliveCountMax=3", "-p", "2222", "-i", "/k/id", "--", "user@node1", "CMD"]
    plain = ssh_argv(SshOptions(), Host("[fd00::2]"), "CMD")
    assert "-p" not in plain and "-i" not in plain and plain[-2:] == ["fd00::2", "CMD"]


def test_ddpboot_ssh_command_comes_first_so_its_options_win() -> None:
    ssh = ssh_options({"DDPBOOT_SSH_COMMAND": "ssh -F '/my dir/cfg' -o ConnectTimeout=30"}, 22, None)
    assert ssh.command == ("ssh", "-F", "/my dir/cfg", "-o", "ConnectTimeout=30")
    assert ssh_argv(ssh, Host("h"), "C")[:6] == ["ssh", "-F", "/my dir/cfg", "-o", "ConnectTimeout=30", "-T"]
    assert ssh_options({}, None, None).command == ("ssh",)
    with pytest.raises(UsageError, match="DDPBOOT_SSH_COMMAND=ssh -F 'x: No closing quotation"):
        ssh_options({"DDPBOOT_SSH_COMMAND": "ssh -F 'x"}, None, None)


def test_a_host_runs_the_same_interpreter_in_the_same_directory() -> None:
    command = remote_command("/home/me/my project", "/opt/venv/bin/python", ["--nproc", "2", "train.py", "a b"])
    assert command == ("cd '/home/me/my project' && exec /opt/venv/bin/python -m ddpboot.cli.remote --nproc 2 "
                       "train.py 'a b'")
    assert shlex.split(command)[-4:] == ["--nproc", "2", "train.py", "a b"]
    assert local_argv("/py", ["x"]) == ["/py", "-m", "ddpboot.cli.remote", "x"]
    assert node_args(2, 1, "h0", 29600) == ["--nnodes", "2", "--node-rank", "1", "--master-addr", "h0",
                                            "--master-port", "29600"]
    assert node_args(2, 0, "h0", None)[-1] == "29500"  # torchrun's default for several nodes
    assert node_args(1, 0, "h0", None) == ["--nnodes", "1"]  # one host: its launcher binds a free loopback port
    assert node_args(1, 0, "h0", 29600) == ["--nnodes", "1", "--master-port", "29600"]


def test_the_job_variables_go_to_every_host_and_env_adds_more() -> None:
    env = {"PATH": "/bin", "LD_LIBRARY_PATH": "/l", "PYTHONPATH": "/p", "NCCL_SOCKET_IFNAME": "ib0",
           "GLOO_SOCKET_IFNAME": "eth0", "CUDA_HOME": "/cuda", "CUDA_VISIBLE_DEVICES": "0", "TORCH_LOGS": "+dynamo",
           "DDPBOOT_FAKE_GPUS": "8", "DDPBOOT_SSH_COMMAND": "ssh", "HOME": "/home/me", "SSH_AUTH_SOCK": "/s",
           "WANDB_API_KEY": "k", "OMP_NUM_THREADS": "4", "HF_HOME": "/hf"}
    assert sorted(forwarded_env(env, [])) == ["CUDA_HOME", "DDPBOOT_FAKE_GPUS", "GLOO_SOCKET_IFNAME", "LD_LIBRARY_PATH",
                                              "NCCL_SOCKET_IFNAME", "OMP_NUM_THREADS", "PATH", "PYTHONPATH",
                                              "TORCH_LOGS"]
    more = forwarded_env(env, ["HF_HOME", "RUN=7", "CUDA_VISIBLE_DEVICES"])
    assert (more["HF_HOME"], more["RUN"], more["CUDA_VISIBLE_DEVICES"]) == ("/hf", "7", "0")
    with pytest.raises(UsageError, match="--env NOPE: NOPE is not set here"):
        forwarded_env(env, ["NOPE"])
    with pytest.raises(UsageError, match="'1X' is not a variable name"):
        forwarded_env(env, ["1X=2"])


def test_the_local_host_is_a_loopback_name_or_this_machines_name() -> None:
    names = {"gpu01", "gpu01.cluster"}
    assert [is_local(Host(n), names) for n in ("localhost", "127.0.0.1", "::1", "gpu01", "gpu01.cluster")] == [
        True] * 5
    # other loopback addresses (a test's sshd), a login and other hosts go through ssh
    assert [is_local(Host(n), names) for n in ("127.0.0.2", "me@localhost", "gpu02")] == [False] * 3


def test_why_a_host_did_not_start_names_ssh_or_the_shell() -> None:
    ssh = SshOptions(port=2222)
    refused = connect_failure(Host("n1"), 255, ["ssh: connect to host n1 port 2222: Connection refused", ""], ssh)
    assert refused.startswith("ssh could not run ddpboot there (ssh: connect to host n1 port 2222: Connection "
                              "refused). Check that `ssh -p 2222 n1 true` works without a prompt")
    shell = connect_failure(Host("n1"), 127, ["bash: line 1: /venv/bin/python: No such file or directory"], ssh)
    assert shell == ("its launcher did not start (exit code 127: bash: line 1: /venv/bin/python: No such file or "
                     "directory)")
