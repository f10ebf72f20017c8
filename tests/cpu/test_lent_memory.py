"""engine/lent_memory.py answers whether the framework holds memory that meets a span as a plain
walk over every held span answers it: spans of all lengths, nested, touching and released in
any order, one long span far before short ones (its length bounds where a query looks)."""
import numpy as np

from sok1x.engine import lent_memory


def meets(held, start, end):
    """The reference: any held (start, end) meeting [start, end)."""
    return end > start and any(s < end and e > start and e > s for s, e in held)


def test_holds_answers_as_a_walk_over_every_held_span():
    rng = np.random.default_rng(3)
    before = lent_memory.count()
    held = {}  # keep -> (start, end)
    for _ in range(2000):
        if held and rng.random() < 0.45:
            keep = list(held)[int(rng.integers(len(held)))]
            lent_memory.release(keep)
            del held[keep]
        else:
            start = int(rng.integers(0, 4096))
            length = int(rng.choice([0, 1, 8, 64, 700, 3000]))
            keep = lent_memory.lend(object(), start, length)
            held[keep] = (start, start + length)
        assert lent_memory.count() == before + len(held)
        for _ in range(4):
            start = int(rng.integers(0, 4200))
            end = start + int(rng.choice([0, 1, 16, 512]))
            assert lent_memory.holds([(start, end)]) == meets(held.values(), start, end), (
                start, end, sorted(held.values()))
    for keep in held:
        lent_memory.release(keep)
    assert lent_memory.count() == before


def test_a_span_next_to_a_held_one_is_free_and_a_release_frees_it():
    keep = lent_memory.lend(None, 1 << 40, 256)
    try:
        assert lent_memory.holds([((1 << 40) + 255, (1 << 40) + 256)])
        assert lent_memory.holds([((1 << 40) - 8, (1 << 40) + 1)])
        assert not lent_memory.holds([((1 << 40) + 256, (1 << 40) + 512)])
        assert not lent_memory.holds([((1 << 40) - 64, 1 << 40)])
    finally:
        lent_memory.release(keep)
    assert not lent_memory.holds([(1 << 40, (1 << 40) + 256)])
    lent_memory.release(keep)  # a second release does nothing


def test_holds_arrays_reads_the_arrays_memory():
    from sok1x.backend import cpu
    whole = np.zeros(64, np.float32)
    keep = lent_memory.lend(whole[16:32], cpu.address_of(whole[16:32]), 64)
    try:
        assert lent_memory.holds_arrays(cpu, [whole[20:21]])
        assert lent_memory.holds_arrays(cpu, [None, whole])
        assert not lent_memory.holds_arrays(cpu, [whole[:16], whole[32:]])
    finally:
        lent_memory.release(keep)


def test_threads_lending_and_releasing_at_once_leave_nothing_held():
    """TensorFlow drops tensors on its own threads while other kernels lend: after four threads
    each lent and released 2000 spans at once, none is held and no query finds one."""
    import threading
    before = lent_memory.count()
    base = 1 << 44

    def churn(seed):
        rng = np.random.default_rng(seed)
        mine = []
        for _ in range(2000):
            if mine and rng.random() < 0.5:
                lent_memory.release(mine.pop(int(rng.integers(len(mine)))))
            else:
                mine.append(lent_memory.lend(None, base + int(rng.integers(0, 1 << 20)),
                                             int(rng.integers(1, 4096))))
        for keep in mine:
            lent_memory.release(keep)
    import sys
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between almost any two bytecodes
    try:
        threads = [threading.Thread(target=churn, args=(seed,)) for seed in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert lent_memory.count() == before
    assert not lent_memory.holds([(base, base + (1 << 21))])


def test_a_release_during_a_call_orders_the_engine_after_the_framework_again():
    """writable(): while a kernel call runs (calling(reorder)), memory the framework gave back
    after the call ordered the engine's stream after the framework's is written only once
    reorder() made that order again (the framework's work that reads it may be queued after the
    call's first order); with nothing given back since, no second order; held memory is not
    writable, and nothing is ordered for it."""
    from sok1x.backend import cpu
    whole = np.zeros(64, np.float32)
    reorders = []
    first = lent_memory.lend(whole[:16], cpu.address_of(whole), 64)
    lent_memory.calling(lambda: reorders.append(True))
    try:
        assert not lent_memory.writable(cpu, [whole[:8]])
        assert lent_memory.writable(cpu, [whole[32:]]) and reorders == []
        lent_memory.release(first)  # given back while the call runs
        assert lent_memory.writable(cpu, [whole[:8]]) and reorders == [True]
        assert lent_memory.writable(cpu, [whole[:8]]) and reorders == [True]
    finally:
        lent_memory.calling(None)
        lent_memory.release(first)
    second = lent_memory.lend(whole[16:32], cpu.address_of(whole[16:32]), 64)
    lent_memory.release(second)
    assert lent_memory.writable(cpu, [whole]) and reorders == [True]  # no call running
