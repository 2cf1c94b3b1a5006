"""pytorchjob_master: node 0's address from a Kubeflow PyTorchJob pod's MASTER_ADDR/MASTER_PORT, and nowhere else."""

from __future__ import annotations

import pytest

from ddpboot.cluster.kubernetes import PodMaster, pytorchjob_master

# What the training-operator gives the pod of worker 0 (node rank 1) of a PyTorchJob with a master and one worker.
PYTORCHJOB_WORKER = {
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "4",
    "PET_NODE_RANK": "1",
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "8",
    "RANK": "1",
    "PYTHONUNBUFFERED": "0",
}


def test_a_pytorchjob_pod_names_node_0_by_master_addr() -> None:
    pod = pytorchjob_master(PYTORCHJOB_WORKER)
    assert pod == PodMaster("job-master-0", 23456)
    assert "MASTER_ADDR=job-master-0, MASTER_PORT=23456" in pod.note()


def test_a_port_that_is_not_one_leaves_the_default() -> None:
    assert pytorchjob_master({**PYTORCHJOB_WORKER, "MASTER_PORT": "70000"}) == PodMaster("job-master-0", None)
    assert pytorchjob_master({**PYTORCHJOB_WORKER, "MASTER_PORT": ""}) == PodMaster("job-master-0", None)


@pytest.mark.parametrize(
    "change",
    [
        {"KUBERNETES_SERVICE_HOST": ""},  # not a pod: a MASTER_ADDR left in a shell steers nothing
        {"PET_MASTER_ADDR": "job-node-0-0.job"},  # a TrainJob: PET_MASTER_ADDR says it, as torchrun reads it
        {"MASTER_ADDR": ""},
        {"PET_NNODES": "1"},  # one node: its store is local
        {"PET_NNODES": ""},
        {"PET_NODE_RANK": ""},
    ],
)
def test_anywhere_else_it_is_none(change: dict[str, str]) -> None:
    assert pytorchjob_master({**PYTORCHJOB_WORKER, **change}) is None
