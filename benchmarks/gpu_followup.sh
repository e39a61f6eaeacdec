#!/usr/bin/env bash
# A second, short device run after benchmarks/gpu_session.sh (about 2 minutes on one H200):
# - the full-level health checks again (their memory test ran out of memory on the first run);
# - bf16 GEMM at 8192 and 16384 for longer (-n 400) while nvidia-smi and gpupool's NVML provider sample SM
#   clock, power, temperature and throttle reasons every 100 ms: why the largest size ran below 70% of the dense peak;
# - the 124M GPT at micro-batch 16, 32 and 64: how MFU moves with the batch.
# Files under $OUT: followup.log, health_full.tar.gz, gemm_smi.csv, gemm_clocks.jsonl (gpupool's NVML
# sampler), gemm.txt, train_mb{16,32,64}.json.
set -u
OUT=${OUT:-/tmp/gpu-followup}
mkdir -p "$OUT"
exec > >(tee "$OUT/followup.log") 2>&1
export PYTHONUNBUFFERED=1
. benchmarks/gpu_python.sh || exit 3

echo "# $(date -u +%TZ) full health checks"
rm -rf /tmp/hf && timeout 150 python3 benchmarks/health_checks_gpu.py --out /tmp/hf --level full > /tmp/hf.log 2>&1
echo "health_checks_gpu.py --level full: exit $?"
cp /tmp/hf.log /tmp/hf/stdout.log; tail -40 /tmp/hf.log
tar -czf "$OUT/health_full.tar.gz" -C /tmp hf

echo "# $(date -u +%TZ) GEMM with clocks"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv -lms 100 \
  > "$OUT/gemm_smi.csv" 2>&1 &
smi=$!
python3 - 60 "$OUT/gemm_clocks.jsonl" <<'PY' &
import json, sys, time
from gpupool.gpu.nvml import NvmlProvider  # gpupool's own telemetry, as the agents sample it
provider, end = NvmlProvider(), time.time() + float(sys.argv[1])
keys = ("at", "utilization_pct", "sm_clock_mhz", "mem_clock_mhz", "power_w", "temperature_c",
        "memory_temperature_c", "throttle_reasons")
with open(sys.argv[2], "w") as out:
    while time.time() < end:
        for sample in provider.sample():
            out.write(json.dumps({k: getattr(sample, k) for k in keys}) + "\n")
        out.flush()
        time.sleep(0.1)
PY
sampler=$!
sleep 1
timeout 120 python3 -m gpupool.main bench gemm --dtype bf16 --device 0 --sizes 8192,16384 -n 400 > "$OUT/gemm.txt" 2>&1
echo "gemm: exit $?"; cat "$OUT/gemm.txt"
sleep 1; kill $smi $sampler

for mb in 16 32 64; do
  echo "# $(date -u +%TZ) train micro-batch $mb"
  timeout 90 python3 -m gpupool.main bench train --layers 12 --hidden 768 --heads 12 --seq 1024 --vocab 50304 \
    --micro-batch $mb --precision bf16 -n 10 -w 3 --json "$OUT/train_mb$mb.json" | tail -3
done
echo "# $(date -u +%TZ) done"
