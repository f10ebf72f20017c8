#!/bin/bash
# device run 6 (2026-11-30, nvidia-h200): rank_victims shared by the block's and the warp's pick
# (dynamic-1gpu, growth_kernels); cProfile of the uncaptured step directly and through the kernels
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
say installed
mkdir -p /tmp/r6
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu" OUT=/tmp/r6/suites timeout 230 bash tests/gpu/run_all.sh 1 > /tmp/r6/suites.log 2>&1
say "suites rc=$?"; grep -hE "passed|failed" /tmp/r6/suites.log | tail -3; grep -h -B2 -A20 "^FAILED\|Error" /tmp/r6/suites/*.log | head -30
cd /tmp
export PYTHONPATH=/tmp/site:$repo/bench
timeout 120 python3 $repo/bench/growth_kernels.py --repeats 3 --ways room,evict_drop --out /tmp/r6/gk.json > /tmp/r6/gk.log 2>&1
say "growth_kernels rc=$?"; grep -E "wall|evict_pick|/ room" /tmp/r6/gk.log | grep -v "^ *[0-9.]* us  [a-df-z]"
SOK1X_BENCH_PROFILE=/tmp/r6/prof-dlrm26.txt SOK1X_BENCH_PROFILE_RAW=1 SOK1X_BENCH_PROFILE_LINES=80 \
SOK1X_BENCH_VARIANTS=sok1x_kernels timeout 120 python3 $repo/bench/framework_step.py --workloads dlrm26 --repeats 5 --out /tmp/r6/fw_dlrm26.json > /tmp/r6/fw_dlrm26.log 2>&1
say "fw rc=$?"; grep -E "ms/step" /tmp/r6/fw_dlrm26.log
cd /tmp/r6 && tar czf $OUT/r6.tgz . && ls $OUT
