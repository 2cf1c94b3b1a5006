"""Kubernetes: where the launcher in a Kubeflow pod finds node 0's store when the pod's environment names it only
as MASTER_ADDR / MASTER_PORT.

Kubeflow's two job kinds give every pod torchrun's `PET_*` variables, which the launcher reads as the defaults of
its node options (`--nnodes` from PET_NNODES, ...):

- a **TrainJob** (Kubeflow Trainer, the torch plugin) sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the pod's
  job completion index), PET_MASTER_ADDR (`<job>-node-0-0.<job>`) and PET_MASTER_PORT: everything a node needs.
- a **PyTorchJob** (training-operator, kubeflow.org/v1) sets PET_NNODES, PET_NPROC_PER_NODE and PET_NODE_RANK, but
  names node 0 only as MASTER_ADDR (`<job>-master-0`) and MASTER_PORT (the container port `pytorchjob-port`), with
  WORLD_SIZE (pods × processes per pod) and RANK (the pod's index) beside them, as for a script run without a
  launcher.

`pytorchjob_master` reads the second case: the launcher takes MASTER_ADDR / MASTER_PORT as node 0's address only in
a pod (KUBERNETES_SERVICE_HOST, which Kubernetes sets in every container) of several nodes that gives no
PET_MASTER_ADDR, so a MASTER_ADDR left in a shell elsewhere never steers a launcher. Pure: reads only `env`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ddpboot.cluster.base import parse_port
from ddpboot.errors import WorkerEnvError

POD_VAR = "KUBERNETES_SERVICE_HOST"
"""Set by Kubernetes in every container of every pod (also with `enableServiceLinks: false`)."""


class PodMaster(NamedTuple):
    """Node 0's store address as a PyTorchJob pod's environment gives it."""

    addr: str
    port: int | None  # None when MASTER_PORT is unset or not a port: the launcher's default then applies

    def note(self) -> str:
        port = "" if self.port is None else f", MASTER_PORT={self.port}"
        return (f"store address from MASTER_ADDR={self.addr}{port}: a Kubeflow PyTorchJob pod, which gives "
                "PET_NNODES and PET_NODE_RANK but no PET_MASTER_ADDR")


def pytorchjob_master(env: Mapping[str, str]) -> PodMaster | None:
    """MASTER_ADDR (and MASTER_PORT) of a PyTorchJob pod of several nodes; None anywhere else (see the module
    docstring for what counts as one)."""
    addr = env.get("MASTER_ADDR", "").strip()
    if not addr or env.get("PET_MASTER_ADDR", "").strip() or not env.get(POD_VAR, "").strip():
        return None
    nnodes = env.get("PET_NNODES", "").strip()
    if not env.get("PET_NODE_RANK", "").strip() or not nnodes or nnodes == "1":
        return None
    raw_port = env.get("MASTER_PORT", "")
    try:
        port = parse_port("MASTER_PORT", raw_port) if raw_port.strip() else None
    except WorkerEnvError:
        port = None
    return PodMaster(addr, port)
