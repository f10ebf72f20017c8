#!/usr/bin/env bash
# Issue 21's GPU pass in one lease, on one GPU: the hybrid host-row probe, the dynamic-table GPU
# tests, and bench/dynamic_table.py + hash_table.py for a "before" tree beside this one.
#     bash bench/dynamic_before_after.sh BEFORE_TREE      (from this checkout's root; logs: $OUT)
# BEFORE_TREE: another sok1x checkout (e.g. `git archive main` unpacked). Both are installed into
# folders of their own, with the wheels of .device-wheels (PyCUDA); PyCUDA's wheels may also sit
# two folders up (a .devtree copy). The host-row way the kernels then use (SOK1X_HOST_ROWS) is
# the fastest one at the largest region whose CPU view agreed with the kernels.
set -u
here=$(pwd); before=$(cd "${1:?usage: dynamic_before_after.sh BEFORE_TREE}" && pwd)
out=${OUT:-/tmp/sok1x-bench}; mkdir -p "$out"; log=$out/log.txt
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOK1X_KERNEL_CACHE_DIR=/tmp/sok1x-kernels
T0=$SECONDS
say() { echo "$@" | tee -a "$log"; }
say "# $(date -u) $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader)"
say "THP $(cat /sys/kernel/mm/transparent_hugepage/enabled), NUMA nodes $(ls -d /sys/devices/system/node/node* 2>/dev/null | wc -l)"
wheels=$here/.device-wheels; [ -d "$wheels" ] || wheels=$here/../../.device-wheels
python3 -m pip install -q --no-index --no-deps --target /tmp/wheels "$wheels"/*.whl || exit 1
for tree in after before; do
  src=$here; [ $tree = before ] && src=$before
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/$tree "$src" \
    || exit 1
done
A=/tmp/wheels:/tmp/after; B=/tmp/wheels:/tmp/before
cd /tmp
say "== host_rows ($((SECONDS-T0)) s)"
PYTHONPATH=$A timeout 120 python3 "$here/bench/host_rows.py" --out "$out/host_rows.json" \
  --sizes-gib 0.25,1,4 --dims 64 --repeats 5 2>&1 | grep -v "^\s*$" | tee -a "$log" | tail -12
way=$(OUT=$out python3 - <<'PY'
import json, os
try:
    grid = json.load(open(os.environ["OUT"] + "/host_rows.json"))["grid"]
except (OSError, ValueError, KeyError):
    grid = []
ok = [e for e in grid if e["cpu_agrees"] and e["way"] == e["got"]]
big = max([e["size_gib"] for e in ok] or [0])
best = max([e for e in ok if e["size_gib"] == big], key=lambda e: e["read"]["gib_per_s"],
           default=None)
print(best["way"] if best else "pinned")
PY
)
export SOK1X_HOST_ROWS=$way
say "== SOK1X_HOST_ROWS=$way; tests ($((SECONDS-T0)) s)"
PYTHONPATH=$A timeout 150 mpiexec -n 1 python3 -m pytest -q -p no:cacheprovider --color=no -x \
  "$here/tests/gpu/test_dynamic_cuda.py" >"$out/tests.log" 2>&1
say "test_dynamic_cuda 1 GPU rc=$? $(tail -1 "$out/tests.log")"
say "== breakdown ($((SECONDS-T0)) s)"
PYTHONPATH=$A:$here/bench timeout 60 python3 "$here/bench/dynamic_breakdown.py" \
  --out "$out/breakdown.json" --dim 64 2>&1 | grep -E "dim|Error" | tee -a "$log"
for tree in before after; do
  P=$B; src=$before; [ $tree = after ] && P=$A && src=$here
  say "== dynamic_table $tree ($((SECONDS-T0)) s)"
  PYTHONPATH=$P:$src/bench timeout 150 python3 "$src/bench/dynamic_table.py" \
    --out "$out/dynamic_$tree.json" --rows-log2 24 --dims 64,128 --loads 0.5 --shares 0,0.5 \
    --repeats 7 2>&1 | grep -E "share|mapped|Error" | tee -a "$log"
done
say "== backend tests ($((SECONDS-T0)) s)"
skip=(); [ "$way" = vmm ] || skip=(-k "not vmm")
PYTHONPATH=$A timeout 100 python3 -m pytest -q -p no:cacheprovider --color=no -s "${skip[@]}" \
  "$here/tests/gpu/test_cuda_backend.py" "$here/tests/gpu/test_bounded_waits.py" \
  >>"$out/tests.log" 2>&1
say "test_cuda_backend + test_bounded_waits rc=$? $(tail -1 "$out/tests.log")"
grep -E "got (vmm|thp|pinned)|^(FAILED|ERROR)" "$out/tests.log" | head -12 | tee -a "$log"
for tree in before after; do
  P=$B; src=$before; [ $tree = after ] && P=$A && src=$here
  say "== hash_table $tree ($((SECONDS-T0)) s)"
  PYTHONPATH=$P:$src/bench timeout 60 python3 "$src/bench/hash_table.py" \
    --out "$out/hash_$tree.json" --dims 64 --repeats 7 2>&1 | grep -E "load|Error" | tee -a "$log"
done
say "== done ($((SECONDS-T0)) s)"
