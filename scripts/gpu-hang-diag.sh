#!/usr/bin/env bash
# Hang diagnosis on GPUs (docs/guide.md, "When a job hangs"): the destroy-in-finally NCCL hang of
# scripts/gpu-exit-hang.sh (rank 1 leaves with sys.exit(3) while rank 0 waits in an all_reduce; both have
# dist.destroy_process_group() in a finally) run under ddpboot with --stall-timeout, so that:
#   1. `ddpboot stacks --json` while it hangs names each rank's frame (on demand),
#   2. the job ends at --stall-timeout with every rank's stack in the run directory (py-spy backend),
#   3. the same with the ranks' faulthandler (--fast-start, DDPBOOT_STACKS_BACKEND=faulthandler),
# and samples the ranks' CPU state while they hang (which progress signals hold on NCCL).
# With one GPU, the same job runs on two CPU ranks (gloo) instead, to show the backends on this machine.
# Usage: scripts/gpu-hang-diag.sh OUTDIR [STALL_SECONDS]   (default 30; each case is bounded by `timeout`)
# Exit 0 only when every check passed; summary.txt says which failed.
set -uo pipefail
out=${1:?usage: scripts/gpu-hang-diag.sh OUTDIR [STALL_SECONDS]}
stall=${2:-30}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${gpus:-0}" -ge 2 ]; then mode=(--nproc 2); backend=nccl; else mode=(--cpu --nproc 2); backend=gloo; fi
echo "GPUs: ${gpus:-0}; job: ${mode[*]} ($backend); py-spy: $(command -v py-spy || echo missing)" | tee "$out/summary.txt"
job="$out/hang_job.py"
cat > "$job" <<'PY'
import sys
import time
import torch
import torch.distributed as dist

backend = sys.argv[1]
if backend == "nccl":
    torch.cuda.set_device(0)  # rank isolation: each rank sees only its own GPU
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    device = torch.device("cuda", 0)
else:
    dist.init_process_group("gloo")
    device = torch.device("cpu")
rank = dist.get_rank()
t = torch.ones(1, device=device)
try:
    dist.all_reduce(t)
    if device.type == "cuda":
        torch.cuda.synchronize()
    print(f"rank {rank}: first all_reduce done", flush=True)
    if rank == 1:
        if backend == "gloo":  # a gloo peer that exits breaks the collective at once; one that stays away hangs it
            time.sleep(3600)
        sys.exit(3)
    dist.all_reduce(t, async_op=backend == "gloo")  # rank 0 waits here for rank 1, which is leaving
    if device.type == "cuda":
        torch.cuda.synchronize()
finally:
    dist.destroy_process_group()
PY
fail=0
check() {  # check NAME COMMAND...: run a check, note pass/fail
    local name=$1; shift
    if "$@"; then echo "PASS $name" | tee -a "$out/summary.txt"; else echo "FAIL $name" | tee -a "$out/summary.txt"; fail=1; fi
}
sample_cpu() {  # sample_cpu PID FILE: the ranks' state (R running, S sleeping) and CPU, every 2 s while PID runs
    local launcher=$1 file=$2
    while kill -0 "$launcher" 2>/dev/null; do
        { date +%T; ps -eo pid,stat,pcpu,cputime,args | grep "[h]ang_job.py"; } >> "$file"
        sleep 2
    done
}
run_case() {  # run_case NAME EXTRA_ENV... -- EXTRA_ARGS...
    local name=$1; shift
    local envs=() args=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
    [ $# -gt 0 ] && shift
    args=("$@")
    local logs="$out/$name/logs"
    mkdir -p "$out/$name"
    local start=$(date +%s)
    env "${envs[@]}" timeout -k 10 $((stall * 4 + 120)) python3 -m ddpboot "${mode[@]}" --log-dir "$logs" \
        --stall-timeout "$stall" --shutdown-timeout 5 "${args[@]}" "$job" "$backend" \
        > "$out/$name/stdout.log" 2> "$out/$name/stderr.log" &
    local pid=$!
    sample_cpu "$pid" "$out/$name/cpu.txt" &
    if [ "$name" = pyspy ]; then  # on demand, once the ranks hang
        for _ in $(seq 1 60); do grep -q "rank 0: first all_reduce done" "$out/$name/stdout.log" && break; sleep 1; done
        sleep 5
        python3 -m ddpboot stacks "$(ls -d "$logs"/*/ | head -1)" --json > "$out/$name/on_demand.json" \
            2> "$out/$name/on_demand.err"
        echo "on demand: $(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print("; ".join("rank %s: %s" % (r["rank"], r["summary"] or r["problem"]) for r in d["ranks"]))' \
            "$out/$name/on_demand.json" 2>&1)" | tee -a "$out/summary.txt"
        check "$name: on-demand dump names rank 0's collective" grep -q '"summary": "\(all_reduce\|destroy_process_group\|wait\)' "$out/$name/on_demand.json"
    fi
    wait "$pid"; local rc=$?
    echo "$name: launcher exit $rc after $(( $(date +%s) - start )) s" | tee -a "$out/summary.txt"
    grep "ddpboot:   rank\|no progress" "$out/$name/stderr.log" | tee -a "$out/summary.txt"
    check "$name: stopped at --stall-timeout" grep -q "no progress for $stall s" "$out/$name/stderr.log"
    check "$name: every rank's stack in the run directory" bash -c "ls $logs/*/stacks-*.txt >/dev/null 2>&1 && grep -q 'stacks: end (' $logs/*/stacks-*.txt"
    check "$name: summary names a torch.distributed call for rank 0" grep -q "rank 0 ([^)]*): \(all_reduce\|destroy_process_group\|wait\|barrier\)" "$out/$name/stderr.log"
}
run_case pyspy DDPBOOT_STACKS_BACKEND=auto --
run_case faulthandler DDPBOOT_STACKS_BACKEND=faulthandler -- --fast-start
ls -R "$out" > "$out/files.txt"
echo "done: $([ $fail = 0 ] && echo all checks passed || echo some checks FAILED)" | tee -a "$out/summary.txt"
exit $fail
