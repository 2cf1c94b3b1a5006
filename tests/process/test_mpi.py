"""Real MPI jobs on this machine, under Open MPI's mpirun and MPICH's Hydra mpiexec, in both patterns:

- one rank per MPI process: `mpirun -np 2 python rank.py`, whose `ddpboot.init()` reads the MPI launcher's
  variables (ddpboot/cluster/mpi.py: store on loopback, since every rank is on this host; the port from Open
  MPI's job id, or from the pid of Hydra's proxy, which started both ranks);
- one ddpboot launcher per "node": `mpirun -np 2 ddpboot --cpu --nproc 1 rank.py`, two launchers on this one host,
  each a node of its own (node rank = its MPI rank; ddpboot/nodes/static.py), one CPU rank each, gloo.

The tests skip, saying so, where the MPI launchers are missing (`scripts/ci/mpi-up` installs Debian's openmpi-bin
and mpich as root; `make test` runs it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DDPBOOT = Path(sys.executable).with_name("ddpboot")
TIMEOUT = 120

MPIRUNS = {
    # Open MPI refuses root without both variables, and 2 processes on fewer cores without --oversubscribe
    "openmpi": ["mpirun.openmpi", "--oversubscribe", "-np", "2"],
    "mpich": ["mpiexec.hydra", "-np", "2"],
}

RANK_SCRIPT = textwrap.dedent('''
    import json, os, sys, warnings
    import torch
    import torch.distributed as dist
    import ddpboot

    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always", ddpboot.DdpbootWarning)
        ctx = ddpboot.init()
    total = torch.tensor([float(ctx.rank + 1)])
    dist.all_reduce(total)
    report = {"rank": ctx.rank, "world_size": ctx.world_size, "local_rank": ctx.local_rank,
              "local_world_size": ctx.local_world_size, "node_rank": ctx.node_rank, "launcher": ctx.launcher,
              "backend": ctx.backend, "sum": total.item(), "master_port": os.environ.get("MASTER_PORT"),
              "warnings": [str(w.message) for w in got if issubclass(w.category, ddpboot.DdpbootWarning)]}
    with open(os.path.join(sys.argv[1], f"rank{ctx.rank}.json"), "w") as f:
        json.dump(report, f)
''')


def mpirun(flavour: str) -> list[str]:
    cmd = MPIRUNS[flavour]
    if shutil.which(cmd[0]) is None:
        pytest.skip(f"{cmd[0]} is not on PATH (apt-get install openmpi-bin mpich, or run scripts/ci/mpi-up as root)")
    return cmd


def env() -> dict[str, str]:
    """This environment without any launcher's variables, MPI's included (the suite may itself run under one)."""
    kept = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "TORCHELASTIC_", "DDPBOOT_", "PET_", "OMPI_", "PMI", "MPI_", "MV2_",
                                 "PALS_", "JSM_", "PBS_", "LSB_"))
            and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    kept.update(PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [kept.get("PYTHONPATH")])]),
                OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", OMPI_ALLOW_RUN_AS_ROOT="1",
                OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return kept


def run(cmd: list[str], tmp_path: Path) -> tuple[list[dict[str, Any]], str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([*cmd, str(script), str(out)], env=env(), cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reps = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return reps, proc.stdout + proc.stderr


@pytest.mark.parametrize("flavour", sorted(MPIRUNS))
def test_mpirun_starts_the_ranks(flavour: str, tmp_path: Path) -> None:
    reps, _ = run([*mpirun(flavour), sys.executable], tmp_path)
    for rank, r in enumerate(reps):
        assert (r["rank"], r["world_size"], r["local_rank"], r["local_world_size"], r["node_rank"]) == (
            rank, 2, rank, 2, 0)
        assert (r["launcher"], r["backend"], r["sum"], r["warnings"]) == ("mpi", "gloo", 3.0, [])
    assert reps[0]["master_port"] == reps[1]["master_port"] is not None  # both derived the same port


@pytest.mark.parametrize("flavour", sorted(MPIRUNS))
def test_mpirun_starts_one_launcher_per_node(flavour: str, tmp_path: Path) -> None:
    reps, output = run([*mpirun(flavour), str(DDPBOOT), "--cpu", "--nproc", "1"], tmp_path)
    for rank, r in enumerate(reps):
        assert (r["rank"], r["world_size"], r["local_rank"], r["local_world_size"], r["node_rank"]) == (
            rank, 2, 0, 1, rank)
        assert (r["launcher"], r["backend"], r["sum"], r["warnings"]) == ("ddpboot", "gloo", 3.0, [])
    assert output.count("MPI started 2 ddpboot launchers on this host") == 2
