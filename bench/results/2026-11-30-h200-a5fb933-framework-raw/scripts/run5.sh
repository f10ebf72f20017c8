#!/bin/bash
# device run 5 (2026-11-30, nvidia-h200-x2): the warp pick at 2 ranks: suites, then dlrm26_full and dlrm26_hash at 2 ranks
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
say installed
mkdir -p /tmp/r5
SOK1X_SUITE_TIMEOUT_S=150 SOK1X_SUITES="replayed-ranks-2gpu" OUT=/tmp/r5/suites0 timeout 170 bash tests/gpu/run_all.sh 2 > /tmp/r5/suites0.log 2>&1
say "replayed-ranks rc=$?"; grep -hE "passed|failed" /tmp/r5/suites0.log | tail -3
SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-2gpu table-groups-2gpu" OUT=/tmp/r5/suites timeout 330 bash tests/gpu/run_all.sh 2 > /tmp/r5/suites.log 2>&1
say "suites rc=$?"; grep -hE "passed|failed" /tmp/r5/suites.log | tail -4; grep -h -B2 -A15 "^FAILED\|Error" /tmp/r5/suites/*.log | head -30
cd /tmp
export PYTHONPATH=/tmp/site:$repo/bench
for w in dlrm26_full dlrm26_hash; do
  SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels_replayed,torch_dedup timeout 120 mpiexec -n 2 python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out /tmp/r5/fw2_$w.json > /tmp/r5/fw2_$w.log 2>&1
  say "fw $w rc=$?"; grep -E "ms/step" /tmp/r5/fw2_$w.log; grep -E "per step of sok1x_replayed" /tmp/r5/fw2_$w.log | cut -c1-400
done
cd /tmp/r5 && tar czf $OUT/r5.tgz . && ls $OUT
