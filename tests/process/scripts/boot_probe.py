"""What a script can observe about how python started it, printed as one JSON line, then ended as the first
argument asks: `report` (and exit 0), `exit N`, `raise`, `interrupt`, `late` (an atexit handler and a non-daemon
thread outliving the main module). tests/process/test_bootstrap.py runs it with plain `python -u` and through the
launcher's rank bootstrap, and compares everything it prints and its exit status. Standard library only."""

import atexit
import json
import multiprocessing as mp
import os
import pickle
import signal
import sys
import threading
import time


class Point:
    """Defined in the script: pickled by reference to __main__.Point."""

    def __init__(self, x: int) -> None:
        self.x = x


def square(x: int) -> int:
    return x * x


def fail() -> None:
    raise ValueError("boom from the script")


def report() -> dict[str, object]:
    main = sys.modules["__main__"]
    loaded = sorted(k for k in sys.modules if k in ("__main__", "__mp_main__", "runpy", "importlib", "inspect"))
    cached = [k for k in sys.path_importer_cache if k.endswith(".py")]
    with mp.get_context("spawn").Pool(1) as pool:
        spawned = pool.map(square, [1, 2, 3])
    return {
        "argv": sys.argv,
        "orig_argv": sys.orig_argv[1:],
        "path0": sys.path[0],
        "file": __file__,
        "name": __name__,
        "main_is_this": main.__dict__ is globals(),
        "main_names": sorted(k for k in vars(main) if k.startswith("__")),
        "main_attrs": {k: repr(getattr(main, k, None)) for k in ("__package__", "__cached__", "__doc__")},
        "spec": [getattr(main.__spec__, "name", None), getattr(main.__spec__, "origin", None)],
        "loader": type(getattr(main, "__loader__", None)).__name__,
        "importer_cached": cached,
        "pickled": type(pickle.loads(pickle.dumps(Point(3)))).__qualname__,
        "pickle_module": Point.__module__,
        "spawn_pool": spawned,
        "excepthook_is_default": sys.excepthook is sys.__excepthook__,
        "handlers": {int(s): repr(signal.getsignal(s)) for s in signal.valid_signals()
                     if s not in (signal.SIGKILL, signal.SIGSTOP)},
        "flags": list(sys.flags),
        "loaded": loaded,
    }


def late() -> None:
    def worker() -> None:
        time.sleep(0.2)  # still running when the main module ends: the interpreter waits for it
        print("thread done", flush=True)

    def at_exit() -> None:
        print("atexit sees __file__" if "__file__" in globals() else "atexit: no __file__", flush=True)

    atexit.register(at_exit)
    threading.Thread(target=worker).start()


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "report":
        print(json.dumps(report()), flush=True)
    elif what == "exit":
        sys.exit(int(sys.argv[2]))
    elif what == "raise":
        fail()
    elif what == "interrupt":
        raise KeyboardInterrupt
    elif what == "late":
        late()
    elif what == "stacks":  # the bootstrap's faulthandler writes this thread's stack and the script goes on
        signo = int(os.environ["DDPBOOT_STACKS"].partition(":")[0])
        os.kill(os.getpid(), signo)
        print("still running", flush=True)
