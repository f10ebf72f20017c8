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
final=${OUT:-/tmp/sok1x-pass}; out=/tmp/sok1x-pass-work; mkdir -p "$final" "$out"
log=$out/log.txt; summary=$final/summary.txt
trap 'cp "$out"/*.md "$final"/ 2>/dev/null; tar -czf "$final/pass.tgz" -C "$out" .' EXIT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOK1X_KERNEL_CACHE_DIR=/tmp/sok1x-kernels
limit=${PASS_LIMIT_S:-380}
say() { echo "[$SECONDS s] $*" | tee -a "$log" >>"$summary"; }
left() { local l=$((limit - SECONDS)); [ $l -gt 5 ] && echo $l || echo 5; }
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader)"
wheels=$here/.device-wheels; [ -d "$wheels" ] || wheels=$here/../../.device-wheels
[ -e "$here/.device-wheels" ] || ln -s "$wheels" "$here/.device-wheels"  # for run_all.sh
python3 -m pip install -q --no-index --no-deps --target /tmp/wheels "$wheels"/*.whl || exit 1
for tree in after before; do
  src=$here; [ $tree = before ] && src=$before
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$tree "$src" \
    >>"$log" 2>&1 || { say "install $tree failed"; exit 1; }
done
cd /tmp
for tree in after before; do  # every kernel family compiled in parallel into the shared cache
  PYTHONPATH=/tmp/wheels:/tmp/$tree python3 - >>"$log" 2>&1 <<'PY' &
from concurrent.futures import ThreadPoolExecutor
import pycuda.driver as driver
from sok1x import cuda_kernels
driver.init()
arch = "sm_%d%d" % driver.Device(0).compute_capability()
names = cuda_kernels.source_names()
cuda_kernels.compile_cubin(names[0], arch)
with ThreadPoolExecutor(8) as pool:
    list(pool.map(lambda name: cuda_kernels.compile_cubin(name, arch), names[1:]))
print("compiled", len(names), "families for", arch)
PY
done
"$hkv" >/dev/null 2>&1; rc=$?
if [ $rc != 2 ] && [ -n "$hkv_src" ]; then  # 2: its usage message, so it runs here
  say "the HKV binary does not run here (rc $rc): building it again"
  hkv=/tmp/hkv_grid
  bash "$here/bench/hkv_build.sh" "$hkv_src" "$hkv" >>"$log" 2>&1
fi
wait
say "installed and compiled"
bench() {  # tree, script, json name, arguments...
  local tree=$1 script=$2 name=$3; shift 3
  PYTHONPATH=/tmp/wheels:/tmp/$tree:$here/bench timeout "$(left)" python3 \
    "$here/bench/$script" --out "$out/$name.json" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  say "$name rc=$rc: $(grep -E 'share|load|mapped|GiB|Error' "$out/$name.log" | tr '\n' ' ')"
}
tests() {  # suites, log name
  say "== tests: $1 ${SOK1X_HOST_ROWS:-}"
  SOK1X_SUITES=$1 SOK1X_SUITE_TIMEOUT_S=$(left) OUT=$out/$2 \
    timeout "$(left)" bash "$here/tests/gpu/run_all.sh" 1 >>"$out/$2.txt" 2>&1
  say "rc=$?: $(grep '^==' "$out/$2.txt" | tail -2 | tr '\n' ' ')"
  grep -hE '^(FAILED|ERROR)' "$out/$2"/*.log 2>/dev/null | head -12 >>"$summary"
}
tests "hash-values dynamic-1gpu cuda-backend" tests
bench after host_slices.py host_slices --sizes-gib 1,2,4
grid="--rows-log2 24 --repeats 7"
bench before dynamic_table.py engine_before_1 $grid --dims 64,128 --loads 0.5 --shares 0
bench after dynamic_table.py grid $grid --hkv "$hkv" --hkv-dims 64 --markdown "$out/grid.md"
bench before dynamic_table.py engine_before_2 $grid --dims 64,128 --loads 0.5 --shares 0
say "== done"
