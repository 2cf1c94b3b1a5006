"""The flight recorder's verdict (launch/observe/stacks/behind.py): the rank behind, by the collectives' sequence
numbers; collectives of one number that differ; every rank level; what cannot be compared."""

from __future__ import annotations

import json
from pathlib import Path

from ddpboot.launch.observe.stacks.behind import combined, finding, judge
from ddpboot.launch.observe.stacks.flight import PREFIX, Flight, RankTrace, from_json, merge, parse, to_json
from ddpboot.launch.observe.stacks.verdict import Verdict
from tests.unit.launch.observe.stacks.flight_dumps import dump, entry, write


def flight(*ranks: RankTrace, problems: tuple[str, ...] = ()) -> Flight:
    return Flight({t.rank: t for t in ranks}, problems)


def ranks_at(lasts: dict[int, int], world: list[int] | None = None, line: int = 0) -> Flight:
    """Every rank ran all_reduce 1..N (its N in `lasts`), its last one started, not completed."""
    world = world if world is not None else sorted(lasts)
    return flight(*(parse(r, dump([entry(i, i + 1, state="completed" if i + 1 < n else "started", line=line)
                                   for i in range(n)], {"0": ("default_pg", world)})) for r, n in lasts.items()))


def test_the_rank_whose_last_collective_is_behind_is_named_with_both_sequence_numbers() -> None:
    f = judge(ranks_at({0: 5, 1: 4, 2: 5}, line=9))
    assert f.kind == "behind" and f.look_at == (1,)
    assert f.text == ("rank 1 is behind in process group 0 (default_pg): its last collective is all_reduce #4 at "
                      "job.py:9 (not completed); ranks 0, 2 are at all_reduce #5 at job.py:9 (not completed); rank 1 "
                      "never called all_reduce #5: look at rank 1")


def test_the_lowest_ranks_are_behind_and_the_others_are_named_by_where_they_are() -> None:
    f = judge(ranks_at({0: 7, 1: 3, 2: 3, 3: 6}))
    assert f.look_at == (1, 2)
    assert "ranks 1, 2 are behind" in f.text and "their last collective is all_reduce #3" in f.text
    assert "rank 0 is at all_reduce #7 (not completed); rank 3 is at all_reduce #6" in f.text
    assert "ranks 1, 2 never called all_reduce #4" in f.text


def test_a_rank_that_called_no_collective_of_the_group_is_behind_when_its_buffer_is_whole() -> None:
    ahead = parse(0, dump([entry(0, 1, state="started")]))
    idle = parse(1, dump([]))
    f = judge(flight(ahead, idle))
    assert f.look_at == (1,) and "its last collective is none (it called none)" in f.text
    wrapped = parse(1, dump([entry(900, 1, pg="5", desc="undefined")], {"0": ("default_pg", [0, 1])}))
    assert judge(flight(ahead, wrapped)).kind != "behind"  # rank 1's early collectives may have been overwritten


def test_every_rank_at_the_same_collective_is_said_and_names_no_one() -> None:
    f = judge(ranks_at({0: 4, 1: 4}))
    assert f.kind == "level" and f.look_at == ()
    assert f.text == "all 2 ranks of process group 0 (default_pg) are at all_reduce #4: no rank is behind in it"


def test_collectives_of_one_number_that_differ_are_a_reorder_and_the_odd_rank_is_named() -> None:
    same = [entry(0, 1, line=3), entry(1, 2, line=4)]
    ranks = [parse(r, dump([*same, entry(2, 3, "broadcast" if r == 2 else "all_reduce", "started", line=8 + (r == 2))],
                           {"0": ("default_pg", [0, 1, 2])})) for r in (0, 1, 2)]
    f = judge(flight(*ranks))
    assert f.kind == "mismatch" and f.look_at == (2,)
    assert f.text == ("collective #3 of process group 0 (default_pg) differs between ranks: ranks 0, 1 called "
                      "all_reduce at job.py:8; rank 2 called broadcast at job.py:9 (a reordered or skipped "
                      "collective): look at rank 2")


def test_a_reorder_between_two_ranks_names_neither() -> None:
    ranks = [parse(r, dump([entry(0, 1), entry(1, 2, "broadcast" if r else "all_reduce", "started")])) for r in (0, 1)]
    f = judge(flight(*ranks))
    assert f.kind == "mismatch" and f.look_at == () and "rank 0 called all_reduce; rank 1 called broadcast" in f.text


def test_a_mismatch_comes_before_a_rank_behind_in_another_group() -> None:
    groups = {"0": ("default_pg", [0, 1]), "1": ("undefined", [0, 1])}
    r0 = parse(0, dump([entry(0, 1), entry(1, 1, "broadcast", pg="1", desc="undefined"),
                        entry(2, 2, pg="1", desc="undefined", state="started")], groups))
    r1 = parse(1, dump([entry(0, 1, "barrier"), entry(1, 1, "broadcast", pg="1", desc="undefined")], groups))
    f = judge(flight(r0, r1))
    assert f.kind == "mismatch" and f.text.startswith("collective #1 of process group 0 (default_pg) differs")
    assert "behind" not in f.text


def test_ranks_behind_in_several_groups_are_all_named() -> None:
    groups = {"0": ("default_pg", [0, 1, 2, 3]), "1": ("tp", [0, 1]), "2": ("tp", [2, 3])}
    def rank(r: int, n: int) -> RankTrace:
        pg = "1" if r < 2 else "2"
        return parse(r, dump([entry(0, 1), *(entry(i + 1, i + 1, pg=pg, desc="tp") for i in range(n))], groups))
    f = judge(flight(rank(0, 3), rank(1, 2), rank(2, 5), rank(3, 4)))
    assert f.kind == "behind" and f.look_at == (1, 3)
    assert "rank 1 is behind in process group 1 (tp)" in f.text and "rank 3 is behind in process group 2 (tp)" in f.text
    assert f.text.endswith(": look at ranks 1, 3")


def test_a_member_without_a_dump_is_named_missing_never_behind() -> None:
    f = judge(ranks_at({0: 5, 2: 4}, world=[0, 1, 2]))
    assert f.look_at == (2,) and f.text.endswith("(no dump from rank 1): look at rank 2")
    alone = judge(ranks_at({0: 5}, world=[0, 1]))
    assert alone.kind == "level" and alone.look_at == ()
    assert alone.text == ("the one rank of process group 0 (default_pg) is at all_reduce #5: no rank is behind in it "
                          "(no dump from rank 1)")


def test_gloo_records_no_members_and_the_ranks_that_recorded_the_group_are_compared() -> None:
    def rank(r: int, n: int) -> RankTrace:
        return parse(r, dump([entry(i, i + 1, "all_reduce", "scheduled", backend="gloo", retired=i + 1 < n)
                              for i in range(n)], {"": ("", [0, 1])}))
    f = judge(flight(rank(0, 4), rank(1, 3)))
    assert f.look_at == (1,) and "its last collective is all_reduce #3 (not completed)" in f.text


def test_unreadable_dumps_are_said_with_the_finding_and_alone() -> None:
    f = judge(flight(*ranks_at({0: 2, 1: 2}).ranks.values(), problems=(f"{PREFIX}2: empty",)))
    assert f.text.endswith(f"; unreadable: {PREFIX}2: empty") and f.kind == "level"
    none = judge(flight(problems=(f"{PREFIX}0: empty",)))
    assert none.kind == "none" and none.text == f"no dump could be read; unreadable: {PREFIX}0: empty"
    assert judge(flight(parse(0, dump([])))).text == "no collective recorded"


def test_finding_reads_the_attempt_directory(tmp_path: Path) -> None:
    assert finding(None) is None and finding(tmp_path) is None
    write(tmp_path, 0, dump([entry(0, 1), entry(1, 2, state="started")]))
    write(tmp_path, 1, dump([entry(0, 1)]))
    got = finding(tmp_path)
    assert got is not None and got.look_at == (1,)
    assert got.to_json() == {"verdict": got.text, "look_at": [1], "kind": "behind"}


def test_the_stacks_verdict_keeps_its_ranks_and_gets_the_dumps_after_it() -> None:
    f = judge(ranks_at({0: 2, 1: 1}))
    assert combined(Verdict("all 2 ranks wait in all_reduce", ()), f) == Verdict(
        f"all 2 ranks wait in all_reduce; flight recorder: {f.text}", (1,))
    assert combined(Verdict("x: look at rank 0", (0,)), f).look_at == (0,)


def test_another_nodes_dumps_travel_in_compact_form_and_are_judged_with_this_nodes() -> None:
    both = ranks_at({0: 5, 1: 4}, line=9)
    node0, node1 = flight(both.ranks[0]), flight(both.ranks[1], problems=("nccl_trace_rank_3: empty",))
    alone = judge(node0)
    assert alone.kind == "level" and alone.look_at == () and alone.text.endswith("(no dump from rank 1)")
    travelled = from_json(json.loads(json.dumps(to_json(node1))))
    assert travelled == node1
    together = judge(merge([node0, None, travelled]))
    assert together == judge(merge([node0, node1]))
    assert together.kind == "behind" and together.look_at == (1,) and "no dump from" not in together.text
    assert together.text.endswith("unreadable: nccl_trace_rank_3: empty: look at rank 1")
    assert merge([None, None]) is None


def test_the_compact_form_keeps_each_groups_last_collectives() -> None:
    trace = ranks_at({0: 40}).ranks[0]
    kept = from_json(to_json(flight(trace), keep=3)).ranks[0].groups["0"]
    assert [c.seq for c in kept.calls] == [38, 39, 40] and kept.last == trace.groups["0"].last
