"""What a rank inherits from whoever started the launch: cwd, umask, limits, priority, stdin, environment, CPUs,
signal dispositions.
Written to LAUNCH_TEST_OUT/probe<RANK>.json; the warm tests compare a warm launch's with an exec'd one's."""

import json
import os
import resource
import signal
import sys
from pathlib import Path

rank = os.environ["RANK"]
umask = os.umask(0)
os.umask(umask)
data = {
    "cwd": os.getcwd(),
    "umask": umask,
    "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
    "stack": list(resource.getrlimit(resource.RLIMIT_STACK)),
    "nice": os.getpriority(os.PRIO_PROCESS, 0),
    "stdin": sys.stdin.read() if rank == "0" else None,
    "probe_var": os.environ.get("WARM_PROBE_VAR"),
    "cpus": sorted(os.sched_getaffinity(0)),
    "argv": sys.argv,
    "path0": sys.path[0],
    "main_file": __file__,
    "stdout_tty": sys.stdout.isatty(),
    "pid": os.getpid(),
    "ppid": os.getppid(),
    # The signals the kernel says this process ignores, and what SIGINT does (KeyboardInterrupt, as python starts).
    "sigign": next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                   if line.startswith("SigIgn:")),
    "sigint": repr(signal.getsignal(signal.SIGINT)),
}
(Path(os.environ["LAUNCH_TEST_OUT"]) / f"probe{rank}.json").write_text(json.dumps(data))
print(f"rank {rank} probed", flush=True)
print(f"rank {rank} on stderr", file=sys.stderr, flush=True)
(Path(os.environ["LAUNCH_TEST_OUT"]) / f"said{rank}").touch()  # both lines are in the launcher's pipes
code = int(os.environ.get("WARM_PROBE_EXIT", "0"))
if code and rank == "0":  # fail only once every rank has probed and said its lines (fail-fast stops the others)
    import time

    while not (Path(os.environ["LAUNCH_TEST_OUT"]) / "said1").exists():
        time.sleep(0.01)
sys.exit(code if rank == "0" else 0)
