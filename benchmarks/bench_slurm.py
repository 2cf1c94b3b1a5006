"""ddpboot against torchrun as the launcher of a 2-node and an 8-node SLURM job: `sbatch --wait` from submission
to return.

    .venv/bin/python benchmarks/bench_slurm.py [--nodes 2,8] [--pairs 5] [--steps 300] [--append FILE] [--out DIR]

Runs on ddpboot's local SLURM test cluster (scripts/ci/slurm-up: eight emulated nodes, n1 .. n8, on this machine);
starts it when none answers (as root) and stops it again at the end, only then. Each job is N nodes × 2 CPU ranks
(gloo), N from `--nodes`, training examples/train.py for `--steps` steps, one launcher per node:

    srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" ddpboot --nproc 2 --cpu examples/train.py ...
    srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" python -m torch.distributed.run --nnodes "$SLURM_NNODES" \\
        --node-rank "$SLURM_NODEID" --nproc-per-node 2 --master-addr FIRST_HOST --master-port PORT examples/train.py ...

(torchrun's static rendezvous with a port free at submission, started through `bash -c` so that each task reads its
own SLURM_NODEID; its workers see no GPU, CUDA_VISIBLE_DEVICES='', so train.py picks gloo on CPU as under
`ddpboot --cpu`.) Measured per run: wall time from just before `sbatch --wait`
to its return, and from timestamps the batch script writes: submission → script start, the srun step, script
start → end; SLURM's own RunTime where sacct or scontrol still knows the job (whole seconds; optional). A run counts
only when the job exited 0 and its output shows the 2N-rank world under the expected launcher, gloo, `final loss`
once and 2N identical parameter checksums; any other run is reported as failed, with the reason, and not timed.
Runs alternate (order rotated every pair) after one warm-up run each, node count by node count. Nothing is
asserted about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import bench_launch
from cases.common import DDPBOOT, PY, ROOT, TORCHRUN, alternate, free_port, job_env, log, ratio, sec, stats

sys.path.insert(0, str(ROOT))
from tests.slurm.helpers import CLUSTER_CONF, NODES, START_HINT, slurm  # after the line above: the checkout's path

NPROC = 2
CONTENDERS = ["ddpboot", "torchrun"]
STAMP = re.compile(r"^bench-slurm (\w+) ([\d.]+)$", re.M)
RATE = re.compile(r"step\s+\d+\s+loss\s+\S+\s+([\d,.]+) samples/s")


# --- the cluster ---------------------------------------------------------------------------------------------------
def cluster_state() -> str | None:
    """None when ddpboot's test cluster (nodes n1 .. n8) answers, else why not."""
    if shutil.which("sinfo") is None or shutil.which("sbatch") is None:
        return "the SLURM client tools (sinfo, sbatch) are not installed"
    try:
        ping = slurm("scontrol", "ping", timeout=20)
    except subprocess.TimeoutExpired:
        return "`scontrol ping` did not answer within 20 s"
    if ping.returncode != 0 or "UP" not in ping.stdout:
        return "no SLURM controller answers `scontrol ping`"
    nodes = slurm("sinfo", "-h", "-N", "-o", "%N", timeout=20)
    if sorted(set(nodes.stdout.split())) != NODES:
        raise SystemExit(f"the SLURM cluster here is not ddpboot's test cluster (nodes {' '.join(NODES)}): "
                         f"{nodes.stdout.split()}; {START_HINT} (it restarts an older one)")
    return None


def ensure_cluster() -> bool:
    """Make sure the test cluster is up; True when this run started it (and must stop it)."""
    why = cluster_state()
    if why is None:
        log("SLURM test cluster already up: using it (it stays up afterwards)")
        return False
    if os.geteuid() != 0:
        raise SystemExit(f"{why}; {START_HINT} (or run this benchmark as root, which starts and stops it)")
    log(f"{why}: starting the test cluster (scripts/ci/slurm-up)")
    up = subprocess.run([str(ROOT / "scripts" / "ci" / "slurm-up")], stdout=sys.stderr, stderr=sys.stderr)
    if up.returncode != 0:
        raise SystemExit(f"scripts/ci/slurm-up failed (exit {up.returncode})")
    why = cluster_state()
    if why is not None:
        stop_cluster()
        raise SystemExit(f"the cluster was started but does not answer: {why}")
    return True


def stop_cluster() -> None:
    log("stopping the test cluster this run started (scripts/ci/slurm-down)")
    down = subprocess.run([str(ROOT / "scripts" / "ci" / "slurm-down")], stdout=sys.stderr, stderr=sys.stderr)
    if down.returncode != 0:
        log(f"warning: scripts/ci/slurm-down exited {down.returncode}")


def slurm_version() -> str:
    out = slurm("sbatch", "--version", timeout=20).stdout.strip()
    return out or "SLURM (version unknown)"


# --- one job -------------------------------------------------------------------------------------------------------
def train_args(steps: int) -> list[str]:
    return [str(ROOT / "examples" / "train.py"), "--steps", str(steps), "--log-every", str(max(steps // 3, 1))]


def step_lines(contender: str, steps: int, port: int) -> tuple[str, str]:
    """(set-up lines, the srun line) of the batch script. torchrun's node rank must be read by each task
    (SLURM_NODEID differs per node), hence `bash -c` around it; its master address, the first host of the job's node
    list, is looked up before the step."""
    q = shlex.join
    srun = 'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES"'
    if contender == "ddpboot":
        return "", f"{srun} {q([*DDPBOOT, '--nproc', str(NPROC), '--cpu', *train_args(steps)])}"
    inner = (f'exec {q(TORCHRUN)} --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --nproc-per-node {NPROC} '
             f'--master-addr "$MASTER" --master-port {port} {q(train_args(steps))}')
    setup = ('MASTER=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
             "export MASTER CUDA_VISIBLE_DEVICES=\n")
    return setup, f"{srun} bash -c {shlex.quote(inner)}"


def batch_script(contender: str, nodes: int, steps: int, port: int, name: str, out: Path) -> str:
    """`nodes` nodes, one task per node; OMP_NUM_THREADS=1 for both launchers (what each sets by itself here anyway, and
    what the SLURM tests use); timestamps around the srun line for the in-job times."""
    setup, srun_line = step_lines(contender, steps, port)
    return (
        "#!/bin/bash\n"
        f"#SBATCH -N{nodes} --ntasks-per-node=1 -t 10 -J {name} -o {out}\n"
        'echo "bench-slurm script_start $EPOCHREALTIME"\n'
        "export OMP_NUM_THREADS=1\n"
        f"{setup}"
        'echo "bench-slurm step_start $EPOCHREALTIME"\n'
        f"{srun_line}\n"
        "rc=$?\n"
        'echo "bench-slurm step_end $EPOCHREALTIME"\n'
        "exit $rc\n"
    )


@dataclass
class SlurmRun:
    """One job, as kept in the raw JSON."""

    contender: str
    nodes: int
    pair: int  # -1: warm-up
    job_name: str
    job_id: str = ""
    port: int | None = None
    wall_s: float = 0.0  # just before `sbatch --wait` → its return
    rc: int | None = None  # sbatch --wait's exit code (the job's); None: timed out
    ok: bool = False
    why: str = ""  # what failed, when not ok
    submit_to_script_s: float | None = None
    script_s: float | None = None  # batch script start → its last line
    step_s: float | None = None  # the srun line
    slurm_runtime_s: float | None = None
    slurm_runtime_from: str = ""
    final_loss: str | None = None
    samples_per_s: float | None = None  # rank 0's last cumulative samples/s line of train.py
    script: str = ""
    sbatch_stderr: str = ""
    output: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def record(self, keep_output: int = 6000) -> dict[str, Any]:
        d = asdict(self)
        d["output"] = self.output[-keep_output:]
        return d


def check_output(text: str, contender: str, world: int) -> tuple[str | None, str | None]:
    """(why the job of `world` ranks did not train as expected or None, the final loss)."""
    final = re.findall(r"final loss (\S+)", text)
    sums: dict[int, str] = {int(r): c for r, c in re.findall(r"rank (\d+) param checksum (\S+)", text)}
    if f"world size {world} ({contender})" not in text:
        return f"no 'world size {world} ({contender})' line", None
    if "backend gloo" not in text:
        return "the ranks did not use gloo", None
    if len(final) != 1:
        return f"'final loss' printed {len(final)} times, not once", None
    if sorted(sums) != list(range(world)):
        return f"parameter checksums from ranks {sorted(sums)}, not 0..{world - 1}", final[0]
    if len(set(sums.values())) != 1:
        return f"the ranks' parameter checksums differ: {sums}", final[0]
    return None, final[0]


def hms(text: str) -> float | None:
    """SLURM's [D-]HH:MM:SS (or MM:SS) as seconds."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?", text.strip())
    if not m:
        return None
    d, h, mi, s = (int(x) if x else 0 for x in m.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def slurm_runtime(job_id: str) -> tuple[float | None, str]:
    """The job's elapsed time as SLURM reports it (whole seconds): sacct where there is accounting, else scontrol
    while the controller still holds the finished job (MinJobAge). (None, '') when neither knows it."""
    try:
        acct = slurm("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "Elapsed", timeout=15)
        if acct.returncode == 0 and (t := hms(acct.stdout.strip().split("\n")[0] if acct.stdout.strip() else "")):
            return t, "sacct"
        show = slurm("scontrol", "show", "job", "-o", job_id, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None, ""
    m = re.search(r"\bRunTime=(\S+)", show.stdout)
    if show.returncode == 0 and m and (t := hms(m[1])) is not None:
        return t, "scontrol"
    return None, ""


def run_job(contender: str, nodes: int, pair: int, steps: int, env: dict[str, str], work: Path,
            timeout: float) -> SlurmRun:
    name = f"ddpboot-bench-{contender}-{nodes}n-{uuid.uuid4().hex[:8]}"
    d = work / name
    d.mkdir()
    port = free_port() if contender == "torchrun" else None
    out = d / "out.txt"
    script = d / "job.sh"
    script.write_text(batch_script(contender, nodes, steps, port or 0, name, out))
    r = SlurmRun(contender, nodes, pair, name, port=port, script=script.read_text())
    submitted = time.time()
    start = time.monotonic()
    proc = subprocess.Popen(["sbatch", "--wait", "--parsable", str(script)], env=env, cwd=d, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        r.wall_s = time.monotonic() - start
        r.rc = proc.returncode
    except subprocess.TimeoutExpired:
        r.wall_s = time.monotonic() - start
        proc.kill()
        stdout, stderr = proc.communicate()
        slurm("scancel", "-n", name, timeout=30)
    finally:
        if proc.poll() is None:  # interrupted: leave no job behind
            proc.kill()
            slurm("scancel", "-n", name, timeout=30)
    r.job_id = stdout.strip().split(";")[0]
    r.sbatch_stderr = stderr[-2000:]
    r.output = out.read_text(errors="replace") if out.exists() else ""
    stamps = {k: float(v) for k, v in STAMP.findall(r.output)}
    if "script_start" in stamps:
        r.submit_to_script_s = stamps["script_start"] - submitted
        if "step_end" in stamps:
            r.script_s = stamps["step_end"] - stamps["script_start"]
    if "step_start" in stamps and "step_end" in stamps:
        r.step_s = stamps["step_end"] - stamps["step_start"]
    if r.job_id:
        r.slurm_runtime_s, r.slurm_runtime_from = slurm_runtime(r.job_id)
    why, r.final_loss = check_output(r.output, contender, nodes * NPROC)
    rates = RATE.findall(r.output)
    r.samples_per_s = float(rates[-1].replace(",", "")) if rates else None
    if r.rc is None:
        r.why = f"timed out after {timeout:.0f} s (job cancelled)"
    elif r.rc != 0:
        r.why = f"sbatch --wait exited {r.rc}" + (f" ({why})" if why else "")
    elif why:
        r.why = why
    r.ok = not r.why
    what = "warm-up" if pair < 0 else f"pair {pair}"
    status = "ok" if r.ok else f"FAILED: {r.why}"
    step = f", step {r.step_s:.2f} s" if r.step_s is not None else ""
    log(f"  {nodes} nodes, {what} {contender}: job {r.job_id or '?'}, sbatch → return {r.wall_s:.2f} s{step}, "
        f"exit {r.rc}, {status}")
    if not r.ok:
        log("    output tail:\n" + "\n".join("    " + ln for ln in (r.output + r.sbatch_stderr)[-1500:].splitlines()))
    return r


# --- report --------------------------------------------------------------------------------------------------------
def table(runs: list[SlurmRun], a: argparse.Namespace, cluster: str, started: bool, total_s: float) -> str:
    """One results section per node count."""
    return "\n".join(node_table([r for r in runs if r.nodes == n], n, a, cluster, started, total_s)
                     for n in a.nodes)


def node_table(runs: list[SlurmRun], nodes: int, a: argparse.Namespace, cluster: str, started: bool,
               total_s: float) -> str:
    world = nodes * NPROC
    counted = {n: [r for r in runs if r.contender == n and r.pair >= 0 and r.ok] for n in CONTENDERS}
    failed = [r for r in runs if not r.ok]

    def num(x: float) -> str:
        return f"{x:,.0f}"

    def row(label: str, attr: str, fmt: Callable[[float], str] = sec) -> str:
        xs = {n: [getattr(r, attr) for r in counted[n] if getattr(r, attr) is not None] for n in CONTENDERS}
        return f"| {label} | {stats(xs['ddpboot'], fmt)} | {stats(xs['torchrun'], fmt)} | " \
               f"{ratio(xs['ddpboot'], xs['torchrun'])} |"

    cmd = ["python", "benchmarks/bench_slurm.py", "--nodes", ",".join(map(str, a.nodes)), "--pairs", str(a.pairs),
           "--steps", str(a.steps)]
    if a.out:
        cmd += ["--out", "DIR"]
    lines = [
        f"## {nodes}-node SLURM job, sbatch → exit (benchmarks/bench_slurm.py, {time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"Machine: {bench_launch.machine()}. Cluster: {cluster}, ddpboot's local test cluster (scripts/ci/slurm-up): "
        f"{nodes} of its nodes n1 .. n{len(NODES)} emulated on this one machine, so all {world} ranks share its cores"
        f"{'; started for this run and stopped after it' if started else ''}.",
        "",
        f"Command: `{' '.join(cmd)}`; {a.pairs} alternating pair(s) after one warm-up run each; medians (min–max); "
        f"ratio ddpboot/torchrun of the medians. Whole benchmark (every node count): {total_s / 60:.1f} min.",
        "",
        f"Job: `sbatch --wait` of a batch script with `#SBATCH -N{nodes} --ntasks-per-node=1`, one launcher per node, "
        f"{NPROC} CPU ranks (gloo) each, `examples/train.py --steps {a.steps} --log-every {max(a.steps // 3, 1)}`, "
        "`OMP_NUM_THREADS=1`:",
        "",
        f'- ddpboot: `srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" ddpboot --nproc {NPROC} --cpu '
        "examples/train.py ...`",
        f'- torchrun: `srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" bash -c \'exec python -m '
        f'torch.distributed.run --nnodes "$SLURM_NNODES" --node-rank "$SLURM_NODEID" --nproc-per-node {NPROC} '
        "--master-addr \"$MASTER\" --master-port PORT examples/train.py ...'` (static rendezvous, `MASTER` = first "
        "host of `$SLURM_JOB_NODELIST`, a port free at submission, `CUDA_VISIBLE_DEVICES=` so the workers take gloo "
        "on CPU)",
        "",
        "| measure | ddpboot | torchrun | ddpboot/torchrun |",
        "|---|---|---|---|",
        row("`sbatch --wait`: submission → return", "wall_s"),
        row("srun step (in the batch script)", "step_s"),
        row("batch script start → end", "script_s"),
        row("submission → batch script start", "submit_to_script_s"),
        row("train.py samples/s (rank 0, cumulative at the last step; higher is faster)", "samples_per_s", num),
    ]
    have_rt = {n: [r.slurm_runtime_s for r in counted[n] if r.slurm_runtime_s is not None] for n in CONTENDERS}
    if any(have_rt.values()):
        src = sorted({r.slurm_runtime_from for n in CONTENDERS for r in counted[n] if r.slurm_runtime_from})
        lines.append(f"| SLURM's RunTime ({'/'.join(src)}, whole seconds; {len(have_rt['ddpboot'])}+"
                     f"{len(have_rt['torchrun'])} runs) | {stats(have_rt['ddpboot'], sec)} | "
                     f"{stats(have_rt['torchrun'], sec)} | {ratio(have_rt['ddpboot'], have_rt['torchrun'])} |")
    n_timed = {n: len([r for r in runs if r.contender == n and r.pair >= 0]) for n in CONTENDERS}
    lines.append(f"| runs counted (of timed runs) | {len(counted['ddpboot'])} of {n_timed['ddpboot']} | "
                 f"{len(counted['torchrun'])} of {n_timed['torchrun']} | |")
    losses = {n: sorted({r.final_loss for r in counted[n] if r.final_loss}) for n in CONTENDERS}
    notes = [
        "`sbatch --wait` polls the job's state every 2 s on this cluster (MinJobAge=4; SLURM polls at most every "
        "MinJobAge/2 s), so submission → return moves in steps of about 2 s; the in-job times come from "
        "timestamps the batch script prints (`$EPOCHREALTIME`) and are not quantised.",
        f"Every counted run exited 0 and printed a {world}-rank gloo world under its launcher, `final loss` once and "
        f"{world} identical parameter checksums. Final loss: ddpboot {', '.join(losses['ddpboot']) or '—'}; "
        f"torchrun {', '.join(losses['torchrun']) or '—'}.",
    ]
    if not any(have_rt.values()):
        notes.append("SLURM's own elapsed time was not available (no accounting for sacct, and scontrol no longer "
                     "held the jobs).")
    for r in failed:
        what = "warm-up" if r.pair < 0 else f"pair {r.pair}"
        notes.append(f"FAILED, not counted: {what} {r.contender} (job {r.job_id or '?'}, {r.wall_s:.1f} s): {r.why}.")
    lines += ["", *(f"- {n}" for n in notes), ""]
    return "\n".join(lines)


def summary(runs: list[SlurmRun], node_counts: list[int]) -> dict[str, Any]:
    """Per node count and contender: the counted runs' median of each time, and how many runs counted and failed."""
    return {f"{nodes} nodes": contender_summary([r for r in runs if r.nodes == nodes]) for nodes in node_counts}


def contender_summary(runs: list[SlurmRun]) -> dict[str, Any]:
    res: dict[str, Any] = {}
    for n in CONTENDERS:
        timed = [r for r in runs if r.contender == n and r.pair >= 0]
        ok = [r for r in timed if r.ok]
        res[n] = {"counted": len(ok), "failed": len(timed) - len(ok)}
        for attr in ("wall_s", "step_s", "script_s", "submit_to_script_s", "slurm_runtime_s", "samples_per_s"):
            xs = [getattr(r, attr) for r in ok if getattr(r, attr) is not None]
            res[n][f"{attr}_median"] = statistics.median(xs) if xs else None
    return res


def node_counts(text: str) -> list[int]:
    """`--nodes 2,8` → [2, 8]; argparse reports the error for anything else."""
    try:
        counts = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of node counts") from None
    if not counts or not all(2 <= n <= len(NODES) for n in counts):
        raise argparse.ArgumentTypeError(f"{text!r}: each node count must be 2..{len(NODES)}, the test cluster's nodes")
    return counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=node_counts, default=[2, 8],
                    help=f"node counts, comma-separated, each 2..{len(NODES)} (default 2,8)")
    ap.add_argument("--pairs", type=int, default=5, help="alternating runs of each contender (default 5)")
    ap.add_argument("--steps", type=int, default=300, help="training steps of examples/train.py (default 300)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one job may take before it is cancelled")
    ap.add_argument("--append", type=Path, help="append the results section to this markdown file")
    ap.add_argument("--out", type=Path, help="keep every run's raw record here (JSON); default: a new temp dir")
    a = ap.parse_args()
    if a.pairs < 1 or a.steps < 1:
        ap.error("--pairs and --steps must be at least 1")
    begin = time.monotonic()
    out = a.out or Path(tempfile.mkdtemp(prefix="bench-slurm-raw-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-slurm-jobs-"))
    env = job_env()  # no inherited launcher/SLURM variables, this checkout first on PYTHONPATH; sbatch exports it
    env["SLURM_CONF"] = str(CLUSTER_CONF)  # the test cluster's, never a user's; sbatch passes it to the job's steps
    env["TMPDIR"] = str(work)  # torchrun leaves a torchelastic_* directory per run in the temp dir

    started = ensure_cluster()
    runs: list[SlurmRun] = []
    cluster = "SLURM (version unknown)"
    try:
        cluster = slurm_version()
        log(f"{cluster}; jobs in {work}")
        for nodes in a.nodes:
            for name in CONTENDERS:
                runs.append(run_job(name, nodes, -1, a.steps, env, work, a.timeout))
            for i, name in alternate(CONTENDERS, a.pairs):
                runs.append(run_job(name, nodes, i, a.steps, env, work, a.timeout))
    finally:
        if started:
            stop_cluster()
    total = time.monotonic() - begin
    text = table(runs, a, cluster, started, total)
    print(text)
    (out / "slurm.json").write_text(json.dumps({
        "machine": bench_launch.machine(),
        "cluster": cluster,
        "argv": sys.argv[1:],
        "python": PY,
        "total_s": total,
        "runs": [r.record() for r in runs],
        "summary": summary(runs, a.nodes),
    }, indent=2))
    log(f"raw runs: {out / 'slurm.json'}")
    if a.append:
        with a.append.open("a") as f:
            f.write("\n" + text + "\n")
    if all(r.ok for r in runs):
        shutil.rmtree(work, ignore_errors=True)
    else:
        log(f"some runs failed: their job scripts and output are kept in {work}")


if __name__ == "__main__":
    main()
