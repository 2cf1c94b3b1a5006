"""The worker API in real processes: under torchrun, under ddpboot's environment contract, under a simulated srun
step, and as plain python; each pitfall guard fires on the rank that makes the mistake and stays silent elsewhere.

Every job runs tests/process/scripts/worker_probe.py, which exercises init/wrap/sampler/print0/main_first/load/
shutdown once per rank and writes a JSON report; one launch checks many things, so the suite stays fast on 2 cores.

"Under ddpboot" is the launcher's worker environment (docs/reference.md, "What every worker gets") set by hand:
RANK, LOCAL_RANK=0 (rank isolation), WORLD_SIZE, ..., TORCHELASTIC_RUN_ID, CUDA_VISIBLE_DEVICES=<the rank's
UUID>, DDPBOOT_LOCAL_RANK, DDPBOOT_GPU_UUIDS, DDPBOOT_ISOLATION. The real launcher hosts the TCPStore itself
(TORCHELASTIC_USE_AGENT_STORE=True); without it, worker rank 0 hosts it (False). Jobs the real launcher starts are
in test_launcher.py. On CPU the UUIDs are simulated ones (as with DDPBOOT_FAKE_GPUS), which hide every real GPU, so
these tests run on CPU/gloo on any machine.

GPU-only tests are marked `gpu` and skip unless a subprocess sees enough GPUs (pytest's process never touches CUDA).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from ddpboot.cluster import derive_port
from tests.support import REPO, free_port

PROBE = Path(__file__).resolve().parent / "scripts" / "worker_probe.py"
TIMEOUT = 120

_LAUNCH_VARS = {
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_NAME",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "OMP_NUM_THREADS",
}


def base_env(**extra: str) -> dict[str, str]:
    """This environment without any launcher's variables (a test may itself run under srun or torchrun)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "DDPBOOT_", "PET_"))
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def fake_uuid(i: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"ddpboot-test-gpu-{i}"))


def run_job(cmds_envs: list[tuple[list[str], dict[str, str]]], timeout: float = TIMEOUT) -> list[tuple[int, str]]:
    """Start every process at once (they rendezvous), wait for all; (returncode, output) each."""
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        for cmd, env in cmds_envs
    ]
    results: list[tuple[int, str]] = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            results.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    for code, out in results:
        assert code == 0, out
    return results


def reports(outdir: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(world)]


def probe(outdir: Path, *args: str) -> list[str]:
    return [sys.executable, str(PROBE), str(outdir), *args]


def check_job(reps: list[dict[str, Any]], launcher: str, backend: str | None, device: str) -> None:
    """What must hold on every rank of any job, whoever launched it."""
    world = len(reps)
    assert [r["context"]["rank"] for r in reps] == list(range(world))
    for r in reps:
        c = r["context"]
        assert (c["world_size"], c["launcher"], c["backend"], c["device"]) == (world, launcher, backend, device)
        assert c["is_main"] == (c["rank"] == 0) == r["is_main"]
        assert r["is_main_before_init"] == (c["rank"] == 0)
        assert r["context_before_init"]["type"] == "NotInitializedError"
        assert r["init_twice_same"] and r["context_is_ctx"]
        assert r["backend_conflict"]["type"] == "WorkerSetupError"
        assert r["wrapped_type"] == ("DistributedDataParallel" if world > 1 else "Sequential")
        assert r["param_devices"] == [device]
        assert r["grad_max_diff_from_mean"] < 1e-6, "DDP gradient is not the mean of the ranks' gradients"
        assert r["wrap_non_module"]["type"] == "WorkerSetupError" and "list" in r["wrap_non_module"]["message"]
        assert r["sampler"]["type"] == "DistributedSampler"
        assert r["main_first_saw_marker"]
        assert r["load_device"] == device
        assert not r["dist_initialized_after_shutdown"]
        assert r["context_after_shutdown"]["type"] == "NotInitializedError"
        assert r["print0_output"] == ("print0 says hi\n" if c["rank"] == 0 else "")
        assert r["dist_initialized"] == (backend is not None)
    # after one DDP step every rank holds the same gradients and parameters
    assert len({r["grad_checksum"] for r in reps}) == 1
    assert len({r["param_checksum"] for r in reps}) == 1
    shards = [r["sampler"]["indices"] for r in reps]
    assert sorted(i for s in shards for i in s) == list(range(10)), shards


def ddpboot_env(
    rank: int, world: int, port: int, uuids: list[str], isolation: str = "rank", **extra: str
) -> dict[str, str]:
    """The ddpboot launcher's worker environment for one node, set by hand (see the module docstring)."""
    mine = uuids[rank] if uuids else ""
    return base_env(
        RANK=str(rank),
        LOCAL_RANK="0" if isolation == "rank" else str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        GROUP_RANK="0",
        GROUP_WORLD_SIZE="1",
        ROLE_RANK=str(rank),
        ROLE_NAME="default",
        ROLE_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_RUN_ID="ddpboot-test",
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
        TORCHELASTIC_USE_AGENT_STORE="False",
        CUDA_VISIBLE_DEVICES=mine if isolation == "rank" else ",".join(uuids),
        CUDA_DEVICE_ORDER="PCI_BUS_ID",
        DDPBOOT_LOCAL_RANK=str(rank),
        DDPBOOT_GPU_UUIDS=mine,
        DDPBOOT_ISOLATION=isolation,
        **extra,
    )


def srun_env(rank: int, world: int, job_id: int, **extra: str) -> dict[str, str]:
    """What srun gives task `rank` of a one-node step with `world` tasks (no MASTER_*: the job id gives the port)."""
    return base_env(
        SLURM_JOB_ID=str(job_id),
        SLURM_JOBID=str(job_id),
        SLURM_STEP_ID="0",
        SLURM_STEPID="0",
        SLURM_PROCID=str(rank),
        SLURM_LOCALID=str(rank),
        SLURM_NODEID="0",
        SLURM_NTASKS=str(world),
        SLURM_STEP_NUM_TASKS=str(world),
        SLURM_NNODES="1",
        SLURM_STEP_NUM_NODES="1",
        SLURM_TASKS_PER_NODE=str(world),
        SLURM_STEP_TASKS_PER_NODE=str(world),
        SLURM_STEP_NODELIST="localhost",
        SLURM_JOB_NODELIST="localhost",
        **extra,
    )


def free_job_id() -> int:
    """A job id whose derived store port (`derive_port`: what every srun task computes without MASTER_PORT) is free
    here, so the simulated step does not collide."""
    for job_id in range(os.getpid() % 10007 + 40000, 10**6, 7919):
        if port_is_free(derive_port(job_id, 0)):
            return job_id
    raise AssertionError("no free derived port")


# ------------------------------------------------------------------------------------------------------- CPU jobs


def test_under_torchrun(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        *probe(tmp_path)[1:],
    ]
    run_job([(cmd, base_env(CUDA_VISIBLE_DEVICES="", TMPDIR=str(tmp_path)))])
    reps = reports(tmp_path, 2)
    check_job(reps, "torchrun", "gloo", "cpu")
    assert [r["context"]["local_rank"] for r in reps] == [0, 1]
    assert all(r["init_warnings"] == [] and r["wrap_warnings"] == [] for r in reps)


def test_under_ddpboot_contract_and_changed_visible_devices(tmp_path: Path) -> None:
    """Rank 1 points CUDA_VISIBLE_DEVICES at rank 0's GPU before init(): the guard fires there (and raises under
    strict=True), rank 0 stays silent, and the job still trains."""
    uuids = [fake_uuid(0), fake_uuid(1)]
    port = free_port()
    args = ["--set-cvd", f"1={uuids[0]}", "--strict-first", "1"]
    run_job([(probe(tmp_path, *args), ddpboot_env(r, 2, port, uuids)) for r in range(2)])
    reps = reports(tmp_path, 2)
    check_job(reps, "ddpboot", "gloo", "cpu")
    assert [r["context"]["local_rank"] for r in reps] == [0, 1]  # the true index, though LOCAL_RANK=0 on both
    assert [r["env"]["LOCAL_RANK"] for r in reps] == ["0", "0"]
    assert [r["context"]["gpu_uuids"] for r in reps] == [[uuids[0]], [uuids[1]]]
    assert reps[0]["init_warnings"] == [] and "strict_error" not in reps[0]
    assert reps[1]["strict_error"]["type"] == "VisibleDevicesChangedError"
    [w] = reps[1]["init_warnings"]
    assert w["category"] == "DdpbootWarning" and w["file"] == PROBE.name  # attributed to the script's init() line
    assert uuids[0] in w["message"] and uuids[1] in w["message"] and "Fix:" in w["message"]
    assert all(r["wrap_warnings"] == [] for r in reps)


def test_under_simulated_srun(tmp_path: Path) -> None:
    job_id = free_job_id()
    run_job([(probe(tmp_path), srun_env(r, 2, job_id, CUDA_VISIBLE_DEVICES="")) for r in range(2)])
    reps = reports(tmp_path, 2)
    check_job(reps, "slurm", "gloo", "cpu")
    for r in reps:
        rank = r["context"]["rank"]
        assert r["context"]["local_rank"] == rank and r["context"]["local_world_size"] == 2
        # init() exported the torchrun contract for env:// (and for the script's own use)
        assert r["env"] == {
            "RANK": str(rank),
            "WORLD_SIZE": "2",
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
            "MASTER_ADDR": "localhost",
            "MASTER_PORT": str(derive_port(job_id, 0)),
            "CUDA_VISIBLE_DEVICES": "",
            "CUDA_DEVICE_ORDER": None,
        }
        assert r["init_warnings"] == []


def test_plain_env_init_without_local_ranks(tmp_path: Path) -> None:
    """A hand-rolled launcher (or a PyTorchJob pod) that sets only RANK, WORLD_SIZE and MASTER_*: each process is
    local rank 0 of 1 on its own node, init() says so once, and exports the rest of torchrun's contract."""
    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2", "CUDA_VISIBLE_DEVICES": ""}
    run_job([(probe(tmp_path), base_env(RANK=str(r), **env)) for r in range(2)])
    reps = reports(tmp_path, 2)
    check_job(reps, "env", "gloo", "cpu")
    for r in reps:
        c = r["context"]
        assert (c["local_rank"], c["local_world_size"], c["node_rank"]) == (0, 1, c["rank"])
        exported = (r["env"]["LOCAL_RANK"], r["env"]["LOCAL_WORLD_SIZE"], r["env"]["GROUP_RANK"])
        assert exported == ("0", "1", str(c["rank"]))
        [w] = r["init_warnings"]
        assert w["category"] == "DdpbootWarning" and w["file"] == PROBE.name
        assert "LOCAL_RANK and LOCAL_WORLD_SIZE are not" in w["message"] and "local rank 0 of 1" in w["message"]


def test_plain_python(tmp_path: Path) -> None:
    run_job([(probe(tmp_path), base_env(CUDA_VISIBLE_DEVICES=""))])
    [r] = reports(tmp_path, 1)
    check_job([r], "none", None, "cpu")
    assert r["sampler"]["indices"] != list(range(10))  # shuffled, but the whole dataset
    assert r["init_warnings"] == [] and r["wrap_warnings"] == []


def test_examples_train_under_torchrun(tmp_path: Path) -> None:
    """examples/train.py on 2 ranks: it trains (the loss falls) and every rank ends with the same parameters."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(REPO / "examples" / "train.py"),
        "--steps=60",
    ]
    [(_, out)] = run_job([(cmd, base_env(CUDA_VISIBLE_DEVICES="", TMPDIR=str(tmp_path)))])
    checksums = {line.split()[-1] for line in out.splitlines() if "param checksum" in line}
    assert len([line for line in out.splitlines() if "param checksum" in line]) == 2, out
    assert len(checksums) == 1, out
    finals = [line for line in out.splitlines() if "final loss" in line]
    assert len(finals) == 1, out  # print0: rank 0 only
    first = next(line for line in out.splitlines() if line.startswith("step "))
    assert float(finals[0].split("final loss")[1].split()[0]) < float(first.split("loss")[1].split()[0]), out


def test_examples_torchrun_style_under_ddpboot_contract(tmp_path: Path) -> None:
    """The unmodified torchrun idiom runs under ddpboot's environment (LOCAL_RANK=0 on every rank)."""
    port = free_port()
    script = str(REPO / "examples" / "torchrun_style.py")
    results = run_job(
        [
            ([sys.executable, script, "--epochs=2"], ddpboot_env(r, 2, port, [fake_uuid(0), fake_uuid(1)]))
            for r in (0, 1)
        ]
    )
    assert all("done" in out for _, out in results), results


# ------------------------------------------------------------------------------------------------------- GPU jobs


@functools.cache
def gpu_uuids() -> list[str]:
    """The machine's GPU UUIDs in PCI order, as ddpboot spells them, asked in a subprocess (CUDA stays out of
    pytest's process); empty without CUDA."""
    if shutil.which("nvidia-smi") is None and not Path("/dev/nvidiactl").exists():
        return []  # no NVIDIA driver here: skip without paying for a torch import
    code = (
        "import json, torch\n"
        "n = torch.cuda.device_count() if torch.cuda.is_available() else 0\n"
        "from ddpboot.worker.device import cuda_uuid\n"
        "print(json.dumps([cuda_uuid(i) for i in range(n)]))\n"
    )
    env = base_env(CUDA_DEVICE_ORDER="PCI_BUS_ID")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    if out.returncode != 0:
        return []
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def need_gpus(n: int) -> list[str]:
    uuids = gpu_uuids()
    if len(uuids) < n:
        pytest.skip(f"needs {n} CUDA GPUs, this machine has {len(uuids)}")
    return uuids


@pytest.mark.gpu
def test_gpu_uuid_spelling_matches_nvml() -> None:
    """torch prints a device UUID without NVML's 'GPU-' prefix; ddpboot compares them in NVML's spelling."""
    uuids = need_gpus(1)
    assert all(u.startswith("GPU-") and len(u) == 40 for u in uuids), uuids
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"], capture_output=True, text=True, timeout=60
    )
    if smi.returncode == 0:
        assert [line.strip() for line in smi.stdout.splitlines() if line.strip()] == uuids


@pytest.mark.gpu
@pytest.mark.parametrize("isolation", ["rank", "node"])
def test_gpu_under_ddpboot_contract(tmp_path: Path, isolation: str) -> None:
    uuids = need_gpus(2)[:2]
    port = free_port()
    run_job([(probe(tmp_path), ddpboot_env(r, 2, port, uuids, isolation)) for r in range(2)])
    reps = reports(tmp_path, 2)
    devices = ["cuda:0", "cuda:0"] if isolation == "rank" else ["cuda:0", "cuda:1"]
    for r, dev in zip(reps, devices, strict=True):
        assert r["context"]["device"] == dev and r["context"]["backend"] == "nccl"
        assert r["current_device"] == int(dev[-1])
        assert r["context"]["gpu_uuids"] == [uuids[r["context"]["rank"]]]
        assert r["init_warnings"] == [] and r["wrap_warnings"] == []
        assert r["grad_max_diff_from_mean"] < 1e-5 and r["load_device"] == dev
    assert reps[0]["param_checksum"] == reps[1]["param_checksum"]


@pytest.mark.gpu
def test_gpu_under_torchrun(tmp_path: Path) -> None:
    uuids = need_gpus(2)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        *probe(tmp_path)[1:],
    ]
    run_job([(cmd, base_env(CUDA_DEVICE_ORDER="PCI_BUS_ID", TMPDIR=str(tmp_path)))])
    reps = reports(tmp_path, 2)
    for r in reps:
        rank = r["context"]["rank"]
        assert (r["context"]["device"], r["context"]["backend"]) == (f"cuda:{rank}", "nccl")
        assert r["current_device"] == rank and r["context"]["gpu_uuids"] == [uuids[rank]]
        assert r["init_warnings"] == [] and r["grad_max_diff_from_mean"] < 1e-5
    assert reps[0]["param_checksum"] == reps[1]["param_checksum"]


@pytest.mark.gpu
def test_gpu_srun_task_narrows_to_its_gpu(tmp_path: Path) -> None:
    """Each srun task sees the node's GPUs; init() narrows CUDA_VISIBLE_DEVICES before CUDA starts."""
    uuids = need_gpus(2)
    job_id = free_job_id()
    run_job([(probe(tmp_path), srun_env(r, 2, job_id)) for r in range(2)])
    reps = reports(tmp_path, 2)
    for r in reps:
        rank = r["context"]["rank"]
        assert (r["context"]["device"], r["context"]["backend"]) == ("cuda:0", "nccl")
        assert r["env"]["CUDA_VISIBLE_DEVICES"] == str(rank) and r["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert r["env"]["LOCAL_RANK"] == "0" and r["context"]["local_rank"] == rank
        assert r["context"]["gpu_uuids"] == [uuids[rank]]
        assert r["init_warnings"] == [] and r["grad_max_diff_from_mean"] < 1e-5
    assert reps[0]["param_checksum"] == reps[1]["param_checksum"]


@pytest.mark.gpu
def test_gpu_guards_visible_devices_and_unassigned_gpus(tmp_path: Path) -> None:
    """A ddpboot rank assigned GPU 0 that widens CUDA_VISIBLE_DEVICES to '0,1': both guards say so."""
    uuids = need_gpus(2)
    env = ddpboot_env(0, 1, free_port(), uuids[:1])
    run_job([(probe(tmp_path, "--set-cvd", "0=0,1", "--strict-first", "0"), env)])
    [r] = reports(tmp_path, 1)
    assert r["strict_error"]["type"] == "VisibleDevicesChangedError"
    messages = [w["message"] for w in r["init_warnings"]]
    assert len(messages) == 2, messages
    assert "CUDA_VISIBLE_DEVICES is '0,1'" in messages[0]
    assert uuids[1] in messages[1] and "did not assign" in messages[1]


@pytest.mark.gpu
@pytest.mark.parametrize("mistake", [True, False])
def test_gpu_guards_early_cuda_and_model_device(tmp_path: Path, mistake: bool) -> None:
    """Plain python with 2 GPUs (the rank's device is cuda:0): CUDA used on cuda:1 before init() and a model built
    on cuda:1 each warn; the same on cuda:0 is silent."""
    need_gpus(2)
    other = "1" if mistake else "0"
    env = base_env(CUDA_DEVICE_ORDER="PCI_BUS_ID")
    run_job([(probe(tmp_path, "--cuda-first", f"0={other}", "--model-on", f"0=cuda:{other}"), env)])
    [r] = reports(tmp_path, 1)
    assert r["context"]["device"] == "cuda:0" and r["current_device"] == 0
    if mistake:
        [w] = r["init_warnings"]
        assert "initialised on cuda:1" in w["message"] and w["file"] == PROBE.name
        [w] = r["wrap_warnings"]
        assert "cuda:1" in w["message"] and "Fix:" in w["message"] and w["file"] == PROBE.name
    else:
        assert r["init_warnings"] == [] and r["wrap_warnings"] == []
    assert r["param_devices"] == ["cuda:0"]


# ------------------------------------------------------------------------------------------------ the exit path

EXIT_PATH = Path(__file__).resolve().parent / "scripts" / "exit_path.py"


@pytest.mark.parametrize(
    ("mode", "code", "ended_by"),
    [
        ("clean", 0, "destroy"),
        ("exit0", 0, "destroy"),
        ("exit3", 3, "abort"),
        ("raise", 1, "abort"),
        ("builtin_exit", 4, "abort"),
        ("argparse", 2, "abort"),
    ],
)
def test_a_failing_exit_aborts_the_group_and_a_clean_one_destroys_it(
    tmp_path: Path, mode: str, code: int, ended_by: str
) -> None:
    """A destroy flushes the communicators, which waits for peers; a rank that leaves with a failure must not wait
    for peers that will never come, so init()'s exit path aborts instead (on GPUs, NCCL's destroy then hangs the
    job until the collective timeout)."""
    port = free_port()
    procs = [
        subprocess.Popen([sys.executable, str(EXIT_PATH), str(tmp_path), mode], env=ddpboot_env(r, 2, port, []),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        for r in range(2)
    ]
    outs = [p.communicate(timeout=TIMEOUT)[0] for p in procs]
    for r, p in enumerate(procs):
        assert p.returncode == code, outs[r]
        assert (tmp_path / f"rank{r}.calls").read_text().split() == [ended_by], outs[r]
