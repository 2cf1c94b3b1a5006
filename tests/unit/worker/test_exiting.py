"""The worker's exit path decides between destroying and aborting the process group from how the script leaves.
What it decides at a real interpreter exit (which imports torch) is tested in tests/process/test_worker_exiting.py."""

from __future__ import annotations

import builtins
import subprocess
import sys

import pytest

from ddpboot.worker.exiting import ExitRecorder, exit_status


@pytest.mark.parametrize(("code", "status"), [(None, 0), (0, 0), (3, 3), (True, 1), (False, 0), ("bye", 1)])
def test_exit_status_is_what_python_makes_of_systemexit(code: object, status: int) -> None:
    res = subprocess.run([sys.executable, "-c", f"raise SystemExit({code!r})"], capture_output=True, timeout=60)
    assert res.returncode == status == exit_status(code)


def test_the_recorder_notes_sys_exit_and_the_builtin_exit_codes_and_still_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "exit", sys.exit)
    monkeypatch.setattr(builtins, "exit", builtins.exit, raising=False)
    monkeypatch.setattr(builtins, "quit", builtins.quit, raising=False)
    recorder = ExitRecorder()
    recorder.install()
    recorder.install()  # twice: still one wrapper
    with pytest.raises(SystemExit) as raised:
        sys.exit(7)
    assert raised.value.code == 7 and recorder.code == 7
    with pytest.raises(SystemExit):
        builtins.exit(0)  # type: ignore[operator]
    assert recorder.code == 0
    with pytest.raises(SystemExit):
        builtins.quit("bye")  # type: ignore[operator]
    assert recorder.code == 1


def test_settle_threads_waits_until_a_busy_native_thread_is_done() -> None:
    """A thread busy outside the GIL (as gloo's are) keeps the exit path waiting until it is quiet."""
    import hashlib
    import threading

    from ddpboot.worker.exiting import settle_threads

    data = b"x" * (128 << 20)
    done = threading.Event()

    def work() -> None:
        for _ in range(3):
            hashlib.sha256(data).digest()  # releases the GIL while it hashes
        done.set()

    worker = threading.Thread(target=work)
    worker.start()
    assert settle_threads(timeout=60)
    assert done.is_set()
    worker.join()


def test_settle_threads_gives_up_at_its_timeout() -> None:
    import hashlib
    import threading
    import time

    from ddpboot.worker.exiting import settle_threads

    data = b"x" * (8 << 20)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            hashlib.sha256(data).digest()

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        start = time.monotonic()
        assert not settle_threads(timeout=0.3)
        assert time.monotonic() - start >= 0.3
    finally:
        stop.set()
        spinner.join()
