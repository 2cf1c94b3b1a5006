#!/usr/bin/env bash
# Verify ddpboot on a GPU machine: the gpu-marked tests, the headline commands with GPU 0 made busy, and smoke.
# Usage: scripts/gpu-verify.sh OUTDIR   (logs and JSON reports go there)
set -uo pipefail
out=${1:?usage: scripts/gpu-verify.sh OUTDIR}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
D="python3 -m ddpboot"
step() { echo; echo "=== $*"; }
{
step "machine"; nvidia-smi -L; nvidia-smi topo -m
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"

step "gpu-marked tests"
timeout 420 python3 -m pytest -q -m gpu -p no:cacheprovider tests/gpu tests/process/test_worker_api.py 2>&1 | tail -25

step "GPU 0 made busy by another process"
rm -f /tmp/hog.ready
python3 -c "import torch, time, pathlib; x = torch.ones(2 * 2**30, device='cuda:0'); torch.cuda.synchronize(); pathlib.Path('/tmp/hog.ready').touch(); time.sleep(300)" &
hog=$!
for _ in $(seq 300); do [ -e /tmp/hog.ready ] && break; sleep 0.1; done
$D gpus
$D plan --nproc 1 --exclude 0
$D plan --nproc 2 || echo "exit $? (expected: GPU 0 is busy, only 1 free GPU)"
step "train on GPU 1 only while GPU 0 is busy; GPU 0 sampled"
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader -lms 100 > "$out/mem-during-exclude0.csv" &
smi=$!
$D --nproc 1 --exclude 0 examples/train.py --steps 300
kill $smi
awk -F', ' '$1==0 {print $2}' "$out/mem-during-exclude0.csv" | sort -u | tr '\n' ' '; echo "<- GPU 0 used memory values seen during the run"
kill $hog; wait $hog 2>/dev/null

step "both GPUs: ddpboot-native and torchrun-style, both isolation modes, explicit order"
$D --nproc 2 examples/train.py --steps 300
$D --nproc 2 examples/torchrun_style.py --epochs 2
$D --nproc 2 --isolation node examples/torchrun_style.py --epochs 2
$D --gpus 1,0 --no-prefix tests/gpu/probe_rank.py

step "smoke: both GPUs, then excluding GPU 0"
$D smoke --nproc 2 --max-bytes 1GiB --json --junit-xml "$out/smoke2.xml" > "$out/smoke2.json"; echo "exit $?"
$D smoke --nproc 2 --max-bytes 1GiB
$D smoke --nproc 1 --exclude 0 --max-bytes 256MiB --json > "$out/smoke-exclude0.json"; echo "exit $?"
$D smoke --nproc 1 --exclude 0 --max-bytes 256MiB
} 2>&1 | tee "$out/gpu-verify.log"
