#!/bin/bash
# device run 4 (2026-11-30, nvidia-h200): growth_step A/B without the profiler; is the profiler's
# crash the change's or download_beside's under CUPTI (the before tree's host reader)?
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/base-site .device-wheels/*.whl 2>&1 | tail -1
for t in before after; do
  cp -r /tmp/base-site /tmp/$t-site; src=.carry-$t; [ $t = after ] && src=.
  (cd $src && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$t-site . 2>&1 | tail -1)
done
say installed
mkdir -p /tmp/r4
cd /tmp
export PYTHONFAULTHANDLER=1
for tree in before after before after; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_step.py --ways room,evict_drop,evict_device --repeats 5 --out /tmp/r4/gs_${tree}_$SECONDS.json > /tmp/r4/gs_${tree}_$SECONDS.log 2>&1
  say "growth_step $tree rc=$?"; grep -hE "evict|room" /tmp/r4/gs_${tree}_*.log | grep -v "^ " | tail -5
done
PYTHONPATH=/tmp/before-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 2 --ways room,evict --out /tmp/r4/gk_before_evict.json > /tmp/r4/gk_before_evict.log 2>&1
say "growth_kernels before room,evict rc=$?"; grep -E "wall|/ room" /tmp/r4/gk_before_evict.log | tail -3
PYTHONPATH=/tmp/after-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 2 --ways room,evict_device --out /tmp/r4/gk_after_device.json > /tmp/r4/gk_after_device.log 2>&1
say "growth_kernels after room,evict_device rc=$?"; grep -E "wall|/ room" /tmp/r4/gk_after_device.log | tail -3; grep -A12 "Current thread\|Fatal" /tmp/r4/gk_after_device.log | head -30
cd /tmp/r4 && tar czf $OUT/r4.tgz . && ls $OUT
