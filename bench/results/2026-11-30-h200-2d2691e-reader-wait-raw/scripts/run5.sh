#!/bin/bash
# device run 5 (2026-11-30, nvidia-h200): growth_kernels A/B, the side stream's event kept alive
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
mkdir -p /tmp/r5
cd /tmp
export PYTHONFAULTHANDLER=1
for tree in after before after before after; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 5 --out /tmp/r5/gk_${tree}_$SECONDS.json > /tmp/r5/gk_${tree}_$SECONDS.log 2>&1
  rc=$?; say "growth_kernels $tree rc=$rc"; f=$(ls -t /tmp/r5/gk_${tree}_*.log | head -1); grep -E "^[a-z_]+: wall|/ room" $f
  [ $rc = 0 ] || grep -B2 -A14 "Current thread\|Fatal\|invalid" $f | head -24
done
cd /tmp/r5 && tar czf $OUT/r5.tgz . && ls $OUT
