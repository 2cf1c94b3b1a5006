"""Jobs on real GPUs: the examples train, GPUs outside the plan gain nothing, the map is what the plan said,
`ddpboot smoke` passes, and each rank's CPU affinity matches what nvidia-smi reports for its GPU."""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddpboot.selection.affinity import format_cpu_list, parse_cpu_list
from tests.support import REPO, clean_env, gpu_count, run_ddpboot

pytestmark = pytest.mark.gpu
PROBE = REPO / "tests" / "gpu" / "probe_rank.py"


def need(n: int) -> None:
    have = gpu_count()
    if have < n:
        pytest.skip(f"needs {n} GPUs, this machine has {have}")


def run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    out = run_ddpboot(*args, env=clean_env(), timeout=timeout, cwd=REPO)
    assert out.returncode == 0, f"ddpboot {' '.join(args)} exited {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


@contextmanager
def memory_watch(indices: list[int]) -> Iterator[dict[int, int]]:
    """The most memory (bytes) each GPU in `indices` gained over its level at the start, sampled via NVML."""
    import pynvml

    pynvml.nvmlInit()
    handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in indices}

    def used(i: int) -> int:
        return int(pynvml.nvmlDeviceGetMemoryInfo(handles[i]).used)

    base = {i: used(i) for i in indices}
    gained = dict.fromkeys(indices, 0)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            for i in indices:
                gained[i] = max(gained[i], used(i) - base[i])

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield gained
    finally:
        stop.set()
        t.join()
        pynvml.nvmlShutdown()


def checksums(output: str) -> set[str]:
    return set(re.findall(r"param checksum (\S+)", output))


def test_train_example_on_two_gpus() -> None:
    need(2)
    out = run("--nproc", "2", "examples/train.py", "--steps", "200")
    assert "final loss" in out.stdout and len(checksums(out.stdout)) == 1
    assert "nccl" in out.stdout


def test_one_rank_excluding_gpu0_leaves_gpu0_untouched() -> None:
    need(2)
    with memory_watch([0]) as gained:
        out = run("--nproc", "1", "--exclude", "0", "examples/train.py", "--steps", "200")
    assert "final loss" in out.stdout
    assert gained[0] == 0, f"GPU 0 gained {gained[0]} bytes while the job ran on GPU 1"


@pytest.mark.parametrize("isolation", ["rank", "node"])
def test_unmodified_torchrun_script(isolation: str) -> None:
    need(2)
    out = run("--nproc", "2", "--isolation", isolation, "examples/torchrun_style.py", "--epochs", "2")
    assert "rank 0 done" in out.stdout and "rank 1 done" in out.stdout


def test_fast_start_trains_the_same_as_exec() -> None:
    """An NCCL DDP job and the unmodified torchrun-style example under --fast-start: the ranks, forked from one
    process that imported torch (CUDA untouched there), train to the same parameters as exec'd ranks."""
    need(2)
    plain = run("--nproc", "2", "examples/train.py", "--steps", "200")
    fast = run("--nproc", "2", "--fast-start", "examples/train.py", "--steps", "200")
    assert "nccl" in fast.stdout and "final loss" in fast.stdout
    assert len(checksums(fast.stdout)) == 1 and checksums(fast.stdout) == checksums(plain.stdout)
    out = run("--nproc", "2", "--fast-start", "examples/torchrun_style.py", "--epochs", "2")
    assert "rank 0 done" in out.stdout and "rank 1 done" in out.stdout
    with memory_watch([0]) as gained:
        out = run("--nproc", "1", "--exclude", "0", "--fast-start", "examples/train.py", "--steps", "100")
    assert "final loss" in out.stdout
    assert gained[0] == 0, f"GPU 0 gained {gained[0]} bytes while the fast-started job ran on GPU 1"


@pytest.mark.parametrize("isolation", ["rank", "node"])
def test_each_rank_sees_the_planned_gpu_in_the_given_order(isolation: str) -> None:
    need(2)
    plan = json.loads(run("plan", "--gpus", "1,0", "--isolation", isolation, "--json").stdout)
    out = run("--gpus", "1,0", "--isolation", isolation, "--no-prefix", str(PROBE))
    seen = {r["rank"]: r for r in map(json.loads, re.findall(r"^PROBE (.*)$", out.stdout, re.M))}
    for slot in plan["ranks"]:
        mine = seen[slot["rank"]]
        assert mine["DDPBOOT_GPU_UUIDS"] == slot["gpus"][0]["uuid"]
        assert mine["current_uuid"] == slot["gpus"][0]["uuid"]  # the device the rank computes on
        assert mine["cpus"] == slot["cpus"]
    assert plan["ranks"][0]["gpus"][0]["index"] == 1


def test_affinity_matches_nvidia_smi_topology() -> None:
    n = gpu_count()
    topo = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    topo = re.sub(r"\x1b\[[0-9;]*m", "", topo)
    header = next(line for line in topo.splitlines() if "CPU Affinity" in line).split("\t")
    col = [h.strip() for h in header].index("CPU Affinity")
    expect = {}
    for line in topo.splitlines():
        cells = line.split("\t")
        if re.fullmatch(r"GPU\d+", cells[0].strip()):
            expect[int(cells[0].strip()[3:])] = cells[col].strip()
    plan = json.loads(run("plan", "--nproc", str(n), "--json", "--max-used-memory", "200GiB", "--max-util",
                          "100").stdout)
    allowed = set(os.sched_getaffinity(0))
    for slot in plan["ranks"]:
        near = set(parse_cpu_list(expect[slot["gpus"][0]["index"]])) & allowed
        assert set(slot["cpus"]) <= near, f"rank {slot['rank']}: {format_cpu_list(slot['cpus'])} not within {near}"


@pytest.mark.parametrize("extra", [[], ["--exclude", "0"]])
def test_smoke_passes(extra: list[str], tmp_path: Path) -> None:
    need(2)
    junit = tmp_path / "smoke.xml"
    out = run("smoke", *extra, "--nproc", "1" if extra else "2", "--json", "--max-bytes", "1GiB",
              "--junit-xml", str(junit), timeout=600)
    report = json.loads(out.stdout)
    assert report["passed"], json.dumps(report["checks"], indent=1)
    assert junit.read_text().count("<testcase") == len(report["checks"])


@pytest.mark.parametrize(("mode", "code"), [("exit3", 3), ("raise", 1)])
def test_a_rank_leaving_while_its_peer_waits_in_nccl_ends_the_job(tmp_path: Path, mode: str, code: int) -> None:
    """Rank 1 leaves (sys.exit(3), or an exception) while rank 0 waits in an NCCL all_reduce it will never finish.
    init()'s exit path aborts rank 1's communicators (a destroy would wait for rank 0 until NCCL's timeout), so rank
    1 exits, and the launcher stops rank 0: the job ends within --shutdown-timeout + 5 s with rank 1's code."""
    need(2)
    import time

    shutdown = 5
    script = REPO / "tests" / "process" / "scripts" / "exit_path.py"
    out = run_ddpboot("--nproc", "2", "--shutdown-timeout", str(shutdown), str(script), str(tmp_path), mode, "1",
                      env=clean_env(NCCL_NVLS_ENABLE="0"), timeout=180, cwd=REPO)
    ended = time.time()
    left = float((tmp_path / "rank1.left").read_text())
    assert out.returncode == code, out.stderr
    assert (tmp_path / "rank1.calls").read_text().split() == ["abort"], out.stderr
    assert ended - left < shutdown + 5, f"the job ended {ended - left:.1f} s after rank 1 began to leave"


def test_a_script_that_counts_gpus_is_reported_under_rank_isolation_and_trains_under_node() -> None:
    """The published-example pattern `if torch.cuda.device_count() < world_size: exit()`: under rank isolation every
    rank sees 1 GPU and leaves (exit 0); ddpboot names the check before the start and reports after the job that no
    rank joined. Under --isolation node it trains on both GPUs."""
    need(2)
    script = str(REPO / "examples" / "device_count_check.py")
    isolated = run_ddpboot("--nproc", "2", script, env=clean_env(), timeout=300, cwd=REPO)
    assert isolated.returncode == 0, isolated.stderr
    assert "Unable to locate sufficient 2 gpus" in isolated.stdout
    assert "counts GPUs" in isolated.stderr and "no rank joined the job" in isolated.stderr
    node = run("--nproc", "2", "--isolation", "node", script)
    assert "all_reduce gave 2" in node.stdout and "no rank joined" not in node.stderr
