"""A rank looks like itself: its command line (what ps, top, htop, nvidia-smi and py-spy show) is short and names
the script, whether exec'd through the rank bootstrap or forked by the fast-start process; and the stack dump of a
rank that ignores SIGTERM shows the script's frames, judges a one-node job as one node, and names a file that is
said to go with the temporary run directory.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support import clean_env, ddpboot_exe, run_launcher

SHOW = """\
import os, sys
print("CMDLINE", os.environ["RANK"], open("/proc/self/cmdline", "rb").read().hex(), os.fstat(0).st_ino, flush=True)
"""

IGNORE_TERM = """\
import os, signal, sys, time
from pathlib import Path
if os.environ["RANK"] == "0":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ignoring SIGTERM", flush=True)
    Path("ignoring").touch()
    time.sleep(120)
while not Path("ignoring").exists():  # rank 0 must ignore SIGTERM before this rank's exit makes the launcher stop it
    time.sleep(0.01)
sys.exit(4)
"""


@pytest.mark.parametrize("start", [[], ["--fast-start"]])
def test_a_ranks_command_line_names_its_script_in_at_most_200_characters(start: list[str], tmp_path: Path) -> None:
    """... and every rank shares the launcher's stdin, as under torchrun (reference.md)."""
    (tmp_path / "show_me.py").write_text(SHOW)
    read, write = os.pipe()
    try:
        done = subprocess.run([*ddpboot_exe(), *start, "--cpu", "--nproc", "2", "show_me.py", "--lr", "3"],
                              env=clean_env(TMPDIR=str(tmp_path)), cwd=tmp_path, stdin=read, capture_output=True,
                              text=True, timeout=120)
        pipe = os.fstat(read).st_ino
    finally:
        os.close(read)
        os.close(write)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines() if "CMDLINE" in line]
    assert sorted(words[2] for words in lines) == ["0", "1"], done.stdout
    assert [int(words[4]) for words in lines] == [pipe, pipe]
    for words in lines:
        cmdline = bytes.fromhex(words[3])
        assert len(cmdline) <= 200, cmdline
        shown = cmdline.rstrip(b"\0").replace(b"\0", b" ").decode()
        assert shown.endswith(" show_me.py --lr 3") and "ddpboot rank bootstrap" not in shown, shown


def test_the_dump_of_a_rank_that_ignores_sigterm_shows_its_own_stack(tmp_path: Path) -> None:
    (tmp_path / "ignore_term.py").write_text(IGNORE_TERM)
    done = run_launcher(["--cpu", "--nproc", "2", "--shutdown-timeout", "2", "ignore_term.py"],
                        clean_env(TMPDIR=str(tmp_path)), cwd=tmp_path)
    err = done.stderr
    assert done.returncode == 4, err
    dump = err[err.index("ddpboot: stacks of every rank"):err.index("ddpboot: stacks: end")]
    assert "ignore_term.py" in dump and "pymain.py" not in dump and "(<string>:" not in dump, dump
    assert len(dump.splitlines()) < 20, dump
    verdict = next(line for line in dump.splitlines() if line.startswith("ddpboot: verdict: "))
    assert "other nodes" not in verdict and "rank 1 exited 4" in verdict, verdict
    named = next(line for line in dump.splitlines() if line.startswith("ddpboot: stacks in "))
    assert named.endswith("until ddpboot exits (its temporary run directory goes then; --log-dir DIR keeps it)")
    assert not Path(named.split()[3]).exists()  # as said: gone with the run directory
