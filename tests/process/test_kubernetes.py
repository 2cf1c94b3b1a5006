"""Kubeflow pods emulated on this machine: every pod runs the same unmodified command, `ddpboot launch_ddp.py` with
no flags, and its environment alone (what the operator gives the pod) makes the pods one job.

- A PyTorchJob (training-operator, kubeflow.org/v1) pod gets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, and node
  0's address only as MASTER_ADDR / MASTER_PORT, with WORLD_SIZE (pods × processes per pod) and RANK (the pod's
  index) beside them; KUBERNETES_SERVICE_HOST says it is a pod.
- A TrainJob (Kubeflow Trainer's torch plugin) pod gets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
  PET_MASTER_ADDR and PET_MASTER_PORT.

Every pod is one launcher here, all on 127.0.0.1 (the pods' service names all resolve to this machine). The workers
are CPU ranks (gloo) running a torchrun-style DDP step: each rank's report shows it joined the one group (an
all_reduce over every rank, DDP's averaged gradients) and every launcher exits 0.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import DDP, clean_env, finish, free_port, reports, start_launcher

POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443", "PYTHONUNBUFFERED": "0"}


def pod_env(kind: str, pods: int, pod: int, nproc: int, port: int, out: Path) -> dict[str, str]:
    """The environment the operator of `kind` gives pod number `pod` (its node rank) of `pods`."""
    env = clean_env(LAUNCH_TEST_OUT=str(out), OMP_NUM_THREADS="1", **POD)
    env.update(PET_NNODES=str(pods), PET_NPROC_PER_NODE=str(nproc), PET_NODE_RANK=str(pod))
    if kind == "pytorchjob":
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(pods * nproc), RANK=str(pod))
    else:
        env.update(PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port))
    return env


@pytest.mark.parametrize(("kind", "pods", "nproc"), [("pytorchjob", 2, 2), ("trainjob", 8, 1)])
def test_every_pod_runs_the_same_command_and_joins_one_group(
    tmp_path: Path, kind: str, pods: int, nproc: int
) -> None:
    port = free_port()
    procs = [start_launcher([DDP], pod_env(kind, pods, pod, nproc, port, tmp_path)) for pod in range(pods)]
    results = [finish(proc, timeout=240) for proc in procs]
    for pod, (code, out, err) in enumerate(results):
        assert code == 0, f"pod {pod}: exit {code}\n{out}\n{err}"
    world = pods * nproc
    found = reports(tmp_path)
    assert sorted(found) == list(range(world))
    for rank, report in found.items():
        env = report["env"]
        assert report["world"] == world
        assert report["all_reduce"] == world * (world + 1) / 2  # every rank's 1 + rank, summed over the one group
        assert report["grad"] == [report["expected"]] * 4  # DDP averaged the gradients over every rank
        assert (env["RANK"], env["WORLD_SIZE"]) == (str(rank), str(world))
        assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == (str(rank // nproc), str(pods))
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", str(port))
    if kind == "pytorchjob":
        assert all("store address from MASTER_ADDR=127.0.0.1" in err for _, _, err in results)
