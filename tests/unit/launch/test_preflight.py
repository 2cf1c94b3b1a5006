"""Checks before anything starts (ddpboot/launch/preflight.py): the program exists and can run."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.preflight import (
    FDS_PER_RANK,
    LAUNCHER_FILES,
    MAX_LISTENERS,
    RANKS_PER_CORE,
    STORE_CONNECTIONS_PER_RANK,
    STORE_FILES,
    ListenQueue,
    check_python,
    check_rank_count,
    check_target,
    ensure_open_files,
    is_module_name,
    listen_queue,
    nproc_applies,
    open_files_needed,
    tasks_of,
)
from ddpboot.launch.spec import Target
from tests.support import as_uid

PY = sys.executable


def check(kind: str, name: str, cwd: Path, env: dict[str, str] | None = None) -> Target:
    return check_target(Target(kind, name), PY, env if env is not None else {"PATH": os.defpath}, cwd)  # type: ignore[arg-type]


def test_scripts(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("")
    (tmp_path / "other.py").write_text("")
    assert check("script", "train.py", tmp_path) == Target("script", "train.py")
    with pytest.raises(UsageError, match=r"the script 'tain.py' does not exist .* Python files there: other.py, "
                                         "train.py"):
        check("script", "tain.py", tmp_path)
    with pytest.raises(UsageError, match=r"the script 'nope.py' \(--run-path\) does not exist"):
        check("run_path", "nope.py", tmp_path)
    (tmp_path / "pkg").mkdir()
    with pytest.raises(UsageError, match=r"is a directory without __main__\.py"):
        check("script", "pkg", tmp_path)
    (tmp_path / "pkg" / "__main__.py").write_text("")
    assert check("script", "pkg", tmp_path).name == "pkg"


def test_modules(tmp_path: Path) -> None:
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("raise SystemExit('never imported by the check')")
    (tmp_path / "mypkg" / "train.py").write_text("")
    assert check("module", "mypkg.train", tmp_path).name == "mypkg.train"
    assert check("module", "json.tool", tmp_path).name == "json.tool"
    for name, message in (
        ("train.py", "that is a file name, not a module name"),
        ("my-pkg", "is not a module name"),
        ("nosuchmod", "no module named 'nosuchmod'"),
        ("mypkg.nope", "package 'mypkg' .* has no module 'nope'"),
        ("mypkg.train.deeper", "is a module, not a package"),
        ("mypkg", "is a package without __main__.py"),
    ):
        with pytest.raises(UsageError, match=message):
            check("module", name, tmp_path)


def test_binaries(tmp_path: Path) -> None:
    assert check("binary", "sh", tmp_path).name.endswith("/sh")  # found on PATH, made absolute
    (tmp_path / "tool").write_text("#!/bin/sh\n")
    with pytest.raises(UsageError, match="is not executable"):
        check("binary", "./tool", tmp_path)
    (tmp_path / "tool").chmod(0o755)
    assert check("binary", "./tool", tmp_path).name == str(tmp_path / "tool")
    with pytest.raises(UsageError, match="no program 'no-such-program-here' on PATH"):
        check("binary", "no-such-program-here", tmp_path)
    with pytest.raises(UsageError, match=r"--no-python \./gone: .*/gone does not exist"):
        check("binary", "./gone", tmp_path)
    with pytest.raises(UsageError, match=r"is a directory, not a program"):
        check("binary", str(tmp_path), tmp_path)
    (tmp_path / "bad.sh").write_text("#!/nonexistent/bin/bash\necho\n")
    (tmp_path / "bad.sh").chmod(0o755)
    with pytest.raises(UsageError, match=r"#! line that names /nonexistent/bin/bash, which does not exist"):
        check("binary", "./bad.sh", tmp_path)
    (tmp_path / "empty.sh").write_text("#!\necho\n")
    (tmp_path / "empty.sh").chmod(0o755)
    with pytest.raises(UsageError, match=r"#! line that names no interpreter"):
        check("binary", "./empty.sh", tmp_path)


def test_a_script_that_is_no_python_is_named_for_what_it_is(tmp_path: Path) -> None:
    for first, kind in (("#!/bin/bash", "a bash script"), ("#!/usr/bin/env -S bash -e", "a bash script"),
                        ("#!/bin/sh", "a sh script")):
        (tmp_path / "run.sh").write_text(f"{first}\necho hi\n")
        with pytest.raises(UsageError, match=rf"is {kind} \(#!.*\), not Python.*--no-python"):
            check("script", "run.sh", tmp_path)
    (tmp_path / "prog").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    with pytest.raises(UsageError, match="a compiled program \\(ELF\\)"):
        check("script", "prog", tmp_path)
    for first in ("#!/usr/bin/env python3", "#!/usr/bin/python", "import os"):
        (tmp_path / "train.py").write_text(f"{first}\n")
        check("script", "train.py", tmp_path)


def test_a_missing_script_says_what_the_name_is(tmp_path: Path) -> None:
    (tmp_path / "dangling.py").symlink_to(tmp_path / "missing.py")
    with pytest.raises(UsageError, match="symbolic link to a missing file"):
        check("script", "dangling.py", tmp_path)
    for i in range(10):
        (tmp_path / f"f{i}.py").write_text("")
    with pytest.raises(UsageError, match=r"Python files there: f0\.py, .*f7\.py, …\.") as info:
        check("script", "nope.py", tmp_path)
    assert "dangling.py" not in str(info.value)  # its target is missing: it is not a file there
    with pytest.raises(UsageError, match="'ls' is a program on PATH: run it with --no-python"):
        check("script", "ls", tmp_path)
    with pytest.raises(UsageError, match=r"'python3' is the Python interpreter.*drop 'python3'"):
        check("script", "python3", tmp_path)


def test_the_interpreter_is_checked_before_anything_starts(tmp_path: Path) -> None:
    assert check_python({}) == sys.executable
    assert check_python({"PYTHON_EXEC": "sh", "PATH": os.defpath}).endswith("/sh")
    with pytest.raises(UsageError, match="PYTHON_EXEC=/nonexistent/python: /nonexistent/python does not exist"):
        check_python({"PYTHON_EXEC": "/nonexistent/python"})
    with pytest.raises(UsageError, match="no program 'no-such-python' on PATH"):
        check_python({"PYTHON_EXEC": "no-such-python", "PATH": str(tmp_path)})
    with pytest.raises(UsageError, match="is a directory"):
        check_python({"PYTHON_EXEC": str(tmp_path)})


def test_module_names() -> None:
    assert is_module_name("pkg.train") and is_module_name("numpy")
    assert not is_module_name("pkg-train") and not is_module_name("pkg..train") and not is_module_name("")


def test_an_empty_script_name_is_named_as_empty(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"^the script name is empty"):
        check("script", "", tmp_path)


def test_rank_counts_that_cannot_work_are_refused_with_the_numbers() -> None:
    cores = len(os.sched_getaffinity(0))
    check_rank_count(RANKS_PER_CORE * cores, oversubscribe=False)
    with pytest.raises(UsageError, match=rf"on {cores} usable CPU core.*--oversubscribe"):
        check_rank_count(RANKS_PER_CORE * cores + 1, oversubscribe=False)
    check_rank_count(RANKS_PER_CORE * cores + 1, oversubscribe=True)


def test_the_file_limit_holds_even_oversubscribed(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    limits = {resource.RLIMIT_NPROC: (resource.RLIM_INFINITY, resource.RLIM_INFINITY),
              resource.RLIMIT_NOFILE: (1024, 1024)}
    monkeypatch.setattr(resource, "getrlimit", lambda which: limits[which])
    check_rank_count(500, oversubscribe=True)
    with pytest.raises(UsageError, match=r"RLIMIT_NOFILE\) is 1024 \(hard limit 1024\). Ask for at most 200 ranks"):
        ensure_open_files(300, 300)  # 300 × 5 + 24 = 1524 in the launcher


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: a child drops to uid 65534, where the limit applies")
def test_the_process_limit_counts_the_launchers_own_and_what_the_user_runs() -> None:
    """As an ordinary user (uid 65534, a real RLIMIT_NPROC of 3 in a forked child) 2 ranks and the launcher's
    guardian fit beside the child itself only when the limit holds 4; as root the kernel applies no limit and none
    is refused."""
    import resource

    def as_nobody() -> list[str]:
        resource.setrlimit(resource.RLIMIT_NPROC, (3, 3))
        said = [str(nproc_applies()), str(tasks_of(os.getuid()))]
        try:
            check_rank_count(2, oversubscribe=True)
        except UsageError as exc:
            said.append(str(exc))
        return said

    applies, running, message = as_uid(65534, as_nobody)
    assert applies == "True" and int(running) >= 1, (applies, running, message)
    assert message.startswith("--nproc 2: the job needs 3 processes (2 ranks and 1 of the launcher's: its "
                              "guardian)") and (
        f"besides the {running} you run now" in message and "(ulimit -u, RLIMIT_NPROC) is 3" in message)
    assert not nproc_applies() and tasks_of(os.getuid()) >= threading.active_count()
    soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
    resource.setrlimit(resource.RLIMIT_NPROC, (5, hard))
    try:
        check_rank_count(8, oversubscribe=True)  # root: the kernel would start them all
    finally:
        resource.setrlimit(resource.RLIMIT_NPROC, (soft, hard))


def test_open_files_needed_counts_the_launcher_or_the_store_whichever_holds_more() -> None:
    # one node: the launcher's pipes and logs per local rank outweigh the store's connections
    assert open_files_needed(8, 8) == 8 * FDS_PER_RANK + LAUNCHER_FILES == 64  # 8 ranks fit `ulimit -n 64`
    assert open_files_needed(1, 1) == 29
    # node 0 of 1,024 nodes × 8 ranks: the store holds 2 connections per rank of the job and one per node
    assert open_files_needed(8, 8192, 1024) == 8192 * STORE_CONNECTIONS_PER_RANK + 1024 + STORE_FILES == 17424
    # a node that does not serve the store counts only its own ranks
    assert open_files_needed(8, 0, 1024) == 8 * FDS_PER_RANK + LAUNCHER_FILES


def _limits(monkeypatch: pytest.MonkeyPatch, soft: int, hard: int) -> list[tuple[int, int]]:
    import resource

    state = {resource.RLIMIT_NPROC: (resource.RLIM_INFINITY, resource.RLIM_INFINITY),
             resource.RLIMIT_NOFILE: (soft, hard)}
    calls: list[tuple[int, int]] = []

    def setrlimit(which: int, value: tuple[int, int]) -> None:
        calls.append(value)
        state[which] = value

    monkeypatch.setattr(resource, "getrlimit", lambda which: state[which])
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    return calls


def test_a_low_soft_open_file_limit_is_raised_to_the_hard_limit_silently(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _limits(monkeypatch, 1024, 65536)
    ensure_open_files(8, 8192, 1024)  # needs 17,424
    assert calls == [(65536, 65536)]
    calls = _limits(monkeypatch, 1024, 65536)
    ensure_open_files(8, 0, 1024)  # needs 64: nothing to do
    assert calls == []


def test_a_hard_open_file_limit_below_the_stores_need_is_refused_with_what_to_raise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _limits(monkeypatch, 1024, 4096)
    with pytest.raises(UsageError) as caught:
        ensure_open_files(8, 8192, 1024)
    message = str(caught.value)
    assert message.startswith("--nproc 8 on 1024 nodes: this node's store serves all 8192 ranks and needs about "
                              "17424 open files")
    assert "is 1024 (hard limit 4096)" in message
    assert "Ask for at most 1528 ranks in all" in message  # (4096 - 16 - 1024) // 2
    for remedy in ("ulimit -Hn 17424", "LimitNOFILE=17424", "/etc/security/limits.conf"):
        assert remedy in message
    assert calls == []


def test_a_store_that_may_get_more_connections_than_one_listen_queue_holds_listens_on_enough_sockets(
    tmp_path: Path,
) -> None:
    somaxconn = tmp_path / "somaxconn"
    somaxconn.write_text("4096\n")
    assert listen_queue(4000, 96, "python", somaxconn) == ListenQueue(1)  # 4096 at once: one queue holds them
    assert listen_queue(4001, 96, "python", somaxconn) == ListenQueue(2)  # 4097 (x1.5 = 6145): two queues
    assert listen_queue(8192, 1024, "python", somaxconn) == ListenQueue(4)  # 9216 x1.5 = 13824: four
    assert listen_queue(16384, 1, "python", somaxconn) == ListenQueue(7)  # 16385 x1.5 = 24577: seven
    assert listen_queue(0, 2, "python", somaxconn) == ListenQueue(1)  # this node does not serve the store
    assert listen_queue(8192, 1024, "python", tmp_path / "missing") == ListenQueue(1)  # no cap to read


def test_a_listen_queue_that_cannot_hold_the_burst_names_the_sysctl_to_raise(tmp_path: Path) -> None:
    somaxconn = tmp_path / "somaxconn"
    somaxconn.write_text("4096\n")
    torch = listen_queue(8192, 1024, "torch", somaxconn)  # torch's server serves one socket
    assert torch.sockets == 1 and torch.note is not None
    assert "9216 connections at once" in torch.note and "one listening socket (--store torch" in torch.note
    assert "caps each queue at 4096" in torch.note and "sysctl -w net.core.somaxconn=13824" in torch.note
    huge = listen_queue(200_000, 1, "python", somaxconn)  # beyond MAX_LISTENERS sockets
    assert huge.sockets == MAX_LISTENERS and huge.note is not None
    assert f"its {MAX_LISTENERS} listening sockets" in huge.note
    assert f"sysctl -w net.core.somaxconn={-(-int(200_001 * 1.5) // MAX_LISTENERS)}" in huge.note
