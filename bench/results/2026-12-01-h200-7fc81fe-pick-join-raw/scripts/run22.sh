#!/bin/bash
# device run 22 (2026-12-01, nvidia-h200): 7fc81fe's GPU suites
repo=$PWD
say() { echo "[$SECONDS s] $*"; }
mkdir -p /tmp/r22
SOK1X_SUITE_TIMEOUT_S=200 SOK1X_SUITES="dynamic-1gpu table-groups-1gpu replayed-keyed-1gpu bounded-step-1gpu kernel-calls-1gpu replayed-step-1gpu" OUT=/tmp/r22/suites timeout 520 bash tests/gpu/run_all.sh 1 > /tmp/r22/suites.log 2>&1
say "suites rc=$?"; grep -hE "^== " /tmp/r22/suites.log; grep -h -B2 -A30 "^FAILED\|Error" /tmp/r22/suites/*.log | head -60
cp /tmp/r22/suites.log $OUT/
