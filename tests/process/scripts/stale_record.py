"""Run as the first process of a new pid namespace (`unshare --pid --fork --mount-proc python stale_record.py DDPBOOT
BEHAVE OUT`): a launcher with --log-dir is killed with SIGKILL, leaving launcher.json and status.json behind; the
namespace's next pid is set to the launcher's (/proc/sys/kernel/ns_last_pid), so the next process, a bystander that
records every signal it gets, takes the dead launcher's pid. Then `ddpboot top --json RUN_DIR` and `ddpboot stacks
RUN_DIR` run on that record (the same record for both: top's clean-up is undone in between). What happened is
written to OUT/result.json: the pids, both commands' exit codes and stderr, whether the bystander still runs, the
signals it got, which files the run directory holds at each step."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ddpboot, behave, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
logs = out / "logs"
run_dir = logs / "stale"
env = {**os.environ, "LAUNCH_TEST_OUT": str(out)}
BYSTANDER = """
import os, signal, sys, time
from pathlib import Path
got = Path(sys.argv[1])
def note(sig, _frame):
    with got.open("a") as f:
        f.write(signal.Signals(sig).name + "\\n")
for sig in signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD}:
    signal.signal(sig, note)
got.with_name("bystander.ready").touch()
time.sleep(120)
"""


def others() -> list[int]:
    """The namespace's processes besides this one (reaping those that have exited: we are their init)."""
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    return [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]


def await_(cond, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


launcher = subprocess.Popen([ddpboot, "--cpu", "--nproc", "1", "--log-dir", str(logs), "--rdzv-id", "stale", behave,
                             "--hold", "*"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
await_(lambda: (out / "ready0").exists() and (run_dir / "status.json").exists(), "the rank and the status file")
os.kill(launcher.pid, signal.SIGKILL)
launcher.wait()
await_(lambda: not others(), "the guardian and the rank to end")
left = sorted(p.name for p in run_dir.iterdir() if p.suffix == ".json")
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(launcher.pid - 1))
bystander = subprocess.Popen([sys.executable, "-c", BYSTANDER, str(out / "bystander.signals")])
await_(lambda: (out / "bystander.ready").exists(), "the bystander's handlers")
saved = {name: (run_dir / name).read_text() for name in left}
top = subprocess.run([ddpboot, "top", "--json", str(run_dir)], env=env, capture_output=True, text=True, timeout=60)
after_top = sorted(p.name for p in run_dir.iterdir() if p.suffix == ".json")
for name, text in saved.items():
    (run_dir / name).write_text(text)
stacks = subprocess.run([ddpboot, "stacks", "--timeout", "5", str(run_dir)], env=env, capture_output=True, text=True,
                        timeout=60)
after_stacks = sorted(p.name for p in run_dir.iterdir() if p.suffix == ".json")
signals = (out / "bystander.signals").read_text().split() if (out / "bystander.signals").exists() else []
result = {"launcher": launcher.pid, "bystander": bystander.pid, "left": left, "alive": bystander.poll() is None,
          "signals": signals, "top": [top.returncode, top.stderr], "stacks": [stacks.returncode, stacks.stderr],
          "after_top": after_top, "after_stacks": after_stacks}
bystander.kill()
bystander.wait()
(out / "result.json").write_text(json.dumps(result))
shutil.rmtree(logs, ignore_errors=True)
