"""How a rank ends, by argument: `exit N`, `raise`, `interrupt`, `sigterm` (waits for SIGTERM, then exits 5 from its
handler), `late` (exit 0 after atexit and a non-daemon thread). Pure Python: starts in milliseconds under exec."""

import atexit
import os
import signal
import sys
import threading
import time

OUT = os.environ["FID_OUT"]
RANK = os.environ["RANK"]


def note(name: str, text: str) -> None:
    with open(os.path.join(OUT, f"{name}{RANK}"), "w") as f:
        f.write(text)


def fail() -> None:
    raise ValueError("boom from the script")


if __name__ == "__main__":
    what = sys.argv[1]
    print(f"rank {RANK} starts: {what}", flush=True)
    if what == "exit":
        sys.exit(int(sys.argv[2]))
    if what == "raise":
        fail()
    if what == "interrupt":
        raise KeyboardInterrupt
    if what == "sigterm":
        def on_term(signum: int, frame: object) -> None:
            print(f"rank {RANK} got signal {signum}", flush=True)
            sys.exit(5)

        signal.signal(signal.SIGTERM, on_term)
        note("ready", "1")
        while True:
            signal.pause()
    if what == "late":
        def worker() -> None:
            time.sleep(0.3)  # still running when the main module ends: the interpreter must wait for it
            note("thread", "done")

        def at_exit() -> None:
            note("atexit", "thread first" if os.path.exists(os.path.join(OUT, f"thread{RANK}")) else "atexit first")

        atexit.register(at_exit)
        threading.Thread(target=worker).start()
        print(f"rank {RANK} main module ends", flush=True)
