#!/usr/bin/env bash
# Issue 21's third-round pass on one GPU: hbm find_or_insert of a "before" tree and of this one,
# timed in alternating processes (before, after, before, after: a slow first case of a fresh
# process, seen in the second round, then hits both trees alike), then this tree's GPU tests
# (run_all.sh suites hash-values, dynamic-1gpu, cuda-backend).
#     bash bench/find_or_insert_pass.sh BEFORE_TREE      (from this checkout's root; $OUT)
# Both trees are timed by this checkout's bench scripts (they run the three-op path where a tree
# has no find_or_insert_values). PyCUDA's wheels: ./.device-wheels or two folders up (.devtree).
# $PASS_LIMIT_S (default 380) bounds the whole pass: each stage gets what is left.
set -u
here=$(pwd); before=$(cd "${1:?usage: find_or_insert_pass.sh BEFORE_TREE}" && pwd)
source "$here/bench/pass_common.sh"
for round in 1 2; do
  shares=0; [ $round = 2 ] && shares=0,0.5
  for tree in before after; do
    bench $tree dynamic_table.py dynamic_${tree}_$round --rows-log2 24 --dims 64,128 --loads 0.5 \
      --shares $shares --repeats 7
  done
done
for tree in before after; do
  bench $tree hash_table.py hash_$tree --dims 64 --repeats 7
done
bench after dynamic_breakdown.py breakdown_after --dim 64
for suites in "hash-values dynamic-1gpu" cuda-backend engine-1gpu; do
  tests "$suites" tests
done
if [ "$(left)" -gt 40 ] && command -v ncu >/dev/null; then  # what bounds the one kernel
  PYTHONPATH=/tmp/wheels:/tmp/after:$here/bench timeout "$(left)" ncu --kernel-name \
    hash_find_or_insert_values --launch-skip 2 --launch-count 1 --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section Occupancy python3 "$here/bench/dynamic_breakdown.py" \
    --out "$out/breakdown_ncu.json" --dim 64 --repeats 1 >"$out/ncu.txt" 2>&1
  say "ncu rc=$?: $(grep -E 'Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Achieved Occupancy' "$out/ncu.txt" | tr -s ' ' | tr '\n' ';')"
fi
say "== done"
