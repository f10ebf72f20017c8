#!/bin/bash
# device run 26 (2026-12-01, nvidia-h200): b7bd934 (after) against 4c93219 (before): growth_kernels
# alternated twice (all kernels listed); framework_step dlrm26_full of each tree; GPU suites on after
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
cd /tmp
for tree in before after before after; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 3 --top 40 --ways room,evict_drop,evict_device --out $OUT/growth_${tree}_$SECONDS.json > $OUT/g_${tree}_$SECONDS.log 2>&1
  say "growth $tree rc=$?"; grep -hE "wall|evict_unserved|move_rows|hash_erase|evict_pick\b" $(ls -t $OUT/g_${tree}_*.log | head -1)
done
for tree in after before; do
  SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 150 python3 $repo/bench/framework_step.py --workloads dlrm26_full --repeats 5 --out $OUT/fw_full_$tree.json > $OUT/fw_full_$tree.log 2>&1
  say "framework dlrm26_full $tree rc=$?"; grep -hE "dlrm26_full|python_us|torch" $OUT/fw_full_$tree.log | grep -v "^ " | head -8
done
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu table-groups-1gpu replayed-keyed-1gpu bounded-step-1gpu replayed-step-1gpu" OUT=/tmp/suites bash tests/gpu/run_all.sh 1 > /tmp/suites.log 2>&1
say "suites rc=$?"; grep -E "passed|failed|error" /tmp/suites.log | tail -12
grep -hE "FAILED|Error" /tmp/suites/*.log | head -20
