#!/bin/bash
# device run 2 (2026-12-01, nvidia-h200): a row kernel's update stamps its rows in its own pass: the GPU suites it touches
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r2
SOK1X_SUITE_TIMEOUT_S=150 SOK1X_SUITES="optimizer-kernels captured-graph replayed-step-1gpu bounded-step-1gpu replayed-keyed-1gpu table-groups-1gpu dynamic-1gpu" OUT=/tmp/r2/suites timeout 540 bash tests/gpu/run_all.sh 1 > /tmp/r2/suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r2/suites.log; grep -h -B2 -A12 "^FAILED\|Error" /tmp/r2/suites/*.log | head -30
cd /tmp/r2 && tar czf $OUT/r2.tgz . && ls $OUT
