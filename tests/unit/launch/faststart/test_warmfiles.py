"""The warm process's files (ddpboot/launch/faststart/warmfiles.py): one name for each, from its socket's, for the
launcher's side and the warm process's alike; the stamp a file's change shows in; a connection's peer."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from ddpboot.launch.faststart.warmfiles import beside, clear_exit, exit_file, peer, read_exit, stamp, write_exit


def test_each_file_is_named_after_the_socket(tmp_path: Path) -> None:
    sock = tmp_path / "warm-node1.sock"
    assert exit_file(sock) == exit_file(str(sock)) == str(tmp_path / "warm-node1.exit")
    assert beside(sock, ".lock") == str(sock.with_suffix(".lock"))
    assert beside(str(sock), ".log") == str(sock.with_suffix(".log"))


def test_why_it_exited_is_read_back_until_cleared(tmp_path: Path) -> None:
    sock = tmp_path / "warm-node1.sock"
    assert read_exit(sock) is None  # never said
    write_exit(str(sock), 4107, "idle for 900 s")
    said = read_exit(sock)
    assert said is not None and (said["pid"], said["why"]) == (4107, "idle for 900 s")
    clear_exit(sock)
    clear_exit(sock)  # nothing left to clear: quietly nothing
    assert read_exit(sock) is None
    Path(exit_file(sock)).write_text("{half")
    assert read_exit(sock) is None  # cut short: as if it never said
    write_exit(tmp_path / "no-such-dir" / "warm.sock", 1, "x")  # nowhere to write: quietly nothing


def test_a_stamp_changes_with_the_file(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    assert stamp(str(f)) is None
    f.write_text("a = 1\n")
    first = stamp(str(f))
    assert first is not None and first == stamp(str(f)) and first[3] == os.stat(f).st_dev
    os.utime(f, ns=(0, 0))
    assert stamp(str(f)) != first
    replaced = tmp_path / "new.py"
    replaced.write_text("a = 1\n")
    os.utime(replaced, ns=(0, 0))
    before = stamp(str(f))
    os.replace(replaced, f)  # same time and size, another inode
    assert stamp(str(f)) != before


def test_the_peer_of_a_connection() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer(a) == (os.getpid(), os.getuid(), os.getgid())
