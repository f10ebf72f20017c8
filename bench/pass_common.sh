# Shared by the one-GPU pass scripts (find_or_insert_pass.sh, hkv_pass.sh), which source it from
# this checkout's root with $here (this checkout) and $before (a "before" tree) set. $OUT gets
# summary.txt, the work folder's *.md and pass.tgz (the whole work folder: a run hands back only
# a few files); $PASS_LIMIT_S (default 380) bounds the whole pass. Defines say, left, bench and
# tests, installs PyCUDA's wheels (./.device-wheels or two folders up, a .devtree copy) and both
# trees into /tmp/{wheels,after,before}, compiles every kernel family of each into the shared
# cache, and leaves the shell in /tmp.
final=${OUT:-/tmp/sok1x-pass}; out=/tmp/sok1x-pass-work; mkdir -p "$final" "$out"
log=$out/log.txt; summary=$final/summary.txt
trap 'cp "$out"/*.md "$final"/ 2>/dev/null; tar -czf "$final/pass.tgz" -C "$out" .' EXIT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export SOK1X_KERNEL_CACHE_DIR=/tmp/sok1x-kernels
limit=${PASS_LIMIT_S:-380}
say() { echo "[$SECONDS s] $*" | tee -a "$log" >>"$summary"; }
left() { local l=$((limit - SECONDS)); [ $l -gt 5 ] && echo $l || echo 5; }
bench() {  # tree, script, json name, arguments...
  local tree=$1 script=$2 name=$3; shift 3
  PYTHONPATH=/tmp/wheels:/tmp/$tree:$here/bench timeout "$(left)" python3 "$here/bench/$script" \
    --out "$out/$name.json" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  say "$name rc=$rc: $(grep -E 'share|load|mapped|GiB|Error' "$out/$name.log" | tr '\n' ' ')"
}
tests() {  # run_all.sh suites at 1 GPU, log folder name
  say "== tests: $1 ${SOK1X_HOST_ROWS:-}"
  SOK1X_SUITES=$1 SOK1X_SUITE_TIMEOUT_S=$(left) OUT=$out/$2 \
    timeout "$(left)" bash "$here/tests/gpu/run_all.sh" 1 >>"$out/$2.txt" 2>&1
  say "rc=$?: $(grep '^==' "$out/$2.txt" | tail -2 | tr '\n' ' ')"
  grep -hE '^(FAILED|ERROR)' "$out/$2"/*.log 2>/dev/null | head -12 >>"$summary"
}
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
wait
say "installed and compiled"
