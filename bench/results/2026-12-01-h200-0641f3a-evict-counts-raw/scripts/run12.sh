#!/bin/bash
# device run 12 (2026-12-01, nvidia-h200): a device reader's parts cut at once (0641f3a) beside the old cut, in one process (reader_phases.py), two processes; GPU suites on 0641f3a
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r12 /tmp/r11
python3 -m pip install -q --no-index --no-deps --target /tmp/site .device-wheels/*.whl 2>&1 | tail -1
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . 2>&1 | tail -1
cd /tmp
for p in 1 2; do
  PYTHONPATH=/tmp/site:$repo/bench timeout 150 python3 $repo/.carry-run/reader_phases.py 6 6 /tmp/r12/phases_$p.json > /tmp/r12/phases_$p.log 2>&1
  say "phases $p rc=$?"; grep -v "^ \|Warn\|warn" /tmp/r12/phases_$p.log | tail -10
  mkdir -p /tmp/r12/prof_$p && mv /tmp/r11/prof_*.txt /tmp/r12/prof_$p/ 2>/dev/null
done
cp $repo/.carry-run/reader_phases.py /tmp/r12/
cd $repo
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="cuda-backend dynamic-1gpu table-groups-1gpu bounded-step-1gpu checkpoint-1gpu" OUT=/tmp/r12/suites timeout 400 bash tests/gpu/run_all.sh 1 > /tmp/r12/suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r12/suites.log; grep -h -B2 -A20 "^FAILED\|Error" /tmp/r12/suites/*.log | head -40
cd /tmp/r12 && tar czf $OUT/r12.tgz . && ls $OUT
