"""Ad hoc: cProfile of growth_step's warm evict_device steps (step + reader), on cuda."""
import cProfile, pstats, sys, io, time
import growth_step, harness
args = growth_step.parse_args(["--out", "/tmp/x.json"])
rt = harness.start_engine("cuda")
for way in sys.argv[1].split(","):
    case = growth_step.Case(rt, args, way, 0, steps=10)
    case.fill_up()
    keys = iter(case.steps)
    for s in range(3):
        growth_step.read_evicted(case, way, case.step(next(keys), "w%d" % s))
    rt.backend.synchronize()
    walls = []
    for s in range(3):
        t = time.perf_counter()
        growth_step.read_evicted(case, way, case.step(next(keys), "t%d" % s))
        rt.backend.synchronize()
        walls.append((time.perf_counter() - t) * 1e3)
    pr = cProfile.Profile(); pr.enable()
    for s in range(3):
        growth_step.read_evicted(case, way, case.step(next(keys), "p%d" % s))
    rt.backend.synchronize()
    pr.disable()
    out = io.StringIO(); st = pstats.Stats(pr, stream=out)
    print(way, "walls", [round(w, 2) for w in walls], "calls/step", st.total_calls // 3)
    st.sort_stats("tottime").print_stats(12); print(out.getvalue()[-3500:])
    rt.stash.clear()
    for name in case.names:
        rt.tables.pop(name, None); rt.pending_tables.pop(name, None)
    harness.release_memory(rt.backend)
