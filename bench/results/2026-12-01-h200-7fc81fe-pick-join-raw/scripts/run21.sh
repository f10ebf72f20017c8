#!/bin/bash
# device run 21 (2026-12-01, nvidia-h200): 7fc81fe (after) against c9e0a1d (before): growth_kernels
# alternated twice; framework_step dlrm26_full of each tree (replayed, torch_dedup; device and bounded)
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
  PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 100 python3 $repo/bench/growth_kernels.py --repeats 3 --ways room,evict_drop,evict_device --out $OUT/growth_${tree}_$SECONDS.json > $OUT/g_${tree}_$SECONDS.log 2>&1
  say "growth $tree rc=$?"; grep -hE "wall|join_word|evict_pick" $(ls -t $OUT/g_${tree}_*.log | head -1)
done
for tree in after before; do
  SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup PYTHONPATH=/tmp/$tree-site:$repo/bench timeout 150 python3 $repo/bench/framework_step.py --workloads dlrm26_full --repeats 5 --out $OUT/fw_full_$tree.json > $OUT/fw_full_$tree.log 2>&1
  say "framework dlrm26_full $tree rc=$?"; grep -hE "dlrm26_full|python_us|torch" $OUT/fw_full_$tree.log | grep -v "^ " | head -12
done
