"""torchrun's command lines under ddpboot: each one run as it is under the venv's torchrun (where it has the option)
and under ddpboot, comparing what a user sees: the ranks' lines on the console, where the files went, the exit code.

torchrun prefixes only teed lines (`[default0]:`, no space) and writes -r/-t files without --log-dir under a fresh
`$TMPDIR/torchelastic_*` it never names; ddpboot prefixes every console line (`[rank0]: `) and writes them under
`$TMPDIR/ddpboot-logs-UID/RUN_ID`, named once. torch 2.14's --log-line-prefix-template and --print-completion are
compared where the installed torchrun has them, and checked under ddpboot alone otherwise.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddpboot.launch.procs.mempolicy import refused
from ddpboot.selection.affinity import format_cpu_list
from tests.support import clean_env, ddpboot_exe

TORCHRUN = Path(sys.executable).with_name("torchrun")
needs_torchrun = pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this interpreter")

HELLO = """\
import os, sys
rank = os.environ["RANK"]
print(f"out {rank} {os.environ['ROLE_NAME']}", flush=True)
print(f"err {rank}", file=sys.stderr, flush=True)
"""

FAILS_IN_TORCH = """\
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    raise RuntimeError("boom from rank 0")
dist.barrier()
"""


def run(tool: list[str], args: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    tmp.mkdir(exist_ok=True)
    return subprocess.run([*tool, *args], env=clean_env(TMPDIR=str(tmp), **env), cwd=tmp.parent,
                          capture_output=True, text=True, timeout=120)


def torchrun(args: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run([str(TORCHRUN), "--nproc-per-node", "2"], args, tmp, **env)


def ddpboot(args: list[str], tmp: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run([*ddpboot_exe(), "--cpu", "--nproc", "2"], args, tmp, **env)


def by_rank(text: str, prefix: str) -> dict[int, list[str]]:
    """rank → its lines, from the lines that begin with `prefix` (a regex with the rank as its group)."""
    out: dict[int, list[str]] = {}
    for line in text.splitlines():
        m = re.match(prefix, line)
        if m:
            out.setdefault(int(m[1]), []).append(line[m.end():])
    return out


def ddpboot_logs(done: subprocess.CompletedProcess[str], tmp: Path) -> Path:
    """The run directory the launcher named: once, under the user's temporary log base."""
    named = re.findall(r"^ddpboot: logs in (.+)$", done.stderr, re.M)
    assert len(named) == 1, done.stderr
    where = Path(named[0])
    assert where.parent == tmp / f"ddpboot-logs-{os.getuid()}" and where.is_dir(), where
    assert sorted(p.name for p in tmp.iterdir()) == [where.parent.name]  # nothing else left in TMPDIR
    return where


@needs_torchrun
@pytest.mark.parametrize("flag", ["--tee", "-r"])
def test_tee_and_redirects_without_a_log_dir(flag: str, tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text(HELLO)
    theirs = torchrun([flag, "3", "hello.py"], tmp_path / "t")
    ours = ddpboot([flag, "3", "hello.py"], tmp_path / "d")
    assert theirs.returncode == ours.returncode == 0, (theirs.stderr, ours.stderr)
    shown = flag == "--tee"  # -r 3: the files only; -t 3: the files and the console
    for stream in ("stdout", "stderr"):
        t = by_rank(getattr(theirs, stream), r"\[default(\d+)\]:")
        d = by_rank(getattr(ours, stream), r"\[rank(\d+)\]: ")
        assert t == d == ({0: [f"{stream[3:]} 0" + (" default" if stream == "stdout" else "")],
                           1: [f"{stream[3:]} 1" + (" default" if stream == "stdout" else "")]} if shown else {})
    # torchrun: $TMPDIR/torchelastic_*/RUN_*/attempt_0/LOCAL_RANK/{stdout,stderr}.log, left there, never named.
    (torch_logs,) = (tmp_path / "t").glob("torchelastic_*/*/attempt_0")
    assert (torch_logs / "1" / "stdout.log").read_text() == "out 1 default\n"
    assert f"{torch_logs.parent}" not in theirs.stderr + theirs.stdout
    # ddpboot: one file per rank with both streams, in the run directory it named.
    where = ddpboot_logs(ours, tmp_path / "d")
    for rank in (0, 1):
        assert sorted((where / "attempt_0" / f"rank{rank}.log").read_text().splitlines()) == [
            f"err {rank}", f"out {rank} default"]


@needs_torchrun
def test_the_prefix_template_of_torchelastics_variable_and_of_torch_2_14s_option(tmp_path: Path) -> None:
    (tmp_path / "hello.py").write_text(HELLO)
    template = "${role_name}:${local_rank}:${rank}|"
    args = ["--role", "trainer", "--start-method", "fork", "--tee", "3", "hello.py"]
    theirs = torchrun(args, tmp_path / "t", TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=template)
    ours = ddpboot(args, tmp_path / "d", TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=template)
    assert theirs.returncode == ours.returncode == 0, (theirs.stderr, ours.stderr)
    lines = [f"trainer:{r}:{r}|out {r} trainer" for r in (0, 1)]
    assert sorted(line for line in theirs.stdout.splitlines() if "|" in line) == lines
    assert sorted(ours.stdout.splitlines()) == lines
    # --log-line-prefix-template wins over the variable; ${hostname} and ddpboot's ${node_rank}.
    option = ["--log-line-prefix-template", "${hostname}/${node_rank}/${rank}: "]
    help_text = subprocess.run([str(TORCHRUN), "--help"], capture_output=True, text=True).stdout
    if "--log-line-prefix-template" in help_text:  # torch 2.14 (without ${node_rank})
        theirs = torchrun([option[0], "${hostname}/${rank}: ", "--tee", "3", "hello.py"], tmp_path / "t")
        assert f"{os.uname().nodename}/0: out 0 default" in theirs.stdout.splitlines()
    ours = ddpboot([*option, "hello.py"], tmp_path / "d", TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=template)
    host = subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
    assert sorted(ours.stdout.splitlines()) == [f"{host}/0/{r}: out {r} default" for r in (0, 1)]
    assert sorted(ours.stderr.splitlines()) == [f"{host}/0/{r}: err {r}" for r in (0, 1)]


def test_a_torch_traceback_carries_one_prefix(tmp_path: Path) -> None:
    """torch.distributed's excepthook writes `[rank0]: ` before each line of a rank's traceback; the console used to
    show `[rank0]: [rank0]: Traceback ...`."""
    (tmp_path / "fails.py").write_text(FAILS_IN_TORCH)
    done = ddpboot(["fails.py"], tmp_path / "d")
    assert done.returncode == 1, done.stderr
    traceback = [line for line in done.stderr.splitlines() if line.startswith("[rank0]:")]
    assert traceback[0] == "[rank0]: Traceback (most recent call last):", done.stderr
    assert "[rank0]: RuntimeError: boom from rank 0" in traceback
    assert not any(line.startswith("[rank0]: [rank0]:") for line in done.stderr.splitlines()), done.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh", "tcsh", "fish"])
def test_print_completion(shell: str, tmp_path: Path) -> None:
    done = run(ddpboot_exe(), ["--print-completion", shell], tmp_path / "d")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    script = done.stdout
    for option in ("--nproc", "--log-line-prefix-template", "--print-completion", "--wide"):
        assert option[2:] in script, option  # every command's options, fish and tcsh without the dashes
    assert "logs-specs" not in script  # refused options are hidden, and not offered
    if shell != "bash":
        return
    path = tmp_path / "ddpboot.bash"
    path.write_text(script)
    cases = [  # the words so far (the last is the one being completed) → what completes it
        ("ddpboot --iso", "--isolation"),
        ("ddpboot --isolation ''", "node rank"),
        ("ddpboot --print-completion z", "zsh"),
        ("ddpboot pl", "plan"),
        ("ddpboot gpus --wi", "--wide"),
        ("ddpboot --nproc 2 train.py --iso", ""),  # after the script: its own arguments, not ddpboot's options
    ]
    probe = [f"source {path}", "complete -p ddpboot"]
    for words, _ in cases:
        probe.append(f"COMP_WORDS=({words}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=(); _ddpboot; "
                     'printf "%s\\n" "${COMPREPLY[@]}" | sort | paste -sd " "')
    out = subprocess.run(["bash", "--norc", "-c", "\n".join(probe)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "complete -o default -F _ddpboot ddpboot"
    assert lines[1:] == [want for _, want in cases]


def test_print_completion_refuses_an_unknown_shell(tmp_path: Path) -> None:
    done = run(ddpboot_exe(), ["--print-completion", "powershell"], tmp_path / "d")
    assert done.returncode == 2 and done.stderr.count("ddpboot: error:") == 1
    assert "'powershell': choose one of bash, zsh, tcsh, fish" in done.stderr


AFFINITY = """\
import os
policy = open("/proc/self/numa_maps").readline().split(" ", 1)[1].split(" file=")[0]
print(f"cpus {os.environ['RANK']} {sorted(os.sched_getaffinity(0))}", flush=True)
print(f"mempolicy {os.environ['RANK']} {policy}", flush=True)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two cores to share are needed")
@pytest.mark.parametrize(("policy", "fast"), [("node", False), ("exclusive", False), ("node", True)])
def test_numa_binding_binds_each_rank_as_the_plan_shows(policy: str, fast: bool, tmp_path: Path) -> None:
    """torchrun's --numa-binding needs CUDA devices (it asks torch for each GPU's PCI address); here, two simulated
    GPUs near the launcher's cores: the cores each rank runs on are those `ddpboot plan` shows for the policy, and its
    memory is preferred from their NUMA nodes (the kernel's own account: /proc/self/numa_maps), exec'd or forked by
    the fast-start process."""
    cores = sorted(os.sched_getaffinity(0))
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps([{"name": "Simulated", "memory_total": 2**34, "cpu_affinity": cores}] * 2))
    (tmp_path / "affinity.py").write_text(AFFINITY)
    env = {"DDPBOOT_FAKE_GPUS": str(gpus)}
    plan = run(ddpboot_exe(), ["plan", "--nproc", "2", "--cpu-affinity", policy, "--json"], tmp_path / "p", **env)
    shown = [r["cpus"] for r in json.loads(plan.stdout)["ranks"]]
    nodes = [r["mem_nodes"] for r in json.loads(plan.stdout)["ranks"]]
    flags = ["--fast-start"] if fast else []
    done = run(ddpboot_exe(), [*flags, "--nproc", "2", "--numa-binding", policy, "affinity.py"], tmp_path / "d", **env)
    assert done.returncode == 0, done.stderr
    ran = dict(re.findall(r"^\[rank(\d)\]: cpus \d (.*)$", done.stdout, re.M))
    assert [json.loads(ran[r]) for r in ("0", "1")] == shown
    memory = dict(re.findall(r"^\[rank(\d)\]: mempolicy \d (.*)$", done.stdout, re.M))
    assert all(nodes), nodes
    if refused(nodes[0]) is None:  # a container may refuse set_mempolicy: then the launcher says so, below
        assert [memory[r].replace(" (many)", "") for r in ("0", "1")] == [
            f"prefer:{format_cpu_list(n) if '(many)' in memory['0'] else min(n)}" for n in nodes], memory
    else:
        assert "their memory is not preferred from their NUMA nodes" in done.stderr, done.stderr
    if policy == "exclusive":
        assert shown[0] and shown[1] and not set(shown[0]) & set(shown[1])
    else:
        assert shown[0] == shown[1] and set(shown[0]) >= set(cores)  # the whole node (or nodes) of those cores
