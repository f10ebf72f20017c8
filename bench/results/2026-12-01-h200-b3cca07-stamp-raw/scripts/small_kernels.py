"""Ad-hoc: a few bounded (uncaptured) dlrm26 steps on cuda, one rank, for ncu to profile their
small kernels."""
import os
import sys
os.environ.setdefault("SOK1X_BOUNDED_STEP", "1")
import harness
import step_calls

rt = harness.start_engine("cuda")
case = step_calls.Case(rt, sys.argv[1] if len(sys.argv) > 1 else "dlrm26", 1, replayed=False)
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 5):
    case.run()
rt.backend.synchronize()
print("done")
