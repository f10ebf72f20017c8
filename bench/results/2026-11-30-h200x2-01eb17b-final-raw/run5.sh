#!/bin/bash
# device run 5 (2026-11-30, nvidia-h200-x2): the final tree at 2 GPUs: suites, then dlrm26, dlrm26_hash, dlrm26_full replayed at 2 ranks
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r5
SOK1X_SUITE_TIMEOUT_S=150 SOK1X_SUITES="engine-2gpu replayed-ranks-2gpu nccl-2gpu" OUT=/tmp/r5/suites0 timeout 200 bash tests/gpu/run_all.sh 2 > /tmp/r5/suites0.log 2>&1
say "suites (no switch) rc=$?"; grep -hE "^== " /tmp/r5/suites0.log; grep -h -B2 -A12 "^FAILED\|Error" /tmp/r5/suites0/*.log | head -20
SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 SOK1X_SUITE_TIMEOUT_S=150 SOK1X_SUITES="replayed-ranks-2gpu dynamic-2gpu" OUT=/tmp/r5/suites1 timeout 200 bash tests/gpu/run_all.sh 2 > /tmp/r5/suites1.log 2>&1
say "suites (both switches) rc=$?"; grep -hE "^== " /tmp/r5/suites1.log; grep -h -B2 -A12 "^FAILED\|Error" /tmp/r5/suites1/*.log | head -20
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | grep -v "already exists" | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
for w in dlrm26 dlrm26_hash dlrm26_full; do
  PYTHONPATH=/tmp/site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 75 mpiexec -n 2 python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out /tmp/r5/fw2_$w.json > /tmp/r5/fw2_$w.log 2>&1
  say "$w rc=$?"; grep -E "sok1x_replayed|torch_dedup" /tmp/r5/fw2_$w.log | grep ms/step
done
cd /tmp/r5 && tar czf $OUT/r5.tgz . && ls $OUT
