#!/bin/bash
# device run 3 (2026-11-30, nvidia-h200): a device reader's counts from the eviction's own copy
# (after: the working tree) against a wait for the whole step (before: .carry-before), A/B
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
mkdir -p /tmp/r3
cd /tmp
for tree in after before after before; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 5 --out /tmp/r3/growth_${tree}_$SECONDS.json > /tmp/r3/g_${tree}_$SECONDS.log 2>&1
  say "growth $tree rc=$?"; grep -hE "wall|/ room" /tmp/r3/g_${tree}_*.log | tail -4
done
cd $repo
SOK1X_SUITE_TIMEOUT_S=150 SOK1X_SUITES="dynamic-1gpu" OUT=/tmp/r3/suites timeout 170 bash tests/gpu/run_all.sh 1 > /tmp/r3/suites.log 2>&1
say "suites rc=$?"; grep -hE "rc=" /tmp/r3/suites.log | tail -2
cd /tmp/r3 && tar czf $OUT/r3.tgz . && ls $OUT
