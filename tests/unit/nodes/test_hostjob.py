"""One job on several hosts as the launching host sees it (ddpboot/nodes/hostjob.py): output, failures, signals
and the exit code, with a fake clock."""

from __future__ import annotations

import signal

from ddpboot.nodes.hostjob import LINK_GRACE, HostJob, Kill, Say, Send
from ddpboot.nodes.ssh import MARKER


def started(labels: tuple[str, ...] = ("n0", "n1", "n2")) -> HostJob:
    job = HostJob.of(labels, kill_after=45.0)
    for i in range(len(labels)):
        job.line(i, MARKER, stderr=True)
    return job


def test_a_hosts_lines_before_its_launcher_started_are_held_then_named_by_host() -> None:
    job = HostJob.of(["n0"], 45.0)
    assert job.line(0, "Warning: Permanently added 'n0' to the list of known hosts.", stderr=True) == []
    assert job.line(0, "from .bashrc", stderr=False) == ["from .bashrc"]
    assert job.line(0, MARKER, stderr=True) == ["n0: Warning: Permanently added 'n0' to the list of known hosts."]
    assert job.line(0, "ddpboot: rank 1 failed: exit code 3", stderr=True) == [
        "ddpboot: n0: rank 1 failed: exit code 3"]
    assert job.line(0, "ddpboot: error: --gpus 9: no GPU 9", stderr=True) == ["ddpboot: error: n0: --gpus 9: no GPU 9"]
    assert job.line(0, "[rank1]: Traceback (most recent call last):", stderr=True) == [
        "[rank1]: Traceback (most recent call last):"]
    assert job.line(0, "  last line of rank 1: boom", stderr=True) == ["  last line of rank 1: boom"]
    assert job.line(0, "[rank0]: step 1", stderr=False) == ["[rank0]: step 1"]


def test_a_host_that_never_started_ends_the_job_at_once_with_2() -> None:
    job = HostJob.of(["n0", "n1"], 45.0)
    job.line(0, MARKER, stderr=True)
    actions = job.exited(1, 255, now=10.0, why_not_started="ssh could not run ddpboot there (refused)")
    assert actions == [Say("ddpboot: error: n1 (node 1): ssh could not run ddpboot there (refused); nothing runs on "
                           "any host"), Send((0,), "TERM")]
    assert job.exited(0, 143, now=10.5) == [] and job.code == 2
    assert job.tick(10.0 + 44.0) == []


def test_a_host_that_refused_the_job_stops_the_others_now() -> None:
    job = started()
    job.line(2, "ddpboot: error: --gpus 9: this host has GPUs 0-3", stderr=True)
    assert job.exited(2, 2, now=5.0) == [Send((0, 1), "TERM")]
    assert job.hosts[2].error == "--gpus 9: this host has GPUs 0-3"
    assert job.exited(0, 143, 5.2) == [] and job.exited(1, 143, 5.3) == [] and job.code == 2


def test_a_failure_leaves_the_node_link_its_grace_then_sigterm_then_the_connections_end() -> None:
    job = started()
    assert job.exited(1, 3, now=100.0) == []
    assert job.deadline() == 100.0 + LINK_GRACE
    assert job.tick(100.0 + LINK_GRACE - 0.1) == []
    assert job.exited(2, 3, now=101.0) == []  # the node link stopped it, with the root cause's code
    assert job.tick(100.0 + LINK_GRACE) == [Send((0,), "TERM")]
    assert job.tick(100.0 + LINK_GRACE + 44.0) == []
    assert job.tick(100.0 + LINK_GRACE + 45.0) == [Kill((0,))]
    job.exited(0, 143, now=200.0)
    assert job.code == 3  # the first failure's


def test_every_host_ending_by_itself_is_the_jobs_code() -> None:
    job = started(("n0", "n1"))
    assert job.exited(1, 0, 1.0) == [] and job.exited(0, 0, 1.1) == [] and job.code == 0
    failed = started(("n0", "n1"))
    failed.exited(0, 7, 1.0)
    failed.exited(1, 7, 1.2)
    assert failed.code == 7 and failed.tick(1.0 + LINK_GRACE) == []  # nobody left to stop


def test_ctrl_c_reaches_every_host_and_a_second_one_too() -> None:
    job = started(("n0", "n1"))
    first = job.signalled(signal.SIGINT, 1.0)
    assert first == [Say("ddpboot: SIGINT: stopping the ranks of every host; a second Ctrl-C kills them"),
                     Send((0, 1), "INT")]
    job.exited(1, 130, 1.5)
    assert job.signalled(signal.SIGINT, 2.0) == [Say("ddpboot: SIGINT: stopping the ranks of every host now "
                                                     "(SIGKILL)"), Send((0,), "INT")]
    assert job.signalled(signal.SIGTERM, 2.1) == [Send((0,), "TERM")]
    assert job.tick(1.0 + 45.0) == [Kill((0,))]
    job.exited(0, 130, 47.0)
    assert job.code == 130


def test_hosts_that_end_after_an_interrupt_are_not_refusals() -> None:
    job = HostJob.of(["n0", "n1"], 45.0)  # neither launcher has said that it started
    job.signalled(signal.SIGINT, 1.0)
    assert job.exited(0, 130, 1.2, why_not_started="its launcher did not start") == []
    assert job.exited(1, 255, 1.3) == [] and job.code == 130
