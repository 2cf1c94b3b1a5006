"""The signal policy: forward once, trust SLURM, never echo a worker's signal, stop on terminating signals."""

from __future__ import annotations

import signal

from ddpboot.launch.procs.signals import (
    REPEAT_WINDOW,
    ForwardPolicy,
    SignalInfo,
    keep_nohup,
    sender_name,
    signal_label,
)


def test_policy_forwards_once_and_trusts_slurm() -> None:
    p = ForwardPolicy()
    usr1 = SignalInfo(signal.SIGUSR1, 0, 4242)
    d = p.decide(usr1, 100.0, "bash")
    assert d.forward and not d.stop
    assert not p.decide(usr1, 100.0 + REPEAT_WINDOW / 2, "bash").forward  # a burst: once
    assert p.decide(usr1, 100.0 + REPEAT_WINDOW * 2, "bash").forward  # later: again
    d = p.decide(usr1, 200.0, "slurmstepd")
    assert not d.forward and "slurmstepd" in d.why
    d = p.decide(usr1, 300.0, "python", from_worker=True)
    assert not d.forward and not d.terminate_workers


def test_policy_stops_on_terminating_signals_and_kills_on_a_second_sigint() -> None:
    p = ForwardPolicy()
    d = p.decide(SignalInfo(signal.SIGINT, 0x80, 0), 1.0)
    assert d.forward and d.stop and not d.kill
    d = p.decide(SignalInfo(signal.SIGINT, 0x80, 0), 1.1)
    assert d.kill
    p = ForwardPolicy()
    d = p.decide(SignalInfo(signal.SIGTERM, 0, 7), 1.0, "slurmstepd")
    assert d.stop and not d.forward and not d.terminate_workers  # SLURM delivered it to the workers
    p = ForwardPolicy()
    d = p.decide(SignalInfo(signal.SIGTERM, 0, 7), 1.0, "python", from_worker=True)
    assert d.stop and not d.forward and d.terminate_workers  # nobody else will tell the other workers


def test_a_sigint_after_a_sigterm_is_not_a_second_sigint() -> None:
    p = ForwardPolicy()
    p.decide(SignalInfo(signal.SIGTERM, 0, 7), 1.0, "bash")
    d = p.decide(SignalInfo(signal.SIGINT, 0x80, 0), 5.0)
    assert d.stop and not d.kill


def test_labels_and_senders() -> None:
    assert signal_label(signal.SIGTERM) == "SIGTERM"
    assert signal_label(200) == "200"
    assert sender_name(0) is None
    assert sender_name(-1) is None


def test_a_launcher_started_under_nohup_keeps_hangups_away_from_the_job() -> None:
    default = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        assert keep_nohup(default) == (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
        assert keep_nohup(default) == default
    finally:
        signal.signal(signal.SIGHUP, before)
