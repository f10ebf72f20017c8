#!/bin/bash
# device run 2 (2026-11-30, nvidia-h200-x2): dlrm26_full at 2 ranks, before (.carry-before: HEAD) and after (this tree), alternated twice
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r2
SOK1X_SUITE_TIMEOUT_S=120 SOK1X_SUITES="replayed-keyed-1gpu" OUT=/tmp/r2/suites timeout 140 bash tests/gpu/run_all.sh 2 > /tmp/r2/suites.log 2>&1
say "replayed-keyed-1gpu rc=$?"; grep -hE "^== " /tmp/r2/suites.log; grep -h -B2 -A12 "^FAILED\|Error" /tmp/r2/suites/*.log | head -20
for tree in before after; do
  python3 -m pip install -q --no-index --no-deps --target /tmp/$tree-site .device-wheels/*.whl 2>&1 | tail -1
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/before-site ./.carry-before 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/after-site . 2>&1 | tail -1
say installed
cd /tmp
for round in 1 2; do
  for tree in before after; do
    PYTHONPATH=/tmp/$tree-site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 100 mpiexec -n 2 python3 $repo/bench/framework_step.py --workloads dlrm26_full --repeats 5 --out /tmp/r2/fw2_${tree}_$round.json > /tmp/r2/fw2_${tree}_$round.log 2>&1
    say "$tree $round rc=$?"; grep -E "ms/step" /tmp/r2/fw2_${tree}_$round.log; grep -E "per step of sok1x_replayed" /tmp/r2/fw2_${tree}_$round.log | cut -c1-300
  done
done
cd /tmp/r2 && tar czf $OUT/r2.tgz . && ls $OUT
