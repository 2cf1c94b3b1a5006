"""The node links' rules (nodes/outcome.py): records, the root cause among several failures, the beats that say a
node is lost, and the --rdzv-conf keys that time them."""

from __future__ import annotations

import pytest

from ddpboot.errors import UsageError
from ddpboot.nodes.outcome import (
    FIRST_BEAT_GRACE,
    LOST_CODE,
    Beats,
    LinkTiming,
    NodeEnd,
    link_timing,
    lost_record,
    rank_failure,
    root_cause,
    stop_text,
    summary,
)


def test_a_record_survives_the_store() -> None:
    for record in (rank_failure(1, "hostB", 3, 3, "exit code 3", 100.5, "boom"),
                   NodeEnd(0, "", 0, "ended", 1.0), lost_record(2, "hostC", 1.6, 0, 5.0),
                   NodeEnd(1, "hostB", LOST_CODE, "its ddpboot launcher (pid 9) died", 2.0, last=True)):
        assert NodeEnd.decode(record.encode()) == record
    assert NodeEnd.decode('{"node": 1, "code": 3, "what": "x", "t": 1}').host == ""


def test_the_root_cause_is_the_earliest_failure() -> None:
    cause = rank_failure(1, "hostB", 3, 3, "exit code 3", 100.0)
    consequence = rank_failure(0, "hostA", 0, 1, "exit code 1", 100.02)  # its collective lost the peer
    assert root_cause([(1, consequence), (2, cause)]) == cause  # published later, but earlier
    assert root_cause([(2, cause), (1, NodeEnd(2, "c", 5, "x", 100.0))]).node == 2  # a tie: published first
    assert root_cause([]) is None


def test_what_the_other_nodes_say() -> None:
    cause = rank_failure(1, "hostB", 3, 3, "exit code 3", 100.0, "RuntimeError: boom")
    assert stop_text(cause, 1) == ("ddpboot: node 1 (hostB) failed: rank 3 exit code 3; stopping this node's rank "
                                   "(exit code 3, the root cause's)")
    assert "stopping this node's 4 ranks" in stop_text(cause, 4)
    assert summary(cause, 0).splitlines() == [
        "ddpboot: the job failed on node 1 (hostB): rank 3 exit code 3; this node (0) stopped its ranks, and exits "
        "with the root cause's code 3",
        "  last line of rank 3: RuntimeError: boom"]
    lost = lost_record(1, "hostB", 1.6, 0, 5.0)
    assert "no beat from its launcher for 1.6 s" in summary(lost, 2) and "(reported by node 0)" in summary(lost, 2)


def test_a_node_whose_beats_stop_is_lost() -> None:
    timing = LinkTiming(0.25, 6)
    beats = Beats([1, 2], timing, since=0.0)
    assert beats.observe({1: 1, 2: 1}, 0.25) == []
    t, count = 0.25, 1
    while t < 1.5:  # node 1 beats on, node 2 is silent from 0.25 s
        t += 0.25
        count += 1
        assert beats.observe({1: count, 2: 1}, t) == []
    lost = beats.observe({1: count + 1, 2: 1}, 1.75 + 0.25)
    assert lost == [(2, pytest.approx(1.75))]
    assert beats.watched() == [1]  # a lost node is not watched again
    assert beats.observe({1: count + 1}, 9.0) == beats.observe({1: count + 1}, 9.1) == []  # 3 readings at least
    assert beats.observe({1: count + 1}, 9.2) == [(1, pytest.approx(7.2))]  # silent since 2.0 s


def test_a_slow_store_is_not_a_lost_node() -> None:
    """A store that answers nobody for 3 s delays every reading: one late reading is not enough."""
    beats = Beats([1], LinkTiming(0.25, 6), since=0.0)
    beats.observe({1: 1}, 0.25)
    assert beats.observe({1: 1}, 3.25) == []  # one reading, 3 s later: node 1's beat was not served yet
    assert beats.observe({1: 2}, 3.5) == []


def test_a_node_that_never_beat_gets_a_grace() -> None:
    beats = Beats([1], LinkTiming(0.25, 6), since=0.0)
    for i in range(1, 10):
        assert beats.observe({1: 0}, i * 1.0) == []
    assert beats.observe({1: 0}, FIRST_BEAT_GRACE) == [(1, FIRST_BEAT_GRACE)]


def test_the_beat_is_set_with_torchs_keep_alive_keys() -> None:
    assert link_timing({}) == LinkTiming(0.25, 6)
    assert link_timing({"keep_alive_interval": "0.5", "keep_alive_max_attempt": "4"}).lost_after == 2.0
    for conf, message in (({"keep_alive_interval": "0"}, "keep_alive_interval=0: give the seconds"),
                          ({"keep_alive_interval": "soon"}, "keep_alive_interval=soon"),
                          ({"keep_alive_max_attempt": "0"}, "keep_alive_max_attempt=0: give how many beats")):
        with pytest.raises(UsageError, match=message):
            link_timing(conf)
