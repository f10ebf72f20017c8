#!/bin/bash
# device run 9 (2026-12-01, nvidia-h200): a one-rank evicting step in place leaves its counts to the backward's header (before 44c74d5 / after): growth_kernels A/B, growth_step, dlrm26_full uncaptured; GPU suites on the after tree (the warp_count/warp_claim kernels too)
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r9
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
cd /tmp
for tree in after before after before; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 5 --out /tmp/r9/gk_${tree}_$SECONDS.json > /tmp/r9/gk_${tree}_$SECONDS.log 2>&1
  say "growth_kernels $tree rc=$?"; grep -hE "^(room|evict_drop|evict_device): wall|/ room" $(ls -t /tmp/r9/gk_${tree}_*.log | head -1)
done
for tree in after before; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 120 python3 $repo/bench/growth_step.py --ways room,evict,evict_drop,evict_device --repeats 5 --out /tmp/r9/growth_step_$tree.json > /tmp/r9/growth_step_$tree.log 2>&1
  say "growth_step $tree rc=$?"; grep -E "rank\(s\)" /tmp/r9/growth_step_$tree.log
done
for tree in after before; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench SOK1X_BENCH_VARIANTS=sok1x_device,torch_dedup timeout 120 python3 $repo/bench/framework_step.py --workloads dlrm26_full --repeats 5 --out /tmp/r9/fw_full_$tree.json > /tmp/r9/fw_full_$tree.log 2>&1
  say "dlrm26_full $tree rc=$?"; grep -E "ms/step|python_us|waits" /tmp/r9/fw_full_$tree.log | head -6
done
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu host-order table-groups-1gpu replayed-keyed-1gpu" OUT=/tmp/r9/suites timeout 420 bash tests/gpu/run_all.sh 1 > /tmp/r9/suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r9/suites.log; grep -h -B2 -A20 "^FAILED\|Error" /tmp/r9/suites/*.log | head -40
cd /tmp/r9 && tar czf $OUT/r9.tgz . && ls $OUT
