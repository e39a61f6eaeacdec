#!/usr/bin/env bash
# Every GPU check in one run of a lent GPU machine, within BUDGET seconds (default 560: a 10-minute
# command limit holds with room for the transfers). From the repository root:
#
#     OUT=/some/dir bash benchmarks/gpu_session.sh
#
# In order: the NVML tests the suite skips without a driver (tests/unit/gpu), the NVML telemetry and
# health checks (benchmarks/health_checks_gpu.py: passive and active verdicts, a real head's /metrics and
# check job), then the bench checks (benchmarks/gpu_checks.py: GEMM, NCCL collectives, GPT training MFU),
# which get what is left of the budget. Optional inputs, each in a folder git ignores and the device tool
# carries:
# - .whl/: wheels for what the machine's Python lacks (docs/bench.md says which); installed to /tmp/site.
# - .nccl/: a source tree of NVIDIA's nccl-tests; its all_reduce_perf is built in the background with the
#   CUDA compiler and the NCCL of torch's wheels, and gpu_checks.py runs it beside our all-reduce.
# What comes back under $OUT (at most 8 files): session.log, pytest_gpu.txt, health.tar.gz,
# nccl_build.log, and bench/ (env.json, summary.json, checks.tar.gz).
set -u
OUT=${OUT:-/tmp/gpu-session}
BUDGET=${BUDGET:-560}
began=$(date +%s)
mkdir -p "$OUT/bench"
exec > >(tee "$OUT/session.log") 2>&1
elapsed() { echo $(($(date +%s) - began)); }
export PYTHONUNBUFFERED=1
echo "# $(date -u +%FT%TZ) on $(hostname): budget ${BUDGET}s"
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max \
  --format=csv 2>&1 | head -10

. benchmarks/gpu_python.sh || exit 3
echo "# $(elapsed)s: python $(python3 -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)')"

build_pid=
if [ -d .nccl/src ] && command -v nvcc > /dev/null; then
  (
    set -e
    nccl=${NCCL_DIR:-$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])')}
    mkdir -p /tmp/ncclhome/lib
    ln -sfn "$nccl/include" /tmp/ncclhome/include
    ln -sf "$nccl"/lib/libnccl.so.* /tmp/ncclhome/lib/
    ln -sf "$(ls "$nccl"/lib/libnccl.so.* | head -1)" /tmp/ncclhome/lib/libnccl.so
    cuda=${CUDA_HOME:-/usr/local/cuda}
    [ -x "$cuda/bin/nvcc" ] || cuda=$(dirname "$(dirname "$(command -v nvcc)")")
    echo "$cuda/lib64:$cuda/lib" > /tmp/ncclhome/cuda_libs
    timeout 300 make -C .nccl/src -j 12 MPI=0 BUILDDIR=/tmp/nccl-build NCCL_HOME=/tmp/ncclhome \
      CUDA_HOME="$cuda" NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" /tmp/nccl-build/all_reduce_perf
  ) > "$OUT/nccl_build.log" 2>&1 &
  build_pid=$!
fi

echo "# $(elapsed)s: NVML tests"
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/unit/gpu > "$OUT/pytest_gpu.txt" 2>&1
rc=$?
echo "pytest tests/unit/gpu: exit $rc ($(tail -1 "$OUT/pytest_gpu.txt"))"

echo "# $(elapsed)s: telemetry and health checks"
rm -rf /tmp/health && timeout 200 python3 benchmarks/health_checks_gpu.py --out /tmp/health --level both \
  > /tmp/health.log 2>&1
echo "health_checks_gpu.py: exit $?"
cp /tmp/health.log /tmp/health/stdout.log 2>/dev/null
tail -60 /tmp/health.log
tar -czf "$OUT/health.tar.gz" -C /tmp health

if [ -n "$build_pid" ]; then
  wait "$build_pid"
  rc=$?
  echo "# $(elapsed)s: nccl-tests build: exit $rc ($(tail -1 "$OUT/nccl_build.log"))"
  if [ -x /tmp/nccl-build/all_reduce_perf ]; then
    export NCCL_TESTS_DIR=/tmp/nccl-build
    export LD_LIBRARY_PATH="/tmp/ncclhome/lib:$(cat /tmp/ncclhome/cuda_libs)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    ldd /tmp/nccl-build/all_reduce_perf | grep -E "nccl|cudart"
  fi
fi

left=$((BUDGET - $(elapsed) - 10))
echo "# $(elapsed)s: bench checks, ${left}s left"
python3 benchmarks/gpu_checks.py --out "$OUT/bench" --budget-seconds "$left"
rc=$?
echo "# $(elapsed)s: gpu_checks.py exit $rc"
