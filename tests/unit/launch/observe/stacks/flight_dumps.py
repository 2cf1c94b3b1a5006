"""Flight recorder dumps as torch writes them, for the tests of flight.py and behind.py: one entry per collective
with the keys and values of torch/csrc/distributed/c10d/FlightRecorderDetail.hpp (`getCollectiveTrace`: the
pickle's dict; `dump_json`: the same keys, `process_group` a list, no time a 0, no empty `entries`), pickled with
protocol 2 as torch's pickler writes them (no class is named)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

from ddpboot.launch.observe.stacks.flight import PREFIX


def entry(record_id: int, seq: int, op: str = "all_reduce", state: str = "completed", *, pg: str = "0",
          desc: str = "default_pg", backend: str = "nccl", line: int = 0, retired: bool | None = None,
          p2p: bool = False) -> dict[str, Any]:
    """One collective: `line` puts the script's frame (job.py:LINE) under torch's two."""
    frames = [{"name": op, "filename": "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py",
               "line": 2800},
              {"name": "wrapper", "filename": "/venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
               "line": 83}]
    if line:
        frames.append({"name": "<module>", "filename": "/home/u/job.py", "line": line})
    started = 1_000 + seq if state in ("started", "completed") and backend == "nccl" else None
    return {
        "frames": frames, "record_id": record_id, "pg_id": int(pg) if pg.isdigit() else 1, "process_group": (pg, desc),
        "thread_name": "pt_main_thread", "thread_id": "140000", "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": seq if p2p else 0, "op_id": seq, "profiling_name": f"{backend}:{op}",
        "time_created_ns": 1_000_000 + record_id, "input_sizes": [[4]], "input_dtypes": ["Float"],
        "output_sizes": [[4]], "output_dtypes": ["Float"], "state": state, "time_discovered_started_ns": started,
        "time_discovered_completed_ns": 2_000 + seq if state == "completed" and backend == "nccl" else None,
        "retired": state == "completed" if retired is None else retired, "timeout_ms": 600000, "is_p2p": p2p,
    }


def dump(entries: list[dict[str, Any]], groups: dict[str, tuple[str, list[int]]] | None = None) -> dict[str, Any]:
    """A rank's dump; `groups`: process group name -> (desc, ranks) for pg_config (default: the default group of
    ranks 0 and 1)."""
    groups = {"0": ("default_pg", [0, 1])} if groups is None else groups
    config = {n: {"name": n, "desc": d, "ranks": str(r)} for n, (d, r) in groups.items()}
    return {"version": "2.10", "pg_config": config, "comm_lib_version": "2.27.5", "pg_status": {}, "entries": entries}


def as_json(d: dict[str, Any]) -> bytes:
    out = json.loads(json.dumps(d))
    for e in out.get("entries", []):
        e.pop("frames", None)
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            e[k] = e[k] or 0
    if not out.get("entries"):
        out.pop("entries", None)
    return json.dumps(out).encode()


def write(directory: Path, rank: int, d: dict[str, Any] | bytes) -> Path:
    path = directory / f"{PREFIX}{rank}"
    path.write_bytes(d if isinstance(d, bytes) else pickle.dumps(d, protocol=2))
    return path
