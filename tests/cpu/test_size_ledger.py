"""backend/size_ledger.py against a model of one list of pending counts per index (how cuda's
HashIndex counted before a group's indexes shared a ledger): any sequence of a group's placed
counts left pending, a single index's, erases counted by bounds, copies handed over, rebuilt
indexes and reads gives the sizes and tombstones the model gives; a group's step reads each
copy once; an index that dies or a group in another order never shares a stale ledger."""
import gc

import numpy as np
import pytest

from sok1x.backend import size_ledger


class Device:
    """A device count array: its host copy comes by to_host_many (or a read function)."""

    def __init__(self, values):
        self.host = np.asarray(values, dtype=np.int64)


class Copies:
    """to_host_many, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, arrays):
        self.calls += 1
        return [array.host.copy() for array in arrays]


class Index(size_ledger.CountedIndex):
    def __init__(self, copies):
        self._count_in(copies)


class Model:
    """Each index's size, tombstones and pending (counts, position, sign, bound) entries."""

    def __init__(self, n):
        self.sizes, self.tombstones = [0] * n, [0] * n
        self.later = [[] for _ in range(n)]

    @staticmethod
    def host(counts):
        return counts() if callable(counts) else counts.host

    def count(self, t, entry):
        counts, position, sign, bound = entry
        count = int(self.host(counts)[position])
        self.sizes[t] += sign * count
        if bound:
            self.tombstones[t] -= bound - count

    def settle(self, t, counts=None):
        left = []
        for entry in self.later[t]:
            if counts is None or entry[0] is counts:
                self.count(t, entry)
            else:
                left.append(entry)
        self.later[t] = left

    def read(self):
        for t in range(len(self.sizes)):
            self.settle(t)
        return list(self.sizes), list(self.tombstones)


def check(indexes, model):
    sizes, tombstones = model.read()
    assert size_ledger.sizes(indexes).tolist() == sizes
    assert size_ledger.tombstones(indexes).tolist() == tombstones
    assert [index.size for index in indexes] == sizes


@pytest.mark.parametrize("seed", range(8))
def test_any_sequence_of_counts_gives_the_per_index_model(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    copies = Copies()
    indexes = [Index(copies) for _ in range(n)]
    model = Model(n)
    size_ledger.sizes(indexes)  # (a group read: they share a ledger now)
    assert size_ledger.shared(indexes) is not None
    handed = []  # device arrays whose copies an op header read since
    for _ in range(60):
        op = rng.integers(0, 8)
        if op == 0:  # a group's placed counts left on the device (or its queued copy)
            values = rng.integers(0, 20, size=n)
            counts = Device(values) if rng.integers(0, 2) else (lambda v=values: v.copy())
            size_ledger.add_all(indexes, counts)
            for t in range(n):
                model.later[t].append((counts, t, 1, 0))
            if not callable(counts):
                handed.append(counts)
        elif op == 1:  # one index's count, at a position of a longer array
            t, position = int(rng.integers(0, n)), int(rng.integers(0, 3))
            counts = Device(rng.integers(0, 9, size=3))
            indexes[t].add_size_later(counts, position)
            model.later[t].append((counts, position, 1, 0))
        elif op == 2:  # an erase counted by bounds, its true counts pending
            bounds = rng.integers(0, 6, size=n) * rng.integers(0, 2, size=n)
            # (a member with no bound counts nothing, whatever the device array holds for it)
            erased = Device(np.where(bounds > 0, rng.integers(0, bounds + 1),
                                     rng.integers(0, 3, size=n)))
            size_ledger.erase_counted(indexes, bounds.tolist(), erased)
            for t in range(n):
                if bounds[t]:
                    model.later[t].append((erased, t, -1, int(bounds[t])))
                model.tombstones[t] += int(bounds[t])
            handed.append(erased)
        elif op == 3:  # an erase of known counts
            sizes, _ = model.read()
            counts = rng.integers(0, np.maximum(sizes, 0) + 1)
            size_ledger.erase_counted(indexes, counts.tolist())
            for t in range(n):
                model.sizes[t] -= int(counts[t])
                model.tombstones[t] += int(counts[t])
        elif op == 4 and handed:  # a copy read since, handed over
            counts = handed.pop(int(rng.integers(0, len(handed))))
            size_ledger.settle(indexes, counts, counts.host.copy())
            for t in range(n):
                model.settle(t, counts)
        elif op == 5:  # an index rebuilt
            t = int(rng.integers(0, n))
            indexes[t].forget_tombstones()
            model.tombstones[t] = 0
            model.later[t] = [entry[:3] + (0,) for entry in model.later[t]]
        elif op == 6:  # placed counts the host read
            placed = rng.integers(0, 5, size=n)
            size_ledger.add(indexes, placed)
            model.read()
            model.sizes = [s + int(p) for s, p in zip(model.sizes, placed)]
        else:  # one index read on its own
            t = int(rng.integers(0, n))
            model.read()
            assert indexes[t].size == model.sizes[t]
            assert indexes[t].tombstones == model.tombstones[t]
        if rng.integers(0, 4) == 0:
            check(indexes, model)
    check(indexes, model)
    assert not any(index.has_pending_counts() for index in indexes)


def test_a_groups_step_reads_each_copy_once():
    copies = Copies()
    indexes = [Index(copies) for _ in range(26)]
    size_ledger.sizes(indexes)
    reads = []

    def placed():
        reads.append(1)
        return np.arange(26)

    size_ledger.add_all(indexes, placed)
    erased = Device(np.ones(26))
    size_ledger.erase_counted(indexes, [2] * 26, erased)
    assert len(size_ledger.shared(indexes).later) == 2  # one entry each, not one per index
    assert size_ledger.sizes(indexes).tolist() == (np.arange(26) - 1).tolist()
    assert size_ledger.tombstones(indexes).tolist() == [1] * 26
    assert (len(reads), copies.calls) == (1, 1)


def test_a_read_that_fails_leaves_every_count_pending():
    indexes = [Index(Copies()) for _ in range(3)]
    size_ledger.sizes(indexes)
    failing = [True]

    def placed():
        if failing[0]:
            raise TimeoutError("a bounded wait ran out")
        return np.array([1, 2, 3])

    size_ledger.add_all(indexes, placed)
    size_ledger.add_all(indexes, Device([10, 10, 10]))
    with pytest.raises(TimeoutError):
        size_ledger.sizes(indexes)
    failing[0] = False
    assert size_ledger.sizes(indexes).tolist() == [11, 12, 13]


def test_an_index_that_dies_or_moves_leaves_no_stale_sharing():
    copies = Copies()
    indexes = [Index(copies) for _ in range(4)]
    size_ledger.sizes(indexes)
    size_ledger.add(indexes, [1, 2, 3, 4])
    ledger = size_ledger.shared(indexes)
    # a growth replaces member 2's index: the new one is not the ledger's, whatever its id
    grown = Index(copies)
    grown.size = 30
    del indexes[2]
    gc.collect()
    assert ledger.ids is None
    indexes.insert(2, grown)
    assert size_ledger.shared(indexes) is None
    assert size_ledger.sizes(indexes).tolist() == [1, 2, 30, 4]
    assert size_ledger.shared(indexes) is not None  # joined again, nothing pending
    # the same indexes in another order (a regrouping) share a ledger of that order
    again = indexes[::-1]
    size_ledger.add_all(again, Device([5, 6, 7, 8]))
    assert size_ledger.sizes(again).tolist() == [1 + 8, 2 + 7, 30 + 6, 4 + 5][::-1]
    assert [index.size for index in indexes] == [9, 9, 36, 9]
    # an index read alone keeps its group's ledger
    assert indexes[0].size == 9 and size_ledger.sizes(indexes[:1]).tolist() == [9]
    assert size_ledger.shared(again) is not None


def test_a_count_pending_when_the_group_forms_is_not_lost():
    copies = Copies()
    indexes = [Index(copies) for _ in range(3)]
    indexes[1].add_size_later(Device([0, 5]), 1)
    assert size_ledger.shared(indexes) is None
    size_ledger.add_all(indexes, Device([1, 1, 1]))  # no shared ledger yet: one entry each
    assert size_ledger.sizes(indexes).tolist() == [1, 6, 1]
    assert size_ledger.shared(indexes) is not None
