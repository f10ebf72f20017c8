#!/usr/bin/env bash
# Issue 21's fourth-round pass on one GPU: this tree's GPU tests (run_all.sh suites hash-values,
# dynamic-1gpu, cuda-backend), the host-memory layout probe (bench/host_slices.py: one block
# against HierarchicalKV's separate 128 MiB slices), then sok1x's DynamicVariable grid beside
# HierarchicalKV's own benchmark routine run in the same process tree (bench/hkv_reference.py)
# with the same-size PCIe probe of each hybrid table, and hbm's engine path of a "before" tree in
# processes bracketing it (before, after with the grid, before).
# (The pass of results/2026-11-23-h100x1-hkv4/pass1 ran this script at e0c3fc4: tests last, no
# layout probe, HierarchicalKV at both dims.)
#     bash bench/hkv_pass.sh BEFORE_TREE HKV_BINARY [HKV_CHECKOUT]    (from this checkout's root)
# HKV_BINARY: bench/hkv_build.sh's output; when it does not run here and HKV_CHECKOUT is given,
# it is built again here. Writes summary.txt, grid.md and pass.tgz (everything) to $OUT.
# $PASS_LIMIT_S (default 380) bounds the whole pass.
set -u
here=$(pwd); before=$(cd "${1:?usage: hkv_pass.sh BEFORE_TREE HKV_BINARY}" && pwd)
hkv=$(readlink -f "${2:?HKV_BINARY}"); hkv_src=${3:-}
source "$here/bench/pass_common.sh"
"$hkv" >/dev/null 2>&1; rc=$?
if [ $rc != 2 ] && [ -n "$hkv_src" ]; then  # 2: its usage message, so it runs here
  say "the HKV binary does not run here (rc $rc): building it again"
  hkv=/tmp/hkv_grid
  bash "$here/bench/hkv_build.sh" "$hkv_src" "$hkv" >>"$log" 2>&1
fi
tests "hash-values dynamic-1gpu cuda-backend" tests
bench after host_slices.py host_slices --sizes-gib 1,2,4
grid="--rows-log2 24 --repeats 7"
bench before dynamic_table.py engine_before_1 $grid --dims 64,128 --loads 0.5 --shares 0
bench after dynamic_table.py grid $grid --hkv "$hkv" --hkv-dims 64 --markdown "$out/grid.md"
bench before dynamic_table.py engine_before_2 $grid --dims 64,128 --loads 0.5 --shares 0
say "== done"
