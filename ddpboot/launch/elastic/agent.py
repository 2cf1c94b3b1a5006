"""The rendezvous agent: one small process per elastic launcher that holds torch's c10d rendezvous handler.

Why a process of its own: torch's DynamicRendezvousHandler imports torch and runs a keep-alive thread, and the
launcher must do neither (it forks workers, which is only safe without threads, and it never imports torch). The
launcher starts this module with `python -m ddpboot.launch.elastic.agent PARAMS_JSON` through spawn() (its own session,
SIGKILL when the launcher dies), with one end of a socketpair as its stdout; everything else goes to stderr.

The protocol: one JSON object per line. The agent first says `{"re": "start", "ready": true}` (or an error) once
the handler exists (the c10d store is hosted or reached). Then, per request of the launcher:

- `{"cmd": "next", "nproc": N, "host": H, "addr": A, "port": P}`: join the next round (torch's next_rendezvous).
  Every node then publishes its rank count in the round's store, and group rank 0 publishes A:P, the store it will
  serve for the round's workers. Answer: `{"re": "next", "round", "group_rank", "nnodes", "rank_offset",
  "world_size", "master_addr", "master_port", "nodes": [[nproc, host], ...]}`. Global ranks follow torchrun: each
  node's ranks start after those of the lower group ranks, so nodes may run different numbers of ranks.
- `{"cmd": "waiting"}`: `{"re": "waiting", "waiting": n, "closed": bool}`, the nodes waiting to join (torch's
  num_nodes_waiting) and whether the rendezvous is closed (another node's job ended for good).
- `{"cmd": "finish", "barrier_timeout": s}`: this node's workers succeeded. Wait (up to s) until every node of the
  round has said so (torchrun's exit barrier: the node hosting the c10d store must outlive the others' use of it),
  close the rendezvous so that late nodes do not start a new job, and answer `{"re": "finish", "ok": true}`.
- `{"cmd": "close"}`: close the rendezvous (the job failed for good here): other nodes stop instead of re-forming.
- `{"cmd": "quit"}` or end of file: exit without closing (a signalled launcher leaves the rendezvous as torchrun's
  agent does: the other nodes see its heartbeats stop).

Errors are answered as `{"re": CMD, "error": "...", "kind": "usage" | "connect" | "timeout" | "closed" |
"graceful" | "other"}`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

NODE_KEY = "ddpboot/node/"
MASTER_KEY = "ddpboot/master"
EXIT_KEY = "ddpboot/exit/"
CLOSED_KEY = "ddpboot/closed/"
AFTER_CLOSE_WAIT = 10.0  # seconds each node waits for the others to have closed before its store may vanish
WAITERS_GRACE = 3.0  # seconds nodes waiting outside the last round get to see that the rendezvous is closed


class Agent:
    def __init__(self, chan: socket.socket, params: dict[str, Any]) -> None:
        self.chan = chan
        self.params = params
        self.handler: Any = None
        self.store: Any = None  # the last round's store (a PrefixStore of the rendezvous store)
        self.group_rank = 0
        self.nnodes = 0

    def send(self, msg: dict[str, Any]) -> None:
        self.chan.sendall(json.dumps(msg).encode() + b"\n")

    def start(self) -> bool:
        try:
            from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry

            p = self.params
            rdzv = RendezvousParameters(
                backend="c10d", endpoint=p["endpoint"], run_id=p["run_id"], min_nodes=p["min_nodes"],
                max_nodes=p["max_nodes"], local_addr=p["local_addr"], **p["conf"],
            )
            self.handler = rendezvous_handler_registry.create_handler(rdzv)
        except (ValueError, TypeError) as exc:
            self.send({"re": "start", "error": _describe(exc), "kind": "usage"})
            return False
        except Exception as exc:
            self.send({"re": "start", "error": _describe(exc), "kind": "connect"})
            return False
        self.send({"re": "start", "ready": True})
        return True

    def next_round(self, req: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed.elastic.rendezvous import (
            RendezvousClosedError,
            RendezvousConnectionError,
            RendezvousGracefulExitError,
            RendezvousTimeoutError,
        )

        try:
            info = self.handler.next_rendezvous()
        except RendezvousGracefulExitError as exc:
            return {"error": _describe(exc), "kind": "graceful"}
        except RendezvousClosedError as exc:
            return {"error": _describe(exc), "kind": "closed"}
        except RendezvousTimeoutError as exc:
            return {"error": _describe(exc), "kind": "timeout"}
        except RendezvousConnectionError as exc:
            return {"error": _describe(exc), "kind": "connect"}
        store, rank, nnodes = info.store, int(info.rank), int(info.world_size)
        self.store, self.group_rank, self.nnodes = store, rank, nnodes
        store.set(f"{NODE_KEY}{rank}", json.dumps([int(req["nproc"]), str(req["host"])]))
        if rank == 0:
            store.set(MASTER_KEY, json.dumps([req["addr"], int(req["port"])]))
        nodes = [json.loads(store.get(f"{NODE_KEY}{r}")) for r in range(nnodes)]
        addr, port = json.loads(store.get(MASTER_KEY))
        return {
            "round": _round_number(self.handler),
            "group_rank": rank,
            "nnodes": nnodes,
            "rank_offset": sum(n for n, _ in nodes[:rank]),
            "world_size": sum(n for n, _ in nodes),
            "master_addr": addr,
            "master_port": port,
            "nodes": nodes,
        }

    def waiting(self, req: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed.elastic.rendezvous import RendezvousConnectionError

        try:
            return {"waiting": int(self.handler.num_nodes_waiting()), "closed": bool(self.handler.is_closed())}
        except RendezvousConnectionError as exc:  # the store is gone: its host's launcher stopped
            return {"error": _describe(exc), "kind": "connect"}

    def finish(self, req: dict[str, Any]) -> dict[str, Any]:
        store, n = self.store, self.nnodes
        if store is None:
            return {"ok": True}
        store.set(f"{EXIT_KEY}{self.group_rank}", "1")
        store.wait([f"{EXIT_KEY}{r}" for r in range(n)], timedelta(seconds=float(req.get("barrier_timeout", 300))))
        self.handler.shutdown()
        store.set(f"{CLOSED_KEY}{self.group_rank}", "1")
        store.wait([f"{CLOSED_KEY}{r}" for r in range(n)], timedelta(seconds=AFTER_CLOSE_WAIT))
        if _others_waiting(self.handler):
            # Nodes outside the round (beyond MAX, or late) poll the state about once a second: give them time to
            # see "closed" before the store (hosted by one of us) goes away, so that they stop instead of failing.
            time.sleep(WAITERS_GRACE)
        return {"ok": True}

    def close(self, req: dict[str, Any]) -> dict[str, Any]:
        self.handler.shutdown()
        return {"ok": True}

    def answer(self, req: dict[str, Any]) -> dict[str, Any]:
        """The answer to one request of the launcher (without its "re")."""
        handlers = {"next": self.next_round, "waiting": self.waiting, "finish": self.finish, "close": self.close}
        handler = handlers.get(str(req.get("cmd")))
        if handler is None:
            return {"error": f"unknown command {req.get('cmd')!r}", "kind": "other"}
        try:
            return handler(req)
        except Exception as exc:
            return {"error": _describe(exc), "kind": "other"}

    def serve(self) -> int:
        if not self.start():
            return 1
        for line in self.chan.makefile("rb"):
            req = json.loads(line)
            if req.get("cmd") == "quit":
                break
            self.send({"re": req.get("cmd"), **self.answer(req)})
        return 0


def _describe(exc: BaseException) -> str:
    """The exception and its causes in one line (torch wraps the interesting part: 'connection refused')."""
    parts: list[str] = []
    seen: BaseException | None = exc
    while seen is not None and len(parts) < 4:
        text = str(seen).strip().splitlines()[0] if str(seen).strip() else ""
        parts.append(f"{type(seen).__name__}: {text}" if text else type(seen).__name__)
        seen = seen.__cause__ or seen.__context__
    return " ← ".join(parts)


def _round_number(handler: Any) -> int | None:
    """torch's round counter (the same on every node); a private attribute, so best effort."""
    try:
        return int(handler._state_holder.state.round)
    except (AttributeError, TypeError, ValueError):
        return None


def _others_waiting(handler: Any) -> bool:
    """Whether nodes wait outside the round (torch's wait and redundancy lists; private, so best effort)."""
    try:
        handler._state_holder.sync()
        state = handler._state_holder.state
        return bool(state.wait_list or state.redundancy_list)
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv if argv is None else argv
    params = json.loads(argv[1])
    # The protocol runs over fd 1; stray prints (a library's) go to stderr instead of corrupting it.
    chan = socket.socket(fileno=os.dup(1))
    os.dup2(2, 1)
    # No second TCPStore server: ddpboot's launcher serves the workers' store itself (torch's shared store would
    # listen on every interface of group rank 0, unused).
    os.environ["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
    try:
        return Agent(chan, params).serve()
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the launcher is gone


if __name__ == "__main__":
    sys.exit(main())
