#!/bin/bash
# device run 4 (2026-11-30, nvidia-h200-x2): a replayed several-rank backward's sums zero only the rows an earlier replay stored a sum in (kept_sums at several ranks): suites, kernels, before/after
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r4
SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 SOK1X_SUITE_TIMEOUT_S=150 SOK1X_SUITES="replayed-ranks-2gpu table-groups-2gpu dynamic-2gpu" OUT=/tmp/r4/suites timeout 260 bash tests/gpu/run_all.sh 2 > /tmp/r4/suites.log 2>&1
say "suites (both switches) rc=$?"; grep -hE "^== " /tmp/r4/suites.log; grep -h -B2 -A12 "^FAILED\|Error" /tmp/r4/suites/*.log | head -30
SOK1X_SUITE_TIMEOUT_S=60 SOK1X_SUITES="replayed-ranks-2gpu" OUT=/tmp/r4/suites0 timeout 80 bash tests/gpu/run_all.sh 2 > /tmp/r4/suites0.log 2>&1
say "replayed-ranks (no switch) rc=$?"; grep -hE "^== " /tmp/r4/suites0.log
for tree in before after; do
  python3 -m pip install -q --no-index --no-deps --target /tmp/$tree-site .device-wheels/*.whl 2>&1 | grep -v "already exists" | tail -1
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/before-site ./.carry-before 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/after-site . 2>&1 | tail -1
cd /tmp
PYTHONPATH=/tmp/after-site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 timeout 60 mpiexec -n 2 python3 $repo/bench/gpu_busy.py dlrm26 20 replayed > /tmp/r4/busy2_dlrm26_after.log 2>&1
say "busy after rc=$?"; grep -A8 "rank 0 of" /tmp/r4/busy2_dlrm26_after.log
for round in 1 2; do
  for tree in before after; do
    for w in dlrm26_hash dlrm26; do
      PYTHONPATH=/tmp/$tree-site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 70 mpiexec -n 2 python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out /tmp/r4/fw2_${w}_${tree}_$round.json > /tmp/r4/fw2_${w}_${tree}_$round.log 2>&1
      say "$w $tree $round rc=$?"; grep -E "sok1x_replayed|torch_dedup" /tmp/r4/fw2_${w}_${tree}_$round.log | grep ms/step
    done
  done
done
cd /tmp/r4 && tar czf $OUT/r4.tgz . && ls $OUT
