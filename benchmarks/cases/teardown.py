"""teardown: a rank exits non-zero → how long until the launcher has exited.

Rank 1 exits 3 while rank 0 runs (scripts/fail.py; the time is taken from rank 1's own timestamp to the launcher's
exit, by bench_launch.run_failure). Two siblings: one that dies on SIGTERM (the launcher's reaction time) and one
that ignores SIGTERM (the grace before SIGKILL). Both launchers get `--shutdown-timeout 3`; torchrun 2.13 applies
its fixed 30 s failure-path grace anyway (FACTS §1), so its SIGTERM-ignoring runs are capped at 2 rounds. The exit
code each launcher returns is recorded too (ddpboot: the failing rank's 3; torchrun: 1).
"""

from __future__ import annotations

import bench_launch

from .common import (
    SCRIPTS,
    Bench,
    CaseResult,
    Command,
    alternate,
    ddpboot,
    job_env,
    log,
    ms,
    ratio,
    sec,
    stats,
    torchrun,
)

TORCHRUN_SLOW_PAIRS = 2  # each torchrun run with a SIGTERM-ignoring sibling costs 30+ s


def case_teardown(b: Bench) -> CaseResult:
    script = SCRIPTS / "fail.py"
    contenders: dict[str, Command] = {"ddpboot": lambda: ddpboot(2, "--cpu", "--shutdown-timeout", "3"),
                  "torchrun": lambda: torchrun(2, "--shutdown-timeout", "3")}
    rows, raw, notes = [], {}, []
    for ignore in (False, True):
        label = "sibling ignores SIGTERM" if ignore else "sibling exits on SIGTERM"
        env = job_env(BENCH_IGNORE_TERM="1" if ignore else "0")
        lat: dict[str, list[float]] = {n: [] for n in contenders}
        codes: dict[str, list[int]] = {n: [] for n in contenders}
        records = []
        for i, name in alternate(list(contenders), b.pairs):
            if ignore and name == "torchrun" and len(lat[name]) >= TORCHRUN_SLOW_PAIRS:
                continue
            cmd = contenders[name]()
            took, code = bench_launch.run_failure(cmd, script, env, b.tmp)
            lat[name].append(took)
            codes[name].append(code)
            records.append({"contender": name, "pair": i, "cmd": [*cmd, str(script)], "latency_s": took, "rc": code})
            log(f"  pair {i} {name} ({label}): {took:.3f} s, exit {code}")
        fmt = sec if ignore else ms
        rows.append([f"rank 1 exits 3, {label} → launcher exit", stats(lat["ddpboot"], fmt),
                     stats(lat["torchrun"], fmt), ratio(lat["ddpboot"], lat["torchrun"])])
        rows.append([f"  launcher exit code ({label})", "/".join(map(str, sorted(set(codes["ddpboot"])))),
                     "/".join(map(str, sorted(set(codes["torchrun"])))), ""])
        raw["ignores_sigterm" if ignore else "exits_on_sigterm"] = records
        if ignore and b.pairs > TORCHRUN_SLOW_PAIRS:
            notes.append(f"torchrun with a SIGTERM-ignoring sibling: {len(lat['torchrun'])} rounds only (each "
                         f"takes its fixed 30 s failure-path grace whatever --shutdown-timeout says); ddpboot: "
                         f"{len(lat['ddpboot'])}.")
    notes.append("Both launchers run with --shutdown-timeout 3; latency is from rank 1's own timestamp to the "
                 "launcher's exit.")
    return CaseResult("teardown", "Rank failure → launcher exit", ["measure", "ddpboot", "torchrun",
                      "ddpboot/torchrun"], rows, notes, raw)
