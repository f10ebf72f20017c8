#!/bin/bash
# device run 5 (2026-11-30): growth A/B again; a full table alone at load 1.0 beside HKV
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
for tree in before after; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 5 --out $OUT/growth_${tree}_$SECONDS.json > $OUT/g.log 2>&1
  say "growth $tree rc=$?"; grep -E "wall" $OUT/g.log | grep -v "^ "; grep -E "evict_pick|/ room" $OUT/g.log | head -4
done
PYTHONPATH=/tmp/after-site:$repo/bench timeout 400 python3 $repo/bench/dynamic_table.py --rows-log2 26 --repeats 5 --dims 64,128 --loads 1.0 --shares 0.25,0.5,0.75 --evicted drop --hkv $repo/.carry-run/hkv_grid --out $OUT/grid.json --markdown $OUT/grid.md > $OUT/grid.log 2>&1
say "grid rc=$?"; grep -E "HierarchicalKV share|hybrid share" $OUT/grid.log
