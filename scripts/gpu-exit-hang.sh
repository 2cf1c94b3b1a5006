#!/usr/bin/env bash
# Does a rank that leaves while its peer waits in an NCCL collective end the job, and how fast? (docs/guide.md,
# "Known problem"). Four variants of a 2-rank job in which rank 1 exits (sys.exit(3)) between two all_reduces:
#   init      ddpboot.init() (destroys the process group at exit)
#   destroy   plain torch.distributed, destroy_process_group() in a finally block
#   plain     plain torch.distributed, no destroy (torch's own teardown at exit)
#   abort     plain torch.distributed, rank 1 aborts its communicators before leaving (private torch API)
# Each runs under `timeout`; the log shows the launcher's exit code and wall time per variant.
# Usage: scripts/gpu-exit-hang.sh OUTDIR [SECONDS]   (default limit 90 s per variant)
set -uo pipefail
out=${1:?usage: scripts/gpu-exit-hang.sh OUTDIR [SECONDS]}
limit=${2:-90}
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
job="$out/exit_job.py"
cat > "$job" <<'PY'
import os, sys
import torch
import torch.distributed as dist

variant = sys.argv[1]
if variant == "init":
    import ddpboot
    ctx = ddpboot.init()
    rank, device = ctx.rank, ctx.device
else:
    torch.cuda.set_device(0)  # ddpboot's rank isolation: each rank sees only its own GPU
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    rank, device = dist.get_rank(), torch.device("cuda", 0)
t = torch.ones(1, device=device)
try:
    dist.all_reduce(t)
    torch.cuda.synchronize()
    if rank == 1:
        if variant == "abort":
            dist.distributed_c10d._abort_process_group()
        sys.exit(3)
    dist.all_reduce(t)  # rank 0 waits here for rank 1, which is leaving
    torch.cuda.synchronize()
finally:
    if variant == "destroy" and dist.is_initialized():
        dist.destroy_process_group()
PY
for variant in init destroy plain abort; do
    start=$(date +%s%N)
    timeout -k 10 "$limit" python3 -m ddpboot --nproc 2 "$job" "$variant" > "$out/$variant.log" 2>&1
    rc=$?
    took=$(( ($(date +%s%N) - start) / 1000000 ))
    echo "$variant: exit $rc after ${took} ms$([ $rc = 124 ] && echo " (still running at ${limit} s)")" | tee -a "$out/summary.txt"
done
