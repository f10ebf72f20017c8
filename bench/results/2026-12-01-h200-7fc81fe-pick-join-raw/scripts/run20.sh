#!/bin/bash
# device run 20 (2026-12-01, nvidia-h200): join_word_rows a row per 2^k threads, 16 bytes a load (working tree on f92363a)
# against f92363a (before): growth_kernels alternated; the cuda-backend suite
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="cuda-backend" OUT=/tmp/r20/suites timeout 250 bash tests/gpu/run_all.sh 1 > /tmp/r20-suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r20-suites.log; grep -h -B2 -A30 "^FAILED\|Error" /tmp/r20/suites/*.log | head -60
cd /tmp
for tree in before after before after; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 3 --ways room,evict_drop,evict_device --out /tmp/growth_${tree}_$SECONDS.json > $OUT/g_${tree}_$SECONDS.log 2>&1
  say "growth $tree rc=$?"; grep -hE "wall|join_word|evict_pick" $(ls -t $OUT/g_${tree}_*.log | head -1)
done
