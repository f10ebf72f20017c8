#!/bin/bash
# device run 6 (2026-12-01, nvidia-h200): a bounded backward's places counted as they are found (count_segments gone): suites, kernels, before/after
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r6
SOK1X_SUITE_TIMEOUT_S=100 SOK1X_SUITES="bounded-step-1gpu replayed-keyed-1gpu" OUT=/tmp/r6/suites timeout 220 bash tests/gpu/run_all.sh 1 > /tmp/r6/suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r6/suites.log; grep -h -B2 -A12 "^FAILED\|Error" /tmp/r6/suites/*.log | head -30
for tree in before after; do
  python3 -m pip install -q --no-index --no-deps --target /tmp/$tree-site .device-wheels/*.whl 2>&1 | grep -v "already exists" | tail -1
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/before-site ./.carry-before 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/after-site . 2>&1 | tail -1
cd /tmp
PYTHONPATH=/tmp/after-site:$repo/bench SOK1X_BOUNDED_STEP=1 timeout 60 python3 $repo/bench/gpu_busy.py dlrm26 20 replayed > /tmp/r6/busy1_dlrm26_after.log 2>&1
say "busy after rc=$?"; grep -A14 "rank 0 of" /tmp/r6/busy1_dlrm26_after.log
for round in 1 2; do
  for tree in before after; do
    for w in dlrm26 dlrm; do
      [ $round = 2 ] && [ $w = dlrm ] && continue
      PYTHONPATH=/tmp/$tree-site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 70 python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out /tmp/r6/fw_${w}_${tree}_$round.json > /tmp/r6/fw_${w}_${tree}_$round.log 2>&1
      say "$w $tree $round rc=$?"; grep -E "sok1x_replayed|torch_dedup" /tmp/r6/fw_${w}_${tree}_$round.log | grep -E "ms/step"; grep -o "'python_us': [0-9.]*\|'host_pace_us': [0-9.]*" /tmp/r6/fw_${w}_${tree}_$round.log | sed -n '5,6p' | tr '\n' ' '; echo
    done
  done
done
cd /tmp/r6 && tar czf $OUT/r6.tgz . && ls $OUT
