"""resources: what the launcher itself costs while a job runs: peak RSS and CPU time (user+sys).

The job (scripts/allreduce.py --hold S) inits, all-reduces, stays alive S seconds, all-reduces again and exits, so
the figures cover start-up, steady supervision and teardown. For ddpboot the launcher process and its guardian (the
process that serves the store and outlives a killed launcher) are reported separately and summed for the ratio;
torchrun is one process (its elastic agent, which imports torch). Workers are not counted. CPU time matters on small
machines, where every launcher cycle is taken from the ranks; RSS matters where memory is tight.
"""

from __future__ import annotations

from .common import (
    SCRIPTS,
    Bench,
    CaseResult,
    Command,
    Run,
    alternate,
    ddpboot,
    job_env,
    mib,
    ratio,
    run_logged,
    sec,
    stats,
    torchrun,
)


def case_resources(b: Bench) -> CaseResult:
    job = [str(SCRIPTS / "allreduce.py"), "--backend", "gloo", "--hold", str(b.hold_s)]
    contenders: dict[str, Command] = {"ddpboot": lambda: [*ddpboot(2, "--cpu"), *job],
                                      "torchrun": lambda: [*torchrun(2), *job]}
    runs: dict[str, list[Run]] = {n: [] for n in contenders}
    for i, name in alternate(list(contenders), b.pairs):
        runs[name].append(run_logged(name, contenders[name](), job_env(), i))
    d, t = runs["ddpboot"], runs["torchrun"]

    def cpu(rs: list[Run], guardian: bool = True) -> list[float]:
        return [(r.launcher_cpu_s or 0.0) + (r.guardian_cpu_s if guardian else 0.0) for r in rs]

    rows = [
        ["launcher peak RSS", stats([r.launcher_peak_rss for r in d], mib),
         stats([r.launcher_peak_rss for r in t], mib),
         ratio([r.launcher_peak_rss for r in d], [r.launcher_peak_rss for r in t])],
        ["guardian peak RSS", stats([r.guardian_peak_rss for r in d], mib), "(none)", ""],
        ["launcher + guardian peak RSS", stats([r.launcher_peak_rss + r.guardian_peak_rss for r in d], mib),
         stats([r.launcher_peak_rss for r in t], mib),
         ratio([r.launcher_peak_rss + r.guardian_peak_rss for r in d], [r.launcher_peak_rss for r in t])],
        ["launcher CPU time", stats(cpu(d, False), sec), stats(cpu(t), sec), ratio(cpu(d, False), cpu(t))],
        ["guardian CPU time", stats([r.guardian_cpu_s for r in d], sec), "(none)", ""],
        ["launcher + guardian CPU time", stats(cpu(d), sec), stats(cpu(t), sec), ratio(cpu(d), cpu(t))],
        ["job wall time", stats([r.wall_s for r in d], sec), stats([r.wall_s for r in t], sec),
         ratio([r.wall_s for r in d], [r.wall_s for r in t])],
    ]
    notes = [f"2 gloo ranks, job held {b.hold_s:g} s; {b.pairs} alternating pairs. RSS is VmHWM polled every 5 ms; "
             "the launcher's CPU time is read from the exited process before it is reaped (exact, workers "
             "excluded); the guardian's is sampled every 20 ms (a lower bound by at most one interval)."]
    return CaseResult("resources", "Launcher peak RSS and CPU time while a job runs",
                      ["measure", "ddpboot", "torchrun", "ddpboot/torchrun"], rows, notes,
                      {"runs": {n: [r.record() for r in rs] for n, rs in runs.items()}})
