#!/bin/bash
# device run 4 (2026-11-30): the warp pick's selection; growth A/B, suites, growth_step, dlrm26_full
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
cd /tmp
for tree in after before after before; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 5 --out $OUT/growth_${tree}_$SECONDS.json > $OUT/g.log 2>&1
  say "growth $tree rc=$?"; grep -E "wall" $OUT/g.log | grep -v "^ "; grep -E "evict_pick|/ room" $OUT/g.log | head -4
done
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu table-groups-1gpu replayed-keyed-1gpu" OUT=/tmp/suites timeout 300 bash tests/gpu/run_all.sh 1 > /tmp/suites.log 2>&1
say "suites rc=$?"; grep -hE "passed|failed|error" /tmp/suites.log | tail -4; grep -h -B2 -A20 "^FAILED\|Error" /tmp/suites/dynamic-1gpu.log | head -40
cd /tmp
export PYTHONPATH=/tmp/after-site:$repo/bench
timeout 100 python3 $repo/bench/growth_step.py --ways room,evict_drop,evict_device --repeats 5 --out $OUT/growth_step.json > $OUT/growth_step.log 2>&1
say "growth_step rc=$?"; grep -E "rank\(s\)" $OUT/growth_step.log
SOK1X_BOUNDED_STEP=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 120 python3 $repo/bench/framework_step.py --workloads dlrm26_full --out $OUT/fw_full.json > $OUT/fw_full.log 2>&1
say "fw rc=$?"; tail -4 $OUT/fw_full.log
