"""The verdict of a stack dump (launch/observe/stacks/verdict.py): which rank to look at, from where each rank is."""

from __future__ import annotations

import json

import pytest

from ddpboot.contract import STACKS_END_LINE
from ddpboot.launch.observe.stacks.collect import CPU, RankStack, RankTarget
from ddpboot.launch.observe.stacks.dump import VERDICT_PREFIX, Dump, left_at
from ddpboot.launch.observe.stacks.flight import Flight
from ddpboot.launch.observe.stacks.flight import parse as parse_dump
from ddpboot.launch.observe.stacks.gather import NodeReport, decode, encode, key
from ddpboot.launch.observe.stacks.summary import Wait, classify, parse
from ddpboot.launch.observe.stacks.verdict import Left, Seen, judge, place, ranks_text
from tests.unit.launch.observe.stacks.flight_dumps import dump, entry
from tests.unit.launch.observe.stacks.samples import (
    FAULTHANDLER_DESTROY,
    FAULTHANDLER_ITEM,
    FAULTHANDLER_RECV,
    PYSPY_BARRIER,
    PYSPY_RENDEZVOUS,
    PYSPY_SLEEPING,
    PYSPY_SYNCHRONIZE,
)


def w(kind: str, what: str = "", at: str = "", function: str = "f", after: str = "") -> Wait:
    return Wait(kind, what, at, function, f"{what or kind} at {at}", after)


ALL_REDUCE = w("collective", "all_reduce", "train.py:88", "step")
LOADING = w("elsewhere", "", "data.py:40", "load")
BARRIER = w("barrier", "barrier", "train.py:95", "step")
DESTROY = w("destroy", "destroy_process_group", "train.py:120", "main")


def seen(*waits: Wait | None) -> list[Seen]:
    return [Seen(rank, wait) for rank, wait in enumerate(waits)]


@pytest.mark.parametrize(("ranks", "text"), [
    ([3], "rank 3"), ([1, 2, 3], "ranks 1-3"), ([4, 5], "ranks 4, 5"), ([7, 0, 2, 5, 6, 0], "ranks 0, 2, 5-7"),
    ([0, 1, 2, 3, 5], "ranks 0-3, 5"),
])
def test_ranks_are_written_as_ranges(ranks: list[int], text: str) -> None:
    assert ranks_text(ranks) == text


def test_places() -> None:
    assert place(ALL_REDUCE) == "all_reduce at train.py:88"
    assert place(LOADING) == "data.py:40 (in load)"
    assert place(w("gpu", "synchronize (waiting for the GPU)", "hang.py:11", after="all_reduce")) == (
        "synchronize (waiting for the GPU) after all_reduce at hang.py:11")
    assert place(w("collective", "all_reduce")) == "all_reduce"  # no frame of the script's
    assert place(w("elsewhere")) == "no Python frame"


def test_the_rank_outside_the_collective_is_named() -> None:
    v = judge(seen(LOADING, ALL_REDUCE, ALL_REDUCE, ALL_REDUCE))
    assert v.text == ("ranks 1-3 wait in all_reduce at train.py:88; rank 0 is in data.py:40 (in load), "
                      "not in a collective: look at rank 0")
    assert v.look_at == (0,)
    # with two ranks too: being in no collective is what singles a rank out, not a majority
    assert judge(seen(ALL_REDUCE, LOADING)).look_at == (1,)


def test_a_rank_in_another_collective_than_the_rest_is_named() -> None:
    v = judge(seen(ALL_REDUCE, BARRIER, ALL_REDUCE))
    assert v.text == ("ranks 0, 2 wait in all_reduce at train.py:88; rank 1 waits in barrier at train.py:95: "
                      "look at rank 1, not where its peers wait (a skipped or reordered collective)")
    assert v.look_at == (1,)
    # the same collective at another line (a rank a step behind or ahead) is another place
    other_line = w("collective", "all_reduce", "train.py:70", "warmup")
    assert judge(seen(ALL_REDUCE, ALL_REDUCE, other_line, ALL_REDUCE)).look_at == (2,)


def test_a_tie_names_no_one() -> None:
    v = judge(seen(ALL_REDUCE, BARRIER))
    assert v.look_at == ()
    assert v.text == ("rank 0 waits in all_reduce at train.py:88; rank 1 waits in barrier at train.py:95: the ranks "
                      "wait in different calls (one skipped or reordered a collective): compare their code paths")


def test_a_teardown_hang_names_the_rank_that_left() -> None:
    v = judge(seen(None, DESTROY, DESTROY, DESTROY)[1:], [Left(0, 0, "12:01:03", 60.4)])
    assert v.text == ("rank 0 exited 0 at 12:01:03; ranks 1-3 have waited in destroy_process_group at train.py:120 "
                      "for 60 s since then: a teardown hang: look at rank 0, which left while its peers wait for it")
    assert v.look_at == (0,)


def test_ranks_that_left_while_others_wait_in_a_collective() -> None:
    v = judge([Seen(0, ALL_REDUCE)], [Left(2, 1, "09:00:05", 3.0), Left(1, 0, "09:00:07", 1.2)])
    assert v.text == ("rank 1 exited 0 at 09:00:07; rank 2 exited 1 at 09:00:05; rank 0 has waited in all_reduce "
                      "at train.py:88 for 1 s since then: look at ranks 1, 2, which left while their peers wait for "
                      "them")
    assert v.look_at == (1, 2)
    mixed = judge([Seen(0, DESTROY), Seen(1, LOADING)], [Left(2, 0, "09:00:05", 3.0)])
    assert mixed.text.endswith("; rank 1 is in data.py:40 (in load)") and mixed.look_at == (2,)
    # ranks that exited while nobody waits in torch.distributed: not the cause of anything here
    assert judge([Seen(0, LOADING)], [Left(1, 0, "09:00:05", 3.0)]).look_at == ()


def test_a_rank_that_exited_is_one_of_the_job_not_one_on_another_node() -> None:
    """A one-node job of 2 ranks, rank 1 exited 4 and rank 0 (which ignores SIGTERM) is in a sleep: the verdict
    names both and says nothing of other nodes."""
    v = judge([Seen(0, LOADING)], [Left(1, 4, "09:00:05", 3.0)], world_size=2)
    assert v.text == ("rank 1 exited 4 at 09:00:05; rank 0 is in data.py:40 (in load), none in torch.distributed: "
                      "not a hang between ranks") and v.look_at == ()
    part = judge([Seen(0, LOADING)], [Left(1, 4, "09:00:05", 3.0)], world_size=4)
    assert part.text.endswith("rank 1 exited 4 at 09:00:05; rank 0 is in data.py:40 (in load) (the other 2 ranks "
                              "run on other nodes)"), part.text


def test_every_rank_in_the_same_collective() -> None:
    v = judge(seen(ALL_REDUCE, ALL_REDUCE, ALL_REDUCE, ALL_REDUCE), world_size=4)
    assert v.text == ("all 4 ranks wait in all_reduce at train.py:88, none elsewhere: likely a network or peer-node "
                      "problem")
    assert v.look_at == ()
    here = judge(seen(ALL_REDUCE, ALL_REDUCE), world_size=8)
    assert here.text == ("all 2 ranks of this node wait in all_reduce at train.py:88, none elsewhere: the other 6 "
                         "ranks run on other nodes: look there (ddpboot stacks on each)")
    recv = w("p2p", "recv", "hang_job.py:40", "deadlock")
    assert judge(seen(recv, recv)).text.startswith("all 2 ranks wait in recv at hang_job.py:40: every rank waits for")


def test_no_rank_in_torch_distributed() -> None:
    assert judge(seen(LOADING, LOADING)) == judge(seen(LOADING, LOADING, LOADING))
    assert judge(seen(LOADING, LOADING)).text == (
        "all ranks are in data.py:40 (in load), none in torch.distributed: not a hang between ranks (a slow or stuck "
        "step of the script)")
    other = w("elsewhere", "", "train.py:12", "save")
    v = judge(seen(LOADING, other))
    assert v.text == ("no rank waits in torch.distributed: rank 0 is in data.py:40 (in load); rank 1 is in "
                      "train.py:12 (in save)")
    assert v.look_at == ()


def test_ranks_without_a_stack() -> None:
    none = w("none")
    v = judge(seen(ALL_REDUCE, None, ALL_REDUCE, none))
    assert v.text == ("all 4 ranks wait in all_reduce at train.py:88, none elsewhere: likely a network or peer-node "
                      "problem; no stack for ranks 1, 3: look at ranks 1, 3")
    assert v.look_at == (1, 3)
    odd = judge(seen(ALL_REDUCE, LOADING, None))
    assert odd.text.endswith("look at rank 1 (no stack for rank 2)") and odd.look_at == (1,)
    unread = judge(seen(None, none))
    assert unread.text.startswith("no stack could be read (ranks 0, 1)") and unread.look_at == (0, 1)
    assert judge([]).text == "no rank is running"


def test_classify_gives_the_kind_the_verdict_groups_by() -> None:
    lines = {("/jobs/job.py", 10): "    dist.destroy_process_group()",
             ("/jobs/hang.py", 11): "    dist.all_reduce(t); torch.cuda.synchronize()"}
    source = lambda f, n: lines.get((f, n), "")  # noqa: E731
    got = {name: classify(parse(text), source) for name, text in [
        ("barrier", PYSPY_BARRIER), ("sleeping", PYSPY_SLEEPING), ("recv", FAULTHANDLER_RECV),
        ("destroy", FAULTHANDLER_DESTROY), ("store", PYSPY_RENDEZVOUS), ("sync", PYSPY_SYNCHRONIZE),
        ("item", FAULTHANDLER_ITEM), ("empty", "")]}
    assert {k: (v.kind, v.what, v.at) for k, v in got.items()} == {
        "barrier": ("barrier", "barrier", "hang_job.py:23"),
        "sleeping": ("elsewhere", "", "hang_job.py:18"),
        "recv": ("p2p", "recv", "hang_job.py:39"),
        "destroy": ("destroy", "destroy_process_group", "job.py:10"),
        "store": ("store", "init_process_group (waiting on the store)", "train.py:7"),
        "sync": ("gpu", "synchronize (waiting for the GPU)", "hang.py:11"),
        "item": ("elsewhere", "", "train.py:30"),
        "empty": ("none", "", ""),
    }
    assert got["sync"].after == "all_reduce" and got["sleeping"].function == "sleep_elsewhere"


def test_the_innermost_frame_of_the_script_is_where_a_rank_outside_torch_is() -> None:
    text = """Thread 9 (idle): "MainThread"
    wait (/usr/lib/python3.11/threading.py:320)
    get (/usr/lib/python3.11/queue.py:171)
    next_batch (/jobs/data.py:40)
    <module> (/jobs/train.py:5)
    <module> (<string>:80)
"""
    wait = classify(parse(text))
    assert (wait.kind, wait.at, wait.function) == ("elsewhere", "data.py:40", "next_batch")
    assert wait.text == "not in torch.distributed: wait at threading.py:320"  # the summary line, as before


def test_a_dump_ends_with_its_verdict_and_the_json_has_it() -> None:
    stacks = [RankStack(RankTarget(0, 100, CPU, None), PYSPY_BARRIER, "py-spy"),
              RankStack(RankTarget(1, 101, CPU, None), PYSPY_SLEEPING, "py-spy")]
    dump = Dump("SIGUSR2 from pid 1", stacks, 0.5, (left_at(2, 0, 5.0, now=1e9),), 3)
    lines = dump.text().splitlines()
    assert lines[-2] == VERDICT_PREFIX + ("rank 2 exited 0 at " + dump.left[0].at + "; rank 0 has waited in barrier "
                                          "at hang_job.py:23 for 5 s since then: look at rank 2, which left while its "
                                          "peers wait for it; rank 1 is in hang_job.py:18 (in sleep_elsewhere)")
    assert lines[-1].startswith(STACKS_END_LINE)
    data = json.loads(json.dumps(dump.to_json()))
    assert data["verdict"] == lines[-2].removeprefix(VERDICT_PREFIX) and data["look_at"] == [2]
    assert data["exited"] == [{"rank": 2, "code": 0, "at": dump.left[0].at}]
    assert [r["summary"] for r in data["ranks"]] == ["barrier, called from hang_job.py:23 in barrier",
                                                     "not in torch.distributed: sleep_elsewhere at hang_job.py:18"]


def test_over_several_nodes_the_node_of_the_rank_to_look_at_is_named() -> None:
    seen = [Seen(0, ALL_REDUCE, 0), Seen(1, ALL_REDUCE, 0), Seen(2, LOADING, 1), Seen(3, ALL_REDUCE, 1)]
    v = judge(seen, world_size=4)
    assert v.text == ("ranks 0, 1, 3 wait in all_reduce at train.py:88; rank 2 is in data.py:40 (in load), not in a "
                      "collective: look at rank 2; rank 2 runs on node 1")
    left = judge([Seen(0, DESTROY, 0)], [Left(1, 0, "12:00:00", 9.0, 1)], world_size=2)
    assert left.text.endswith("look at rank 1, which left while its peers wait for it; rank 1 runs on node 1")
    silent = judge([Seen(0, ALL_REDUCE, 0), Seen(1, ALL_REDUCE, 0)], world_size=4, silent=[1])
    assert silent.text == ("all 2 ranks of this node wait in all_reduce at train.py:88, none elsewhere: the other 2 "
                           "ranks run on other nodes: look there (ddpboot stacks on each); no answer from node 1 (run "
                           "ddpboot stacks there)")


def test_a_node_with_part_of_the_job_says_so() -> None:
    assert judge([Seen(1, LOADING)], world_size=2).text == (
        "no rank of this node waits in torch.distributed: rank 1 is in data.py:40 (in load) (the other rank runs "
        "on other nodes)")
    assert judge([Seen(1, ALL_REDUCE)], world_size=2).text.startswith(
        "the one rank of this node waits in all_reduce at train.py:88, none elsewhere")


def test_a_nodes_report_travels_through_the_store_whole() -> None:
    report = NodeReport(1, "node-b", (Seen(2, LOADING, 1), Seen(3, None, 1)), (Left(4, 1, "12:00:00", 3.5, 1),), 1e9)
    assert decode(encode(report)) == report
    assert key("job-7", 1) == "ddpboot/stacks/job-7/node1"


def fr_rank(rank: int, last: int) -> Flight:
    """One rank's flight recorder dump: all_reduce 1..last of a group of ranks 0 and 1, the last one started."""
    return Flight({rank: parse_dump(rank, dump([entry(i, i + 1, state="completed" if i + 1 < last else "started")
                                                for i in range(last)], {"0": ("default_pg", [0, 1])}))})


def test_node_0s_verdict_compares_its_flight_recorder_dumps_with_the_other_nodes() -> None:
    """Each rank dumps on its own node; node 1's report carries its dumps through the store to node 0."""
    report = NodeReport(1, "node-b", (Seen(1, ALL_REDUCE, 1),), (), 1e9, fr_rank(1, 3))
    assert decode(encode(report)) == report
    stacks = [RankStack(RankTarget(0, 100, CPU, None), PYSPY_BARRIER, "py-spy")]
    alone = Dump("SIGUSR2 from pid 1", stacks, 0.5, (), 2, node=0, flight=fr_rank(0, 4))
    assert alone.flight_finding() is not None and "(no dump from rank 1)" in alone.verdict().text
    whole = Dump("SIGUSR2 from pid 1", stacks, 0.5, (), 2, node=0, others=(decode(encode(report)),),
                 flight=fr_rank(0, 4))
    data = whole.to_json()
    assert data["flight"]["kind"] == "behind" and data["flight"]["look_at"] == [1]
    assert "; flight recorder: rank 1 is behind in process group 0 (default_pg)" in data["verdict"]
