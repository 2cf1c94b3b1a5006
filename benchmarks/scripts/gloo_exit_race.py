"""Force gloo's abort at interpreter exit ("terminate called without an active exception"), instead of waiting for it.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/scripts/gloo_exit_race.py [--mode M]

The abort: a gloo worker thread (ProcessGroupGloo::runLoop) destroys a finished collective's work object, and that
drops a Python reference: the one torch keeps on a tensor's PyObject while C++ holds the tensor too
(TensorImpl::decref_pyobject), or a SafePyObject in the ThreadLocalState the work captured. That takes the GIL
(gil_scoped_acquire). torch skips it once Py_IsInitialized() is 0, but a thread that passed that check and still
waits for the GIL when the main thread enters Py_FinalizeEx is ended by Python 3.11 (PyThread_exit_thread ->
pthread_exit); the forced unwind meets a noexcept destructor, so std::terminate -> abort.
Rank 1 holds that window open here:

1. rank 1 starts an all_reduce that nothing in Python keeps (the work and the tensor are dropped at once), tells
   rank 0 through torchrun's store that it is about to hold the GIL, and ends its script;
2. in its last exit hook, rank 1 keeps the GIL for `--hold` s (default 3: a busy loop, with `sys.setswitchinterval`
   raised so that a thread waiting for the GIL never asks for it). The hook is registered before torch is imported,
   so it runs after torch's own exit hooks, some of which release the GIL for a moment;
3. rank 0 joins the all_reduce `--delay` s after rank 1's message (default 1): gloo finishes it on rank 1, drops the
   work, passes the Py_IsInitialized() check and blocks in take_gil;
4. the hook returns and Py_FinalizeEx marks the runtime finalizing; then the GIL is released (module teardown
   deletes an object whose `__del__` sleeps): the gloo thread gets it and is ended there. Rank 1 dies of SIGABRT
   (torchrun exits 1 and names the signal).

Modes: `race` (default) does the above with `dist.all_reduce(tensor, async_op=True)`. `ddp` does it with the
collective that DDP's reducer issues in backward: rank 1's comm hook starts the bucket's all_reduce without waiting
for it, and the model is deleted and collected before the hold; what the work drops last is then the
contextvars.Context that backward stashes in thread-local state. `exit` is `race` with the hold at the end of main,
then os._exit(0) after flushing (the workaround): exit 0. `natural` is `race` without the hold (nor the switch
interval): the all_reduce completes while rank 1 exits, as it may in real jobs (`--delay 0` for the tightest timing).
`sync` forces nothing: both ranks run one synchronous all_reduce on a temporary tensor and exit normally.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import os
import sys
import time

HOLD: list[float] = []  # rank 1's hold, in seconds, once main() has set it


def hold_at_exit() -> None:
    if HOLD:
        _teardown.append(SlowTeardown(0.5))
        hold_gil(HOLD[0])


# Registered before torch is imported, so it runs after every exit hook of torch's (atexit runs them last-in,
# first-out): some of those release the GIL (an import that fails searches the disk), which would let the waiting
# thread through. From this hook's end to Py_FinalizeEx marking the runtime finalizing, nothing does.
atexit.register(hold_at_exit)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SIZE = 1 << 10


class SlowTeardown:
    """Releases the GIL for a while when module teardown deletes it (Py_FinalizeEx, the runtime finalizing)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __del__(self) -> None:
        time.sleep(self.seconds)


_teardown: list[SlowTeardown] = []  # a module global: emptied in module teardown


def hold_gil(seconds: float) -> None:
    """Keep the GIL: a busy loop never gives it up while no other thread asks for it (switch interval raised)."""
    sys.setswitchinterval(3600.0)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def rank0_joins(delay: float) -> None:
    """Rank 0 joins `delay` s after rank 1 says it is about to hold the GIL (however long rank 1 took to get there)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    store.wait(["gloo_exit_race/holding"])
    time.sleep(delay)


def plain_allreduce(rank: int, delay: float) -> None:
    if rank == 0:
        rank0_joins(delay)
        dist.all_reduce(torch.ones(SIZE))
    else:
        dist.all_reduce(torch.ones(SIZE), async_op=True)  # tensor and work dropped: gloo's queue holds the last refs


def unwaited_allreduce_hook(group, bucket):  # no annotations: DDP rejects the string ones of `from __future__`
    """A DDP comm hook that starts the bucket's all_reduce and returns without waiting for it."""
    buffer = bucket.buffer()
    dist.all_reduce(buffer, group=group, async_op=True)
    done = torch.futures.Future()
    done.set_result(buffer)
    return done


def ddp_step(rank: int, delay: float) -> None:
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(nn.Linear(SIZE, 1))
    if rank == 1:
        model.register_comm_hook(dist.group.WORLD, unwaited_allreduce_hook)
    if rank == 0:
        rank0_joins(delay)
    model(torch.ones(4, SIZE)).sum().backward()
    del model
    gc.collect()  # DDP's reference cycles too: the pending work keeps the last reference to what it captured


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["race", "ddp", "exit", "natural", "sync"], default="race")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds rank 0 waits before joining (default 1)")
    parser.add_argument("--hold", type=float, default=3.0, help="seconds rank 1 keeps the GIL (default 3)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if args.mode == "sync":  # nothing forced: a last synchronous all_reduce, then a normal exit
        dist.all_reduce(torch.ones(SIZE))
        print(f"rank {rank} done ({args.mode}, torch {torch.__version__})", flush=True)
        return
    if args.mode == "ddp":
        ddp_step(rank, args.delay)
    else:
        plain_allreduce(rank, args.delay)
    if rank == 0:
        time.sleep(0.5)  # rank 0's own gloo thread drops its work now, with the GIL free: only rank 1 is to abort
    print(f"rank {rank} done ({args.mode}, torch {torch.__version__})", flush=True)
    if rank == 1:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        store.set("gloo_exit_race/holding", "1")
        if args.mode == "exit":
            hold_gil(args.hold)
        elif args.mode != "natural":
            HOLD.append(args.hold)  # the hold runs in hold_at_exit(), the last exit hook
    if args.mode == "exit":
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
