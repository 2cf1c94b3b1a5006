"""Reading NCCL's flight recorder dumps back (launch/observe/stacks/flight.py): torch's pickle and JSON, one rank's
collectives per process group, and every way a file can be unreadable, said per file, never raised. The dumps a real
torch writes are read in tests/process/test_flight_dumps.py."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from ddpboot.launch.observe.stacks.flight import MAX_BYTES, PREFIX, Call, dump_files, load, parse, read_dir
from tests.unit.launch.observe.stacks.flight_dumps import as_json, dump, entry, write


def test_a_rank_s_last_collective_and_last_completed_one_per_process_group(tmp_path: Path) -> None:
    write(tmp_path, 1, dump([entry(0, 1, line=10), entry(1, 2, "broadcast", line=11),
                             entry(2, 1, pg="3", desc="undefined"), entry(3, 3, state="started", line=12),
                             entry(4, 1, "send 1->0", p2p=True)],
                            {"0": ("default_pg", [0, 1]), "3": ("undefined", [1, 2])}))
    flight = read_dir(tmp_path)
    assert flight is not None and flight.problems == ()
    trace = flight.ranks[1]
    main = trace.groups["0"]
    assert main.last == Call(3, "all_reduce", "started", "job.py:12")
    assert main.last_completed == Call(2, "broadcast", "completed", "job.py:11")
    assert main.label() == "process group 0 (default_pg)"
    assert trace.groups["3"].label() == "process group 3" and trace.groups["3"].last == Call(1, "all_reduce",
                                                                                             "completed")
    assert set(trace.groups) == {"0", "3"}  # the send is point-to-point: not a collective of the group
    assert trace.members == {"0": (0, 1), "3": (1, 2)} and trace.whole and trace.version == "2.10"


def test_a_coalesced_group_counts_once_by_its_last_entry() -> None:
    trace = parse(0, dump([entry(0, 1), entry(1, 2, "allreduce_coalesced"), entry(2, 2, "coalesced")]))
    assert [c.op for c in trace.groups["0"].calls] == ["all_reduce", "coalesced"]


def test_a_wrapped_buffer_is_not_whole() -> None:
    assert not parse(0, dump([entry(1500, 700), entry(1501, 701)])).whole
    assert parse(0, dump([])).whole


def test_gloo_retires_a_collective_that_returned_and_never_marks_one_completed() -> None:
    done = entry(0, 1, "all_reduce", "scheduled", backend="gloo", retired=True)
    waiting = entry(1, 2, "all_reduce", "scheduled", backend="gloo", retired=False)
    calls = parse(0, dump([done, waiting])).groups["0"].calls
    assert [c.state for c in calls] == ["returned", "scheduled"]
    assert calls[0].text() == "all_reduce #1 (returned)" and calls[1].text() == "all_reduce #2 (not completed)"
    assert parse(0, dump([done])).groups["0"].last_completed is None and Call(1, "x", "completed", "a.py:3").text() == \
        "x #1 at a.py:3 (completed)"


def test_torch_s_json_dump_reads_as_its_pickle(tmp_path: Path) -> None:
    d = dump([entry(0, 1, line=5), entry(1, 2, state="scheduled")])
    write(tmp_path, 0, as_json(d))
    write(tmp_path, 1, d)
    flight = read_dir(tmp_path)
    assert flight is not None and flight.problems == ()
    json_calls, pickle_calls = flight.ranks[0].groups["0"].calls, flight.ranks[1].groups["0"].calls
    assert [(c.seq, c.op, c.state) for c in json_calls] == [(c.seq, c.op, c.state) for c in pickle_calls]
    assert parse(0, load(as_json(dump([])))).groups == {}  # torch's JSON leaves out an empty entries list


def test_no_dump_is_none_and_other_files_are_not_dumps(tmp_path: Path) -> None:
    assert read_dir(tmp_path) is None
    assert read_dir(tmp_path / "gone") is None
    (tmp_path / f"{PREFIX}x").write_text("?")
    (tmp_path / "rank0.log").write_text("?")
    assert dump_files(tmp_path) == {} and read_dir(tmp_path) is None


@pytest.mark.parametrize(("data", "says"), [
    (b"", "empty"),
    (pickle.dumps(dump([entry(0, 1)]), protocol=2)[:40], "cut short"),
    (b"\x80\x02garbage", "unreadable"),
    (b"{\"version\": ", "unreadable"),
    (pickle.dumps([1, 2], protocol=2), "not a flight recorder dump (a list"),
    (pickle.dumps({"entries": []}, protocol=2), "not a flight recorder dump (keys: entries)"),
    (pickle.dumps({"version": "9.0", "entries": [{"state": "completed"}]}, protocol=2), "another shape than torch 9.0"),
    (pickle.dumps({"version": "2.10", "entries": {}}, protocol=2), "not a flight recorder dump"),
    (pickle.dumps(Path("/x"), protocol=2), "refused pathlib"),
    (b"cos\nsystem\n(S'true'\ntR.", "refused os.system"),
])
def test_an_unreadable_dump_is_said_by_file_and_the_others_are_read(tmp_path: Path, data: bytes, says: str) -> None:
    write(tmp_path, 0, dump([entry(0, 1)]))
    write(tmp_path, 1, data)
    flight = read_dir(tmp_path)
    assert flight is not None and set(flight.ranks) == {0}
    assert len(flight.problems) == 1 and flight.problems[0].startswith(f"{PREFIX}1: ") and says in flight.problems[0]


def test_a_file_too_large_for_a_dump_is_not_read(tmp_path: Path) -> None:
    with (tmp_path / f"{PREFIX}0").open("wb") as f:
        f.truncate(MAX_BYTES + 1)
    flight = read_dir(tmp_path)
    assert flight is not None and "over 64 MiB" in flight.problems[0]


def test_a_dump_that_cannot_be_opened_is_said(tmp_path: Path) -> None:
    (tmp_path / f"{PREFIX}2").mkdir()
    flight = read_dir(tmp_path)
    assert flight is not None and flight.ranks == {} and flight.problems[0].startswith(f"{PREFIX}2: ")
