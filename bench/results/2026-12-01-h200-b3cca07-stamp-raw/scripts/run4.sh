#!/bin/bash
# device run 4 (2026-12-01, nvidia-h200): the stamp read where it is stored (no spill): kernels, before/after
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r4
for tree in before after; do
  python3 -m pip install -q --no-index --no-deps --target /tmp/$tree-site .device-wheels/*.whl 2>&1 | grep -v "already exists" | tail -1
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/before-site ./.carry-before 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/after-site . 2>&1 | tail -1
cd /tmp
PYTHONPATH=/tmp/after-site timeout 120 python3 -m pytest -q -p no:cacheprovider $repo/tests/gpu/test_optimizer_kernels.py -k "stamp or lazy_adam or adagrad" > /tmp/r4/stamp_tests.log 2>&1
say "stamp tests rc=$?"; tail -2 /tmp/r4/stamp_tests.log
for tree in after before; do
  PYTHONPATH=/tmp/$tree-site:$repo/bench SOK1X_BOUNDED_STEP=1 timeout 60 python3 $repo/bench/gpu_busy.py dlrm26 20 replayed > /tmp/r4/busy1_dlrm26_$tree.log 2>&1
  say "busy $tree rc=$?"; grep -A4 "rank 0 of" /tmp/r4/busy1_dlrm26_$tree.log; grep fill_rows /tmp/r4/busy1_dlrm26_$tree.log
done
for round in 1 2; do
  for tree in before after; do
    for w in dlrm26 dlrm; do
      PYTHONPATH=/tmp/$tree-site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 70 python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out /tmp/r4/fw_${w}_${tree}_$round.json > /tmp/r4/fw_${w}_${tree}_$round.log 2>&1
      say "$w $tree $round rc=$?"; grep -E "ms/step|GPU floor" /tmp/r4/fw_${w}_${tree}_$round.log | grep -v "torch_graph"
    done
  done
done
cd /tmp/r4 && tar czf $OUT/r4.tgz . && ls $OUT
