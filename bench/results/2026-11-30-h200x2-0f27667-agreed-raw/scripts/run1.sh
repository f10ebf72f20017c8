#!/bin/bash
# device run 1 (2026-11-30, nvidia-h200-x2): the several-rank evicting step agreed in the next op header
repo=$PWD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0
say() { echo "[$SECONDS s] $*"; }
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p /tmp/r1
SOK1X_SUITE_TIMEOUT_S=160 SOK1X_SUITES="replayed-ranks-2gpu dynamic-2gpu table-groups-2gpu" OUT=/tmp/r1/suites0 timeout 330 bash tests/gpu/run_all.sh 2 > /tmp/r1/suites0.log 2>&1
say "suites (no switch) rc=$?"; grep -hE "^== " /tmp/r1/suites0.log; grep -h -B2 -A12 "^FAILED\|Error" /tmp/r1/suites0/*.log | head -30
SOK1X_BOUNDED_STEP=1 SOK1X_PEER_CAPACITY=1 SOK1X_SUITE_TIMEOUT_S=160 SOK1X_SUITES="dynamic-2gpu table-groups-2gpu" OUT=/tmp/r1/suites1 timeout 230 bash tests/gpu/run_all.sh 2 > /tmp/r1/suites1.log 2>&1
say "suites (both switches) rc=$?"; grep -hE "^== " /tmp/r1/suites1.log; grep -h -B2 -A12 "^FAILED\|Error" /tmp/r1/suites1/*.log | head -30
cd /tmp/r1 && tar czf $OUT/r1.tgz . && ls $OUT
