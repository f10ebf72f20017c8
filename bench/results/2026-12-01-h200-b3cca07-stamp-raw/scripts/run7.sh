#!/bin/bash
# device run 7 (2026-12-01, nvidia-h200): warp-aggregated counts and places (count_segments, place_by_segment, emit_padded_inverse): tests, kernels, fc32b83 before / after
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r7
for tree in before after; do
  python3 -m pip install -q --no-index --no-deps --target /tmp/$tree-site .device-wheels/*.whl 2>&1 | grep -v "already exists" | tail -1
done
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/before-site ./.carry-before 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/after-site . 2>&1 | tail -1
cd /tmp
PYTHONPATH=/tmp/after-site timeout 90 python3 -m pytest -q -p no:cacheprovider $repo/tests/gpu/test_cuda_backend.py -k "segment_sum" > /tmp/r7/segment_tests.log 2>&1
say "segment tests rc=$?"; tail -1 /tmp/r7/segment_tests.log
PYTHONPATH=/tmp/after-site timeout 90 mpiexec --allow-run-as-root -n 1 python3 -m pytest -q -p no:cacheprovider $repo/tests/gpu/test_bounded_step_cuda.py > /tmp/r7/bounded_tests.log 2>&1
say "bounded tests rc=$?"; tail -1 /tmp/r7/bounded_tests.log
PYTHONPATH=/tmp/after-site:$repo/bench SOK1X_BOUNDED_STEP=1 timeout 60 python3 $repo/bench/gpu_busy.py dlrm26 20 replayed > /tmp/r7/busy1_dlrm26_after.log 2>&1
say "busy after rc=$?"; grep -A9 "rank 0 of" /tmp/r7/busy1_dlrm26_after.log; grep -E "place_by|count_seg|emit_padded_inv" /tmp/r7/busy1_dlrm26_after.log
for tree in before after; do
  w=dlrm26
  PYTHONPATH=/tmp/$tree-site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 70 python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out /tmp/r7/fw_${w}_${tree}.json > /tmp/r7/fw_${w}_${tree}.log 2>&1
  say "$w $tree rc=$?"; grep -E "sok1x_replayed|torch_dedup" /tmp/r7/fw_${w}_${tree}.log | grep -E "ms/step"; grep -o "'python_us': [0-9.]*\|'host_pace_us': [0-9.]*" /tmp/r7/fw_${w}_${tree}.log | sed -n '5,6p' | tr '\n' ' '; echo
done
cd /tmp/r7 && tar czf $OUT/r7.tgz . && ls $OUT
