#!/bin/bash
# device run 24 (2026-12-01, nvidia-h200): evict_pick's warps taking a chunk's buckets as they finish (working
# tree on b1d5147) against 7fc81fe: growth_kernels alternated twice; the eviction suites
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
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 3 --ways room,evict_drop --out /tmp/growth_${tree}_$SECONDS.json > $OUT/g_${tree}_$SECONDS.log 2>&1
  say "growth $tree rc=$?"; grep -hE "wall|evict_pick" $(ls -t $OUT/g_${tree}_*.log | head -1)
done
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu table-groups-1gpu" OUT=/tmp/r24/suites timeout 200 bash tests/gpu/run_all.sh 1 > /tmp/r24-suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r24-suites.log; grep -h -B2 -A30 "^FAILED\|Error" /tmp/r24/suites/*.log | head -40
cp /tmp/r24-suites.log $OUT/
