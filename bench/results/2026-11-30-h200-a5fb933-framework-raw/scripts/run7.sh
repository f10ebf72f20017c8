#!/bin/bash
# device run 7 (2026-11-30, nvidia-h200-x2): the device memory replayed shape classes hold, at 1 and 2 ranks
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
say installed
mkdir -p /tmp/r7; cd /tmp
export PYTHONPATH=/tmp/site:$repo/bench SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1
for n in 2 1; do
  for w in dlrm26 dlrm26_hash dlrm26_full; do
    SOK1X_BENCH_VARIANTS=sok1x_replayed,torch_dedup timeout 100 mpiexec -n $n python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out /tmp/r7/fw${n}_$w.json > /tmp/r7/fw${n}_$w.log 2>&1
    say "fw $n $w rc=$?"; grep -E "ms/step|shape classes" /tmp/r7/fw${n}_$w.log | grep -v bounded
  done
done
cd /tmp/r7 && tar czf $OUT/r7.tgz . && ls $OUT
