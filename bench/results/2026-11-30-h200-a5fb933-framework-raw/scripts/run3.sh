#!/bin/bash
# device run 3 (2026-11-30): cProfile of replayed vs kernels-replayed steps, tarred
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
if [ ! -d /tmp/site/sok1x ]; then
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
fi
say installed
mkdir -p /tmp/prof; cd /tmp
export PYTHONPATH=/tmp/site:$repo/bench
for w in dlrm26_hybrid dlrm26; do
  SOK1X_BENCH_PROFILE=/tmp/prof/prof-$w.txt SOK1X_BENCH_PROFILE_RAW=1 SOK1X_BENCH_PROFILE_LINES=70 \
  SOK1X_BENCH_VARIANTS=sok1x_replayed,sok1x_kernels_replayed timeout 150 python3 $repo/bench/framework_step.py --workloads $w --repeats 5 --out /tmp/prof/fw_prof_$w.json > /tmp/prof/fw_prof_$w.log 2>&1
  say "prof $w rc=$?"; grep -E "ms/step" /tmp/prof/fw_prof_$w.log
done
cd /tmp/prof && tar czf $OUT/prof.tgz . && ls -la $OUT
