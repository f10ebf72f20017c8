"""The registries that objects leave as the collector frees them (engine/lookup/distinct_rows.py,
engine/lent_memory.py, backend/dlpack.py's exports) stay usable when the collector runs inside
their own lock: it runs at any allocation, so a thread inside a registry may run the cleanup of
a dead entry there, on itself. A plain lock made that thread wait on itself for good (a 2-rank
CI job hung so in a lookup's backward); and a release inside a query's walk over the lent spans
must not hide a span still held from it. Each case runs in its own process under a time limit, so
that the hang it guards against fails the test instead of stalling the suite."""
import subprocess
import sys
import textwrap

import pytest

from mpi_jobs import lane_a_only

# Each script leaves an entry whose owner only the collector can free (a reference cycle), then
# collects while holding the registry's lock on this thread, and checks that the entry is gone.
SCRIPTS = {
    "distinct rows": """
        import gc
        import numpy as np
        from sok1x.engine.lookup import distinct_rows

        class Holder:
            pass

        holder = Holder()
        holder.itself, holder.rows = holder, np.arange(8, dtype=np.int64)
        parts = [holder.rows[:4], holder.rows[4:]]
        distinct_rows.remember_all(holder, parts)
        assert all(distinct_rows.is_known(part) for part in parts)
        keys = [distinct_rows.address(part) for part in parts]
        del holder, parts
        with distinct_rows._lock:
            gc.collect()
        assert not any(key in distinct_rows._known for key in keys)
        """,
    "lent memory": """
        import gc
        from sok1x.engine import lent_memory

        class Tensor:  # a framework's tensor: gives its memory back as it dies
            def __del__(self):
                lent_memory.release(self.keep)

        tensor = Tensor()
        tensor.itself = tensor
        tensor.keep = lent_memory.lend(None, 1 << 40, 256)
        assert lent_memory.holds([(1 << 40, (1 << 40) + 1)])
        del tensor
        with lent_memory._lock:
            gc.collect()
        assert not lent_memory.holds([(1 << 40, (1 << 40) + 1)])
        """,
    "lent memory, in a query": """
        import bisect
        import gc
        from sok1x.engine import lent_memory

        class Tensor:
            def __del__(self):
                lent_memory.release(self.keep)

        held = lent_memory.lend(None, 100, 300)  # [100, 400), held throughout
        tensor = Tensor()
        tensor.itself = tensor
        tensor.keep = lent_memory.lend(None, 10, 20)  # [10, 30), freed by the collector
        del tensor

        class CollectingBisect:
            # the collector runs between the query's two searches, as at an allocation there
            bisect_right, insort = staticmethod(bisect.bisect_right), staticmethod(bisect.insort)

            @staticmethod
            def bisect_left(*arguments):
                gc.collect()
                return bisect.bisect_left(*arguments)
        lent_memory.bisect = CollectingBisect
        try:
            assert lent_memory.holds([(350, 360)])  # [100, 400) is held, whatever died meanwhile
        finally:
            lent_memory.bisect = bisect
        assert not lent_memory.holds([(10, 30)])  # the dead tensor's span, let go after the walk
        lent_memory.release(held)
        assert not lent_memory.holds([(100, 400)])
        """,
    "dlpack exports": """
        import gc
        import numpy as np
        from sok1x.backend import dlpack

        class Keeper:
            pass

        values = np.arange(6, dtype=np.float32)
        keeper = Keeper()
        keeper.itself = keeper
        keeper.capsule = dlpack.export_capsule(values.ctypes.data, values.shape, values.dtype,
                                               dlpack.DEVICE_CPU, 0, values)
        assert dlpack.live_exports() == 1
        del keeper
        with dlpack._exports_lock:
            gc.collect()
        assert dlpack.live_exports() == 0
        """,
}


@lane_a_only()
@pytest.mark.parametrize("registry", sorted(SCRIPTS))
def test_a_collection_inside_a_registrys_lock_frees_its_dead_entries(registry):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SCRIPTS[registry])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
