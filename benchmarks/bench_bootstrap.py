"""The exec'd rank bootstrap's start-up cost: `python -u EMPTY` and the same empty script run through the bootstrap
(ddpboot/launch/bootstrap.py rank_command), alternately, wall time of each run from this process, the first round
dropped (`DDPBOOT_STACKS` set in both, as in a rank).

    python benchmarks/bench_bootstrap.py [--rounds N]

Whichever ddpboot `import ddpboot` finds is measured (PYTHONPATH=OTHER_CHECKOUT measures another).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddpboot.contract import RANK_STACKS_SIGNAL, STACKS_VAR, stacks_spec
from ddpboot.launch.bootstrap import BOOTSTRAP_VAR, rank_command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    a = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        empty = Path(tmp) / "empty.py"
        empty.write_text("")
        base = {**os.environ, STACKS_VAR: stacks_spec(RANK_STACKS_SIGNAL, str(Path(tmp) / "stacks"))}
        boot, carrier = rank_command(sys.executable, "script", str(empty), [])
        commands = {"python -u empty.py": ([sys.executable, "-u", str(empty)], base),
                    "bootstrap, empty.py": (boot, {**base, **carrier})}
        times: dict[str, list[float]] = {name: [] for name in commands}
        for i in range(a.rounds + 1):
            for name, (argv, env) in commands.items():
                t0 = time.perf_counter()
                subprocess.run(argv, env=env, check=True)
                if i:
                    times[name].append((time.perf_counter() - t0) * 1000)
    print(json.dumps({
        "ddpboot": str(Path(sys.modules["ddpboot"].__file__ or "").parent),
        "runs_ms": {name: {"median": round(statistics.median(v), 2), "min": round(min(v), 2),
                           "max": round(max(v), 2), "n": len(v)} for name, v in times.items()},
        "bootstrap_chars": len(carrier[BOOTSTRAP_VAR]),
    }, indent=2))


if __name__ == "__main__":
    main()
