"""Probe: what each virtual-memory call costs on this GPU, against cuMemAlloc of the same bytes."""
import ctypes, time, sys
sys.path.insert(0, "/tmp/site_after")
import pycuda.driver as cuda
cuda.init()
ctx = cuda.Device(0).retain_primary_context(); ctx.push()
from sok1x.backend.cuda import memory_driver as d

prop = d.AllocationProp(); prop.type = d.ALLOCATION_PINNED
prop.location.type, prop.location.id = d.LOCATION_DEVICE, d.current_device()
acc = d.AccessDesc(); acc.location.type = d.LOCATION_DEVICE; acc.location.id = prop.location.id; acc.flags = d.PROT_READWRITE
g = d.size_t(); d.call("cuMemGetAllocationGranularity", ctypes.byref(g), ctypes.byref(prop), 0)
g2 = d.size_t(); d.call("cuMemGetAllocationGranularity", ctypes.byref(g2), ctypes.byref(prop), 1)
print("granularity min %d recommended %d" % (g.value, g2.value))

def run(pieces, size, label):
    total = pieces * size
    base = d.u64(); d.call("cuMemAddressReserve", ctypes.byref(base), total * 2, 0, 0, 0)
    t = {"create": 0.0, "map": 0.0, "access": 0.0}
    handles = []
    for i in range(pieces):
        h = d.u64(); s = time.perf_counter()
        d.call("cuMemCreate", ctypes.byref(h), size, ctypes.byref(prop), 0); a = time.perf_counter()
        d.call("cuMemMap", base.value + 2 * i * size, size, 0, h, 0); b = time.perf_counter()
        d.call("cuMemSetAccess", base.value + 2 * i * size, size, ctypes.byref(acc), 1); c = time.perf_counter()
        t["create"] += a - s; t["map"] += b - a; t["access"] += c - b
        handles.append(h)
    s = time.perf_counter()
    for i, h in enumerate(handles):
        d.call("cuMemUnmap", base.value + 2 * i * size, size); d.call("cuMemRelease", h)
    free = time.perf_counter() - s
    d.call("cuMemAddressFree", base.value, total * 2)
    s = time.perf_counter()
    allocs = [cuda.mem_alloc(size) for _ in range(pieces)]
    alloc = time.perf_counter() - s
    s = time.perf_counter(); del allocs; dealloc = time.perf_counter() - s
    print("%s: %d x %d MiB: create %.2f map %.2f access %.2f ms (free %.2f); cuMemAlloc %.2f ms (free %.2f)" % (
        label, pieces, size >> 20, 1e3 * t["create"], 1e3 * t["map"], 1e3 * t["access"], 1e3 * free, 1e3 * alloc, 1e3 * dealloc))

for rep in range(3):
    run(78, 128 << 20, "values+slots")
    run(26, 2 << 20, "times")
    run(3, 26 * (128 << 20), "one piece an array")
    run(1280, 8 << 20, "8 MiB pieces")
