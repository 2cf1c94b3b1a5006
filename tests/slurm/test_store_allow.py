"""Under SLURM node 0's store serves the job's nodes only: a 2-node `srun ddpboot` job on the test cluster, and a
client from an address outside the job's hosts refused before any answer (docs/security.md).

The test cluster's nodes n1 and n2 both resolve to 127.0.0.1 (/etc/hosts), so the job's hosts are that one address;
127.0.0.2 stands for a host outside the job. It is a loopback address, yet with an allow-list every source address
but 127.0.0.1 and ::1 (this machine's own) is judged by the list (ddpboot/tcpstore/allow.py), which is what makes
this test meaningful on one machine."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.slurm.helpers import slurm
from tests.support import GETNUMKEYS, SCRIPTS, VALIDATE, set_request, talk, wait_for

pytestmark = pytest.mark.slurm
BIN = Path(sys.executable).parent
JOB = SCRIPTS / "store_owner_job.py"


def test_a_host_outside_the_job_is_refused(tmp_path: Path, jobs: list[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    go = tmp_path / "go"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N2 --ntasks-per-node=1 -t 3 -J ddpboot-test -o {tmp_path}/out.txt\n"
        f"export PATH={BIN}:$PATH OMP_NUM_THREADS=1 LAUNCH_TEST_OUT={out} STORE_OWNER_GO={go} "
        "STORE_OWNER_KEYS=intruder\n"
        f'srun --ntasks-per-node=1 --ntasks="$SLURM_NNODES" ddpboot --nproc 1 --cpu {JOB}\n'
    )
    submitted = slurm("sbatch", "--parsable", str(script), cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    jobs.append(job_id)
    try:
        wait_for(lambda: len(list(out.glob("rank*.json"))) == 2, 180, "both ranks to report", interval=0.1)
        port = json.loads((out / "rank0.json").read_text())["master_port"]
        request = VALIDATE + set_request(b"intruder", b"x") + GETNUMKEYS
        outside = talk(port, request, "127.0.0.2")
        inside = talk(port, request, "127.0.0.1")
    finally:
        go.touch()
    wait_for(lambda: not slurm("squeue", "-h", "-j", job_id).stdout.strip(), 120, "the job to end", interval=0.1)
    text = (tmp_path / "out.txt").read_text()
    assert outside == "closed" and inside.startswith("answered"), (outside, inside, text[-3000:])
    assert "refused a connection from 127.0.0.2: only the job's hosts (the SLURM job's nodes n1, n2)" in text, text
    assert json.loads((out / "keys.json").read_text()) == {"intruder": True}, text[-3000:]
