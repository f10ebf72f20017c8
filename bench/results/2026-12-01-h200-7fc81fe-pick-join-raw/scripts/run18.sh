#!/bin/bash
# device run 18 (2026-12-01, nvidia-h200): evict_pick's selection by the warp's min reductions (working tree on c9e0a1d)
# against c9e0a1d (before) and the same capped at 64 registers (lb8); the eviction suites
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before lb8 after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
cd /tmp
for tree in before after lb8 before after lb8; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 3 --ways room,evict_drop,evict_device --out $OUT/growth_${tree}_$SECONDS.json > $OUT/g_${tree}_$SECONDS.log 2>&1
  say "growth $tree rc=$?"; grep -hE "wall|evict_pick" $OUT/g_${tree}_*.log | tail -8
done
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu table-groups-1gpu" OUT=/tmp/r18/suites timeout 300 bash tests/gpu/run_all.sh 1 > /tmp/r18-suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r18-suites.log; grep -h -B2 -A30 "^FAILED\|Error" /tmp/r18/suites/*.log | head -60
cp /tmp/r18-suites.log $OUT/; mkdir -p $OUT/suites; cp /tmp/r18/suites/*.log $OUT/suites/ 2>/dev/null
