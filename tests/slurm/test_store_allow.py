"""Under SLURM node 0's store serves the job's nodes only: a 2-node `srun ddpboot` job on the test cluster, and a
client from an address outside the job's hosts refused before any answer (docs/security.md).

The test cluster's nodes n1 and n2 both resolve to 127.0.0.1 (/etc/hosts), so the job's hosts are that one address;
127.0.0.2 stands for a host outside the job. It is a loopback address, yet with an allow-list every source address
but 127.0.0.1 and ::1 (this machine's own) is judged by the list (ddpboot/tcpstore/allow.py), which is what makes
this test meaningful on one machine."""

from __future__ import annotations

import json
import socket
import struct
import sys
from pathlib import Path

import pytest

from tests.slurm.helpers import slurm, wait_for
from tests.support import SCRIPTS

pytestmark = pytest.mark.slurm
BIN = Path(sys.executable).parent
JOB = SCRIPTS / "store_owner_job.py"


def _vec(data: bytes) -> bytes:
    return struct.pack("=Q", len(data)) + data


# torch's TCPStore protocol: VALIDATE with its magic number, SET intruder x, GETNUMKEYS (answered with 8 bytes).
_REQUESTS = struct.pack("=BI", 0, 0x3C85F7CE) + struct.pack("=B", 1) + _vec(b"intruder") + _vec(b"x") + b"\x07"


def _talk(port: int, source: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=20, source_address=(source, 0)) as sock:
        try:
            sock.sendall(_REQUESTS)
            answer = sock.recv(64)
        except (ConnectionResetError, BrokenPipeError):
            return "closed"
        return "closed" if not answer else "answered"


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
        wait_for("both ranks to report", lambda: len(list(out.glob("rank*.json"))) == 2, 180)
        port = json.loads((out / "rank0.json").read_text())["master_port"]
        outside = _talk(port, "127.0.0.2")
        inside = _talk(port, "127.0.0.1")
    finally:
        go.touch()
    wait_for("the job to end", lambda: not slurm("squeue", "-h", "-j", job_id).stdout.strip(), 120)
    text = (tmp_path / "out.txt").read_text()
    assert (outside, inside) == ("closed", "answered"), text[-3000:]
    assert "refused a connection from 127.0.0.2: only the job's hosts (the SLURM job's nodes n1, n2)" in text, text
    assert json.loads((out / "keys.json").read_text()) == {"intruder": True}, text[-3000:]
