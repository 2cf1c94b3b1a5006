"""NCCL's flight recorder read back: which rank is behind, by the collectives' sequence numbers. Pure (it reads
files, nothing else).

With --log-dir every rank's torch records its last collectives (env.FLIGHT_RECORDER: a ring buffer of 2000) and,
when a collective times out (TORCH_NCCL_DUMP_ON_TIMEOUT=1), writes them to `<attempt dir>/nccl_trace_rank_<rank>`:
the rank whose watchdog saw the timeout dumps and puts `exception_dump` into the job's store; every other rank's
heartbeat monitor sees that key within a second and dumps too, before the first one aborts. The file is torch's
pickle (protocol 2) of a dict (torch/csrc/distributed/c10d/FlightRecorderDetail.hpp, `dump_dict`): `version`
("2.10" in torch 2.11 to 2.13), `pg_config` (process group name → {name, desc, ranks: "[0, 1]"}), `pg_status`, and
`entries`, oldest first, each with `record_id` (0 for the first the rank recorded), `process_group` (name, desc),
`collective_seq_id` (per process group, from 1), `p2p_seq_id`, `is_p2p`, `profiling_name` (`nccl:all_reduce`),
`state` (scheduled, started, completed), `retired`, `frames` (the Python stack at the call). `_dump_fr_trace_json`
gives the same keys as JSON, which is read too. Gloo records the same entries (`gloo:all_reduce`) but never marks
one started or completed: it retires it when it returned, whether it completed or failed (measured with torch 2.13:
a gloo all_reduce that timed out is retired, and counted in `pg_status` as completed), so it is only `returned`.

The judgement follows torch's own analysis (torch/distributed/flight_recorder, `torchfrtrace`): in each process
group, the collectives of one sequence number must be the same on every member; a member whose last collective has
a lower number than its peers' has not called the collective they wait in (it is behind); and ranks whose
collectives of one number differ (an all_reduce against a broadcast) called them in another order.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ddpboot.launch.observe.stacks.summary import Frame

PREFIX = "nccl_trace_rank_"  # env.FLIGHT_RECORDER's file name, the rank appended by torch
MAX_BYTES = 64 << 20  # a dump of 2000 entries with their stacks is a few MB; more is not one of torch's
_RANKS = re.compile(r"^\[\s*(\d+(?:\s*,\s*\d+)*)?\s*\]$")


class _NoGlobals(pickle.Unpickler):
    """torch's dump holds dicts, lists, tuples, strings, numbers, booleans and None only, all built by opcodes:
    any class or function it names is refused, so unpickling runs no code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: a flight recorder dump names no class")


@dataclass(frozen=True)
class Call:
    """One collective a rank entered."""

    seq: int  # collective_seq_id, within its process group
    op: str  # all_reduce (profiling_name without the backend)
    state: str  # completed, started or scheduled (NCCL); returned (gloo: completed or failed)
    at: str = ""  # the script's line that called it, `train.py:88` ("" when the dump has no stack)
    ms: float | None = None  # how long it ran on the GPU (duration_ms: NCCL with TORCH_NCCL_ENABLE_TIMING=1)

    def text(self) -> str:
        where = f" at {self.at}" if self.at else ""
        done = self.state if self.state in ("completed", "returned") else "not completed"
        return f"{self.op} #{self.seq}{where} ({done})"


@dataclass(frozen=True)
class Group:
    """One rank's collectives in one process group."""

    name: str  # the process group's name ("0" for the default group)
    desc: str  # default_pg, or what new_group(group_desc=...) said ("undefined")
    calls: tuple[Call, ...]  # by sequence number, one per number (the last entry of a coalesced group)

    @property
    def last(self) -> Call | None:
        return self.calls[-1] if self.calls else None

    @property
    def last_completed(self) -> Call | None:
        return next((c for c in reversed(self.calls) if c.state == "completed"), None)

    def label(self) -> str:
        return f"process group {self.name}" + (f" ({self.desc})" if self.desc not in ("", "undefined") else "")


@dataclass(frozen=True)
class RankTrace:
    rank: int
    version: str
    groups: Mapping[str, Group]
    members: Mapping[str, tuple[int, ...]]  # process group name -> its ranks (pg_config; gloo records none)
    whole: bool  # the buffer has every collective since the start (the first record_id is 0)


@dataclass(frozen=True)
class Flight:
    """An attempt directory's dumps: the ones read, and what could not be read, file by file."""

    ranks: Mapping[int, RankTrace]
    problems: tuple[str, ...] = ()


KEEP = 32  # collectives per process group and rank a node's summary carries to node 0 (gather.py)


def merge(flights: Iterable[Flight | None]) -> Flight | None:
    """The dumps of several nodes as one job's (each rank dumps on its own node); None when none has any."""
    got = [f for f in flights if f is not None]
    if not got:
        return None
    return Flight({r: t for f in got for r, t in f.ranks.items()}, tuple(p for f in got for p in f.problems))


def to_json(flight: Flight, keep: int = KEEP) -> dict[str, Any]:
    """A compact form for another node's verdict: each group's last `keep` collectives (an earlier difference
    between ranks is then not seen; the rank behind is, by the last sequence numbers)."""
    return {"problems": list(flight.problems),
            "ranks": [{"rank": t.rank, "version": t.version, "whole": t.whole,
                       "members": {n: list(m) for n, m in t.members.items()},
                       "groups": [{"name": g.name, "desc": g.desc,
                                   "calls": [[c.seq, c.op, c.state, c.at] for c in g.calls[-keep:]]}
                                  for g in t.groups.values()]} for t in flight.ranks.values()]}


def from_json(data: Mapping[str, Any]) -> Flight:
    """to_json's form read back; ValueError (or KeyError, TypeError) when it has another shape."""
    ranks: dict[int, RankTrace] = {}
    for t in data["ranks"]:
        groups = {str(g["name"]): Group(str(g["name"]), str(g["desc"]),
                                        tuple(Call(int(c[0]), str(c[1]), str(c[2]), str(c[3])) for c in g["calls"]))
                  for g in t["groups"]}
        members = {str(n): tuple(int(r) for r in m) for n, m in t["members"].items()}
        ranks[int(t["rank"])] = RankTrace(int(t["rank"]), str(t["version"]), groups, members, bool(t["whole"]))
    return Flight(ranks, tuple(str(p) for p in data["problems"]))


def dump_files(directory: Path) -> dict[int, Path]:
    """The dumps in `directory`, by rank (torch writes `PREFIX<rank>`)."""
    try:
        names = [p for p in directory.iterdir() if p.name.startswith(PREFIX)]
    except OSError:
        return {}
    return {int(p.name[len(PREFIX):]): p for p in names if p.name[len(PREFIX):].isdigit()}


def read_dir(directory: Path) -> Flight | None:
    """Every dump in the attempt directory; None when there is none. Only the run directory the launcher made
    (owner-only, 0700 unless --log-mode says otherwise) is read: its files are the job's own ranks', so the
    pickle is this user's data (and _NoGlobals refuses anything but plain containers all the same)."""
    files = dump_files(directory)
    if not files:
        return None
    ranks: dict[int, RankTrace] = {}
    problems: list[str] = []
    for rank, path in sorted(files.items()):
        try:
            ranks[rank] = parse(rank, load(_read(path)))
        except (OSError, ValueError) as exc:
            problems.append(f"{path.name}: {exc}")
    return Flight(ranks, tuple(problems))


def _read(path: Path) -> bytes:
    with path.open("rb") as f:
        data = f.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"over {MAX_BYTES >> 20} MiB, not a flight recorder dump")
    if not data:
        raise ValueError("empty (the rank was ended while it wrote its dump?)")
    return data


def load(data: bytes) -> dict[str, Any]:
    """A dump's dict, from torch's pickle or its JSON; ValueError saying why not."""
    try:
        got = json.loads(data) if data.lstrip()[:1] == b"{" else _NoGlobals(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"unreadable ({type(exc).__name__}: {exc}; cut short while it was written?)") from None
    except (AttributeError, IndexError, KeyError, TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(f"unreadable ({type(exc).__name__})") from None
    if not isinstance(got, dict):
        raise ValueError(f"not a flight recorder dump (a {type(got).__name__}, not a dict)")
    return got


def parse(rank: int, dump: Mapping[str, Any]) -> RankTrace:
    """One rank's dump; ValueError when it does not have the shape torch writes."""
    entries = dump.get("entries", [])  # torch's JSON leaves out an empty list
    if "version" not in dump or not isinstance(entries, list):
        raise ValueError(f"not a flight recorder dump (keys: {', '.join(sorted(map(str, dump))) or 'none'})")
    try:
        groups = _groups([e for e in entries if not e.get("is_p2p", False)])
        whole = not entries or int(entries[0]["record_id"]) == 0
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"an entry of another shape than torch {dump.get('version')}'s "
                         f"({type(exc).__name__}: {exc})") from None
    return RankTrace(rank, str(dump["version"]), groups, _members(dump.get("pg_config")), whole)


def _groups(entries: Iterable[Mapping[str, Any]]) -> dict[str, Group]:
    calls: dict[tuple[str, str], dict[int, Call]] = {}
    for e in entries:
        name, desc = e["process_group"]
        ms = e.get("duration_ms")
        call = Call(int(e["collective_seq_id"]), str(e["profiling_name"]).partition(":")[2] or
                    str(e["profiling_name"]), _state(e), _call_site(e.get("frames") or []),
                    float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None)
        calls.setdefault((str(name), str(desc)), {})[call.seq] = call  # a coalesced group: its last entry
    return {name: Group(name, desc, tuple(sorted(by.values(), key=lambda c: c.seq)))
            for (name, desc), by in calls.items()}


def _state(entry: Mapping[str, Any]) -> str:
    """NCCL marks a collective completed when its kernel has finished; gloo records no events and only retires a
    collective once it returned (completed or failed)."""
    state = str(entry["state"])
    if state == "scheduled" and entry.get("retired") and not entry.get("time_discovered_started_ns"):
        return "returned"
    return state


def _call_site(frames: Sequence[Mapping[str, Any]]) -> str:
    for f in frames:
        frame = Frame(str(f.get("name", "")), str(f.get("filename", "")), int(f.get("line", 0)))
        if frame.is_user:
            return frame.where()
    return ""


def _members(config: object) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    if not isinstance(config, Mapping):
        return out
    for name, pg in config.items():
        m = _RANKS.match(str(pg.get("ranks", "")).strip()) if isinstance(pg, Mapping) else None
        if m and m.group(1):
            out[str(name)] = tuple(int(r) for r in m.group(1).split(","))
    return out
