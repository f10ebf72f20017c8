"""The cuda backend against the cpu backend, op by op, on fresh random data; plus the hash table
stress (10M keys) with its throughput printed. Needs a GPU and PyCUDA; run with -s to see figures.

SOK1X_TEST_SEED fixes the data (the seed in use is printed); SOK1X_TEST_DEVICE picks the GPU;
SOK1X_STRESS_KEYS changes the 10M keys of the stress.
"""
import math
import os
import threading
import time

import numpy as np
import pytest

pytest.importorskip("pycuda")

from sok1x.backend import cpu  # noqa: E402
from sok1x.backend.cuda import context as cuda_context  # noqa: E402
from sok1x.backend.cuda import segment_rows  # noqa: E402
from sok1x.backend import random_init  # noqa: E402

DIMS = (1, 8, 16, 128)
KEY_LIMIT = 2 ** 62


def random_keys(rng, n, distinct=None, limit=KEY_LIMIT):
    """int64 keys below `limit`, drawn from `distinct` values (duplicates when distinct < n)."""
    distinct = max(1, n // 3 if distinct is None else distinct)
    pool = rng.integers(0, limit, size=distinct, dtype=np.int64)
    return pool[rng.integers(0, distinct, size=n)]


def host(cuda, array):
    return cuda.to_host(array)


def check_mapping(keys, rows):
    """Equal keys have equal rows and distinct keys distinct rows."""
    distinct, inverse = np.unique(keys, return_inverse=True)
    inverse = inverse.reshape(-1)
    row_of_distinct = np.full(distinct.shape[0], -7, dtype=np.int64)
    row_of_distinct[inverse] = rows
    assert np.array_equal(row_of_distinct[inverse], rows), "one key got two rows"
    assert np.unique(row_of_distinct).shape[0] == distinct.shape[0], "two keys share a row"


# ---- basics -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,dtype", [((0,), np.int64), ((5,), np.int64), ((7, 3), np.float32),
                                         ((4, 128), np.float32), ((9,), np.int32)])
def test_round_trip_empty_zeros(cuda, rng, shape, dtype):
    data = (rng.standard_normal(shape) * 100).astype(dtype)
    assert np.array_equal(host(cuda, cuda.asarray(data)), data)
    zeros = host(cuda, cuda.zeros(shape, dtype))
    assert zeros.shape == shape and zeros.dtype == dtype and not zeros.any()
    assert cuda.empty(shape, dtype).shape == shape
    cuda.synchronize()


@pytest.mark.parametrize("shape,dtype", [((6,), np.int64), ((5, 3), np.float32),
                                         ((2, 3, 4), np.float32), ((1, 7), np.int32)])
def test_borrowed_arrays_are_their_memory_in_place_however_often_a_shape_comes(cuda, rng, shape,
                                                                               dtype):
    """borrow() over memory the caller owns, as a kernel call wraps its inputs at every step
    (the second and later sights of a shape copy the first's fields): each array is that
    memory, of its shape, dtype and C strides, read and written in place, and keeps its owner."""
    owners = [cuda.asarray((rng.standard_normal(shape) * 100).astype(dtype)) for _ in range(3)]
    for owner in owners:
        borrowed = cuda.borrow(cuda.address_of(owner), tuple(shape), np.dtype(dtype), owner)
        fresh = cuda.wrap(shape, dtype, cuda.address_of(owner))
        assert borrowed.base is owner and cuda.address_of(borrowed) == cuda.address_of(owner)
        assert (borrowed.shape, borrowed.dtype, borrowed.strides, borrowed.size,
                borrowed.nbytes) == (fresh.shape, fresh.dtype, fresh.strides, fresh.size,
                                     fresh.nbytes)
        assert np.array_equal(host(cuda, borrowed), host(cuda, owner))
        cuda.copy_array(borrowed, cuda.zeros(shape, dtype))
        assert not host(cuda, owner).any()
    cuda.synchronize()


@pytest.mark.parametrize("dst_shape,src_shape,dtype", [((12,), (3, 4), np.int64),
                                                       ((6, 8), (48,), np.float32),
                                                       ((0,), (0,), np.int64)])
def test_copy_array_copies_every_element_across_shapes(cuda, rng, dst_shape, src_shape, dtype):
    data = (rng.standard_normal(src_shape) * 1000).astype(dtype)
    dst = cuda.zeros(dst_shape, dtype)
    cuda.copy_array(dst, cuda.asarray(data))
    got = host(cuda, dst)
    want = np.zeros(dst_shape, dtype)
    cpu.copy_array(want, data)
    assert np.array_equal(got, want) and np.array_equal(got.reshape(-1), data.reshape(-1))


def test_copies_beside_the_stream_see_the_work_queued_before_them(cuda, rng):
    """download_staged_later: copies queued on the side stream after the work queued so far
    (a large fill, then a copy into the array) read what that work wrote; one wait collects
    them, and the views lie in page-locked memory."""
    from sok1x.backend.cuda import staging
    big = cuda.zeros((1 << 22, 8), np.float32)  # 128 MiB: the fill is still running
    cuda.fill_value(big, 3.0)
    keys = cuda.zeros((5000,), np.int64)
    want = rng.integers(0, 1 << 40, size=5000).astype(np.int64)
    cuda.copy_array(keys, cuda.asarray(want))
    waits = cuda.counts()["host_waits"]
    collect = cuda.download_staged_later([keys, big])
    got_keys, got_big = collect()
    assert cuda.counts()["host_waits"] == waits + 1
    assert np.array_equal(got_keys, want) and got_big.shape == (1 << 22, 8)
    assert float(got_big.min()) == float(got_big.max()) == 3.0
    assert staging._blocks.index_holding(got_keys) is not None  # a page-locked block's view
    cuda.synchronize()


def test_reads_many_later_hold_what_the_arrays_held_when_queued(cuda, rng):
    """read_many_later: the copies are queued at once, after the work before them (a large
    fill, a copy into the counts), so a rewrite of the arrays queued after them does not reach
    them; one wait collects them, as copies the caller owns, equal to the cpu backend's."""
    big = cuda.zeros((1 << 22, 8), np.float32)  # 128 MiB
    cuda.fill_value(big, 2.0)
    want = [rng.integers(-5, 1 << 40, size=n).astype(np.int64) for n in (26, 26, 1, 0)]
    arrays = [cuda.zeros((n,), np.int64) for n in (26, 26, 1, 0)]
    for array, data in zip(arrays, want):
        if data.size:
            cuda.copy_array(array, cuda.asarray(data))
    waits = cuda.counts()["host_waits"]
    collect = cuda.read_many_later(arrays + [big])
    for array in arrays[:3]:
        cuda.fill_value(array, 0)  # queued after the copies: not what they read
    got = collect()
    assert cuda.counts()["host_waits"] == waits + 1
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    assert float(got[4].min()) == float(got[4].max()) == 2.0
    assert all(np.array_equal(g, c) for g, c in zip(got, cpu.read_many_later(want)()))
    cuda.synchronize()


def test_pinned_blocks_are_found_by_address_and_taken_again_once_free(cuda):
    """staging.PinnedBlocks: a view anywhere inside a block is found as that block (a view
    reaching past its end, or memory of no block, is not); a block is taken again only once
    nothing but the pool holds it, in turn with the other free blocks of its size."""
    from sok1x.backend.cuda import staging
    pool = staging.PinnedBlocks()
    with cuda_context.entered():
        taken = [pool.take(n) for n in (100, 5000, 100, 70000, 5000)]
        indexes = [index for index, _ in taken]
        assert len(set(indexes)) == 5  # each still held: a new block each time
        for index, block in taken:
            assert pool.index_holding(block) == index
            assert pool.index_holding(block[17:63]) == index
            assert pool.index_holding(block[block.nbytes - 8:]) == index
            past = np.lib.stride_tricks.as_strided(block[block.nbytes - 8:], shape=(16,),
                                                   strides=(1,))  # never read: an address
            assert pool.index_holding(past) is None
        assert pool.index_holding(np.zeros(64, np.uint8)) is None  # pageable memory
        pool.queued(indexes[0], cuda_context.stream())
        cuda_context.wait_stream()
        del taken, index, block, past
        small = [indexes[0], indexes[2]]  # the two 4 KiB blocks, now free
        first = pool.take(64)
        second = pool.take(64)
        assert sorted([first[0], second[0]]) == sorted(small)
        third = pool.take(64)  # both held: a new block
        assert third[0] not in indexes
        del first
        assert pool.take(64)[0] in small  # free again
    assert pool.total_bytes == 3 * 4096 + 2 * 8192 + 131072


def test_copy_array_refuses_another_size_or_dtype_and_writes_nothing(cuda):
    dst = cuda.asarray(np.arange(6, dtype=np.int64))
    for src in (cuda.zeros((5,), np.int64), cuda.zeros((6,), np.int32),
                np.zeros(6, np.int64)):  # a host array is not copied either
        with pytest.raises(ValueError, match="copy_array"):
            cuda.copy_array(dst, src)
    assert np.array_equal(host(cuda, dst), np.arange(6))


def test_flags_read_later_keep_their_own_values_past_the_slots(cuda):
    """Many flags queued before any is read (more than the slots of staging.SmallReads): each
    read returns the value its array held when it was queued, then the array is rewritten."""
    from sok1x.backend.cuda import staging
    flag = cuda.zeros((1,), np.int64)
    reads = []
    for value in range(3 * staging._SMALL_SLOTS):
        cuda.fill_value(flag, 0)
        cuda.copy_array(flag, cuda.asarray(np.array([value], np.int64)))
        reads.append(cuda.read_later(flag))
    assert [int(read()[0]) for read in reads] == list(range(3 * staging._SMALL_SLOTS))
    again = cuda.read_later(cuda.asarray(np.arange(8, dtype=np.int64)))  # a slot is free again
    assert np.array_equal(again(), np.arange(8)) and np.array_equal(again(), np.arange(8))
    never = [cuda.read_later(flag) for _ in range(staging._SMALL_SLOTS - 1)]  # never collected
    late = [cuda.read_later(cuda.asarray(np.array([v], np.int64))) for v in range(5)]
    assert [int(read()[0]) for read in late] == list(range(5))  # the one free slot, then blocks
    del never
    wide = cuda.read_later(cuda.asarray(np.arange(40, dtype=np.int64)))  # past a slot's bytes
    assert np.array_equal(wide(), np.arange(40))


def test_a_read_later_called_again_returns_its_own_copy(cuda):
    """A read past a slot's bytes goes through the staging blocks, which later copies take
    again once it was collected: a second call still returns the values of its own copy (a
    hash group's counts are read by every member that waits on them), counted as one wait."""
    from sok1x.backend.cuda import staging
    n = staging.SMALL_BYTES // 8 + 8
    first = cuda.read_later(cuda.asarray(np.arange(n, dtype=np.int64)))
    waits = cuda.counts()["host_waits"]
    assert np.array_equal(first(), np.arange(n))
    for value in range(4):  # later copies of the same size, through the same blocks
        other = cuda.read_later(cuda.asarray(np.full(n, 100 + value, np.int64)))
        assert np.array_equal(other(), np.full(n, 100 + value))
    assert np.array_equal(first(), np.arange(n))
    assert cuda.counts()["host_waits"] == waits + 1 + 4
    many = cuda.read_many_later([cuda.asarray(np.arange(n, dtype=np.int64)),
                                 cuda.asarray(np.ones(3, np.int64))])
    assert [h.tolist() for h in many()] == [list(range(n)), [1, 1, 1]]
    cuda.to_host(cuda.asarray(np.zeros(n, np.int64)))
    assert [h.tolist() for h in many()] == [list(range(n)), [1, 1, 1]]


def test_ops_restore_the_thread_context(cuda):
    import pycuda.driver as driver

    seen = {}

    def work():
        seen["before"] = driver.Context.get_current()
        unique_keys, _ = cuda.unique(cuda.asarray(np.array([5, 3, 5], dtype=np.int64)))
        seen["unique"] = host(cuda, unique_keys)
        with pytest.raises(ValueError):
            cuda.put_rows(cuda.zeros((4, 2), np.float32), np.array([0]), np.zeros((1, 3),
                                                                              np.float32))
        seen["after"] = driver.Context.get_current()

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen["before"] is None and seen["after"] is None
    assert seen["unique"].tolist() == [5, 3]
    assert driver.Context.get_current() is None


def test_pool_blocks_die_anywhere(cuda):
    """PyCUDA's pool aborts when a block comes back with no current context: ours must not."""
    from pycuda import gpuarray

    assert cuda_context.visible_device_count() >= 1
    with cuda_context.entered():
        raw = cuda_context.memory_pool().allocate(1000)
        array = gpuarray.GPUArray((10,), np.int64, allocator=cuda_context.allocate)
    del raw, array  # outside the context: must not abort
    thread = threading.Thread(target=lambda: cuda.zeros((3,), np.float32))  # dies on its thread
    thread.start()
    thread.join()
    assert cuda_context.memory_pool().held_blocks >= 0


# ---- routing, unique --------------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 2047, 2048, 2049, 5000, 2048 * 2048 + 3, 852000])
def test_exclusive_scan_of_tiles_and_their_totals(cuda, rng, n):
    """kernel_launch.exclusive_scan (scan.cu: one launch, tiles of 2048 through shared memory,
    each adding the tiles before it by looking back at what they published) equals NumPy's
    cumulative sum, n + 1 places, across one tile, its edges, many tiles and more tiles than
    the GPU holds blocks at once (2048 * 2048 + 3: 2,049 tiles); negative and large values do
    not lose a bit (partial sums up to 2^60, inside the scan's 62 bits)."""
    from sok1x.backend.cuda.kernel_launch import exclusive_scan
    values = rng.integers(-2 ** 38, 2 ** 38, size=n).astype(np.int64)
    values[::3] = rng.integers(0, 64, size=values[::3].shape[0])
    with cuda_context.entered():
        got = host(cuda, exclusive_scan(cuda.asarray(values), n))
    np.testing.assert_array_equal(got, np.concatenate([[0], np.cumsum(values)]))


@pytest.mark.parametrize("n", [0, 1, 2049, 852000, 7_000_003])
def test_exclusive_scan_of_word_popcounts_with_its_scratch_beside_the_words(cuda, rng, n):
    """exclusive_scan(popcounts=True) of uint32 words counts each word's set bits as it reads
    them (a bitmap's ranks: scan.cu's scan_word_popcounts), with its scratch taken from the
    words' own zeroed allocation (zeros_and_scan_scratch): equals NumPy's cumulative sum of the
    popcounts; 7,000,003 words are 3,418 tiles, several waves of blocks, each waiting only on
    tiles that started before it."""
    from sok1x.backend.cuda.kernel_launch import (copy_array, exclusive_scan,
                                                  scan_scratch_words, zeros_and_scan_scratch)
    words = rng.integers(0, 2 ** 32, size=n, dtype=np.uint64).astype(np.uint32)
    words[::5] = 0
    counts = np.unpackbits(words.view(np.uint8)).reshape(n, 32).sum(axis=1, dtype=np.int64)
    with cuda_context.entered():
        zeros, scratch = zeros_and_scan_scratch(n, np.uint32, n)
        assert not np.any(host(cuda, zeros))
        assert (scratch is None) == (scan_scratch_words(n) == 0)
        copy_array(zeros, cuda.asarray(words))
        got = host(cuda, exclusive_scan(zeros, n, scratch, popcounts=True))
    np.testing.assert_array_equal(got, np.concatenate([[0], np.cumsum(counts)]))


def test_a_scan_refuses_a_scratch_too_small_before_it_launches(cuda):
    """A scratch shorter than scan_scratch_words(n) (or not int64) is refused with a
    ValueError naming both sizes, before anything is queued: the scan's tiles would otherwise
    take tickets past their states and wait for ever."""
    from sok1x.backend.cuda.kernel_launch import COUNTS, exclusive_scan, scan_scratch_words
    n = 10_000
    with cuda_context.entered():
        values = cuda.asarray(np.ones(n, np.int64))
        for scratch in (cuda.asarray(np.zeros(scan_scratch_words(n) - 1, np.int64)),
                        cuda.asarray(np.zeros(scan_scratch_words(n), np.int32))):
            launches = COUNTS["launches"]
            with pytest.raises(ValueError, match="needs %d zeroed int64" % scan_scratch_words(n)):
                exclusive_scan(values, n, scratch)
            assert COUNTS["launches"] == launches


@pytest.mark.parametrize("source,kernel,arg_types,block", [
    ("optimizers.cu", "update_lazy_adam_x4", None, 256),
    ("rows.cu", "take_rows_w16", "PPqPqPqqiPP", 256),
    ("eviction.cu", "evict_pick", "PqPqPqqPPPPPq", 128),
    ("eviction.cu", "evict_pick_rest", "PqPqPPPPPPPPP", 512),
    ("scan.cu", "scan_int64", "PqPP", 256),
])
def test_resident_blocks_equal_the_drivers_occupancy(cuda, source, kernel, arg_types, block):
    """kernel_launch.resident_blocks (CUDA's occupancy rules from a kernel's registers and
    shared memory) equals cuOccupancyMaxActiveBlocksPerMultiprocessor, asked through ctypes of
    the same cubin loaded apart; grid_cap is 16 blocks a multiprocessor rounded up to whole
    waves of them, and launch() sizes a large grid-stride kernel by it."""
    import ctypes
    from sok1x.cuda_kernels import compiler
    from sok1x.backend.cuda.kernel_launch import grid_cap, prepared, resident_blocks
    libcuda = ctypes.CDLL("libcuda.so.1")
    with cuda_context.entered():
        if arg_types is None:  # the update's format, as the cuda backend prepares it
            from sok1x.backend.cuda import optimizers as cuda_optimizers
            function = cuda_optimizers._kernel(kernel, cuda_optimizers._STATE * 3 +
                                               cuda_optimizers._ROWS_ARGS +
                                               cuda_optimizers._HYPER)
        else:
            function = prepared(source, kernel, arg_types)
        cubin = compiler._loaded(source, ())[1]
        module, handle, blocks = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_int()
        assert libcuda.cuModuleLoadData(ctypes.byref(module), cubin) == 0
        assert libcuda.cuModuleGetFunction(ctypes.byref(handle), module,
                                           kernel.encode()) == 0
        assert libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            ctypes.byref(blocks), handle, block, ctypes.c_size_t(0)) == 0
        libcuda.cuModuleUnload(module)
        resident = resident_blocks(function, block)
        assert resident == blocks.value, (kernel, function.num_regs, resident, blocks.value)
        cap = grid_cap(function, block)
        per_multiprocessor = cap // cuda_context.multiprocessor_count()
        assert cap % cuda_context.multiprocessor_count() == 0
        assert per_multiprocessor >= 16 and (per_multiprocessor % resident == 0 or
                                             resident >= 16)
        assert per_multiprocessor - 16 < resident
        print("%s: %d registers, %d blocks of %d resident, %d a multiprocessor" % (
            kernel, function.num_regs, resident, block, per_multiprocessor))


def test_a_captured_scan_replayed_zeroes_its_own_scratch(cuda, rng):
    """A scan recorded in a CUDA graph (its scratch's memset recorded before it) and replayed
    over new values in the same buffer gives each replay's sums: the tickets and flags of the
    replay before do not leak into the next."""
    from sok1x.backend.cuda import captured_graph
    from sok1x.backend.cuda.kernel_launch import copy_array, exclusive_scan
    n = 300_001
    with cuda_context.entered():
        fixed = cuda.asarray(np.zeros(n, np.int64))
        exclusive_scan(fixed, n)  # eagerly once, as the engine does before recording
        work = captured_graph.captured_work(lambda: exclusive_scan(fixed, n))
        try:
            for _ in range(3):
                values = rng.integers(-1000, 1000, size=n).astype(np.int64)
                copy_array(fixed, cuda.asarray(values))
                work.replay()
                got = host(cuda, work.outputs)
                np.testing.assert_array_equal(got, np.concatenate([[0], np.cumsum(values)]))
        finally:
            work.free()


@pytest.mark.parametrize("n", [0, 1, 1000])
@pytest.mark.parametrize("divisor", [1, 2, 7, 2 ** 40])
def test_floor_divide(cuda, rng, n, divisor):
    keys = random_keys(rng, n)
    got = cuda.floor_divide(cuda.asarray(keys), divisor)
    assert np.array_equal(host(cuda, got), cpu.floor_divide(keys, divisor))


@pytest.mark.parametrize("world_size", [1, 2, 3, 8, 13, 64])
@pytest.mark.parametrize("n", [0, 1, 33, 1000, 100003])
def test_bucket_by_owner(cuda, rng, world_size, n):
    keys = random_keys(rng, n)
    perm, counts = cuda.bucket_by_owner(cuda.asarray(keys), world_size)
    want_perm, want_counts = cpu.bucket_by_owner(keys, world_size)
    assert isinstance(counts, np.ndarray) and counts.dtype == np.int64
    assert np.array_equal(counts, want_counts)
    assert np.array_equal(host(cuda, perm), want_perm)


@pytest.mark.parametrize("rule,fixed", [(1, 0), (1, 5), (2, 0)])
@pytest.mark.parametrize("world_size", [1, 3, 8])
@pytest.mark.parametrize("n", [0, 1000, 100003])
def test_owner_rules(cuda, rng, rule, fixed, world_size, n):
    keys = random_keys(rng, n)
    fixed = fixed % world_size
    owners = host(cuda, cuda.owners_of(cuda.asarray(keys), world_size, rule, fixed))
    np.testing.assert_array_equal(owners, cpu.owners_of(keys, world_size, rule, fixed))
    perm, counts = cuda.bucket_by_owner(cuda.asarray(keys), world_size, rule, fixed)
    want_perm, want_counts = cpu.bucket_by_owner(keys, world_size, rule, fixed)
    assert np.array_equal(counts, want_counts)
    assert np.array_equal(host(cuda, perm), want_perm)


def test_many_at_once_equals_one_by_one(cuda, rng):
    arrays = [random_keys(rng, n) for n in (1000, 0, 77777, 1)]
    for (got_keys, got_inverse), keys in zip(cuda.unique_many([cuda.asarray(a) for a in arrays]),
                                              arrays):
        want_keys, want_inverse = cpu.unique(keys)
        assert np.array_equal(host(cuda, got_keys), want_keys)
        assert np.array_equal(host(cuda, got_inverse), want_inverse)
    rules = [(0, 0), (2, 0), (1, 2), (0, 0)]
    for (perm, counts), keys, (rule, fixed) in zip(
            cuda.bucket_by_owner_many([cuda.asarray(a) for a in arrays], 5, rules), arrays,
            rules):
        want_perm, want_counts = cpu.bucket_by_owner(keys, 5, rule, fixed)
        assert np.array_equal(counts, want_counts)
        assert np.array_equal(host(cuda, perm), want_perm)


@pytest.mark.parametrize("world_size", [1, 2, 8])
def test_sizes_left_on_the_device_match_the_cpu(cuda, rng, world_size):
    """What an op header carries (lookup/exchange_header.py): padded distinct keys bucketed by a
    device count, their per-owner counts, the checks' flag and the header's records."""
    arrays = [random_keys(rng, n) for n in (1000, 0, 77777, 1)]
    arrays[0][:5] = -np.arange(2, 7)  # bad keys: every kernel still stays in place
    started, counts = cuda.unique_many_start([cuda.asarray(a) for a in arrays])
    padded = cuda.unique_many_padded(started)
    rules = [(0, 0), (2, 0), (1, world_size - 1), (0, 0)]
    perms, owner_counts = cuda.bucket_by_owner_many_deferred(
        [keys for keys, _ in padded], world_size, rules, counts)
    host_counts, host_owner_counts = cuda.to_host_many([counts, owner_counts])
    for i, (keys, (unique_keys, inverse), perm, rule) in enumerate(
            zip(arrays, padded, perms, rules)):
        distinct = int(host_counts[i])
        got_keys = host(cuda, unique_keys)[:distinct]
        assert sorted(got_keys.tolist()) == sorted(set(keys.tolist()))
        np.testing.assert_array_equal(got_keys[host(cuda, inverse)], keys)
        want_perm, want_counts = cpu.bucket_by_owner(got_keys, world_size, *rule)
        np.testing.assert_array_equal(host_owner_counts[i], want_counts)
        assert host_owner_counts[i].sum() == distinct
        np.testing.assert_array_equal(host(cuda, perm)[:distinct], want_perm)
        assert not host(cuda, perm)[distinct:].any()
    bounds = cuda.index_bounds_deferred([cuda.asarray(a) for a in arrays])
    for ranges, flagged in [([[0, KEY_LIMIT]] * 4, True), ([[-6, KEY_LIMIT]] * 4, False)]:
        flag = cuda.flag_outside(bounds, np.array(ranges, np.int64))
        assert int(host(cuda, flag)[0]) == int(flagged)
        want = cpu.flag_outside(cpu.index_bounds_deferred(arrays), np.array(ranges, np.int64))
        assert int(want[0]) == int(flagged)
    fields = [11, 22, 33, 1, 0, 4]
    records = cuda.header_records(fields, world_size, owner_counts, cuda.asarray(
        np.ones(1, np.int64)), 64)
    want = cpu.header_records(fields, world_size, host_owner_counts, np.ones(1, np.int64), 64)
    np.testing.assert_array_equal(host(cuda, records), want)
    assert want[0, 4] == 1 and (want[:, 6:10] == host_owner_counts.T).all()
    shared = np.array([5, -7, 1 << 40], np.int64)  # told every peer alike, from field 12 on
    records = cuda.header_records(fields, world_size, owner_counts, None, 20, shared, 12)
    want = cpu.header_records(fields, world_size, host_owner_counts, None, 20, shared, 12)
    np.testing.assert_array_equal(host(cuda, records), want)
    assert (want[:, 12:15] == shared).all() and not want[:, 15:].any()
    assert (want[:, 6:10] == host_owner_counts.T).all() and not want[:, 10:12].any()


@pytest.mark.parametrize("world_size", [2, 8])
def test_per_peer_capacity_pieces_match_the_cpu(cuda, rng, world_size):
    """What a lookup sized by per-peer capacities runs (engine/lookup/peer_capacity.py): slots
    from device counts with the overflow bit, rows packed into the capacity buffers and back
    (key rows, vector rows of every word width), keys -1 as padding, padded rows that are no
    row and sum to nothing, and the overflow bit in the op header."""
    lengths = [3000, 0, 77, 1]
    counts = np.stack([rng.multinomial(n * 9 // 10, [1.0 / world_size] * world_size)
                       for n in lengths]).astype(np.int64)
    for caps in (counts + 1, np.maximum(counts - rng.integers(-2, 3, size=counts.shape), 0),
                 np.maximum(counts - 3, 0)):  # the last overflows
        flag_in = np.ones(1, np.int64)
        slots, flag = cuda.peer_slots_many(cuda.asarray(counts), caps, lengths,
                                           cuda.asarray(flag_in), 4)
        want_slots, want_flag = cpu.peer_slots_many(counts, caps, lengths, flag_in, 4)
        for got, want in zip(slots, want_slots):
            np.testing.assert_array_equal(host(cuda, got), want)
        assert int(host(cuda, flag)[0]) == int(want_flag[0])
    assert int(want_flag[0]) == 5 and (want_slots[0] == -1).sum() > lengths[0] // 10
    _, clear = cpu.peer_slots_many(counts, counts, lengths, None, 4)
    assert int(clear[0]) == 0
    for row_shape, dtype in [((), np.int64), ((3,), np.float32), ((16,), np.float32)]:
        src = (rng.standard_normal((500,) + row_shape) * 100).astype(dtype)
        src_index = rng.permutation(600)[:400] - 100  # some negative: those move nothing
        dst_index = rng.permutation(900)[:400] - 300
        want = np.full((600,) + row_shape, -1, dtype)
        cpu.move_rows(src, src_index, want, dst_index)
        got = (cuda.fill_value(cuda.empty(want.shape, dtype), -1) if dtype == np.int64 else
               cuda.asarray(np.full(want.shape, -1, dtype)))
        cuda.move_rows(cuda.asarray(src), cuda.asarray(src_index), got, cuda.asarray(dst_index))
        np.testing.assert_array_equal(host(cuda, got), want)
    rows = rng.integers(0, 5000, size=4000).astype(np.int64)
    rows[rng.permutation(4000)[:300]] = -1  # a slot no key filled
    items = [(rows, 5000, np.array([0, 2500, 5000], np.int64))]
    started, sizes = cuda.distinct_rows_many_start([(cuda.asarray(rows),) + items[0][1:]])
    (g_rows, g_inverse, g_ranks), = cuda.distinct_rows_many_finish(started, host(cuda, sizes))
    (w_rows, w_inverse, w_ranks), = cpu.distinct_rows_many(items)
    np.testing.assert_array_equal(host(cuda, g_rows), w_rows)
    np.testing.assert_array_equal(host(cuda, g_inverse), w_inverse)
    np.testing.assert_array_equal(g_ranks, w_ranks)
    assert (w_inverse == -1).sum() == (rows == -1).sum() > 0
    values = rng.standard_normal((4000, 8)).astype(np.float32)
    summed = host(cuda, cuda.segment_sum(cuda.asarray(values), g_inverse, w_rows.shape[0]))
    assert_sums_close(summed, cpu.segment_sum(values, w_inverse, w_rows.shape[0]))
    fields = [11, 22, 33, 1, 0, 4]
    records = cuda.header_records(fields, world_size, None, flag, 64)
    want = cpu.header_records(fields, world_size, None, want_flag, 64)
    np.testing.assert_array_equal(host(cuda, records), want)
    assert (want[:, 4] == 5).all()


def test_the_halves_of_unique_and_distinct_rows_equal_the_whole(cuda, rng):
    arrays = [random_keys(rng, n) for n in (1000, 0, 777)]
    started, counts = cuda.unique_many_start([cuda.asarray(a) for a in arrays], ordered=True)
    halves = cuda.unique_many_finish(started, host(cuda, counts))
    for (got_keys, got_inverse), keys in zip(halves, arrays):
        want_keys, want_inverse = cpu.unique(keys)
        np.testing.assert_array_equal(host(cuda, got_keys), want_keys)
        np.testing.assert_array_equal(host(cuda, got_inverse), want_inverse)
    rows = [rng.integers(0, 5000, size=n).astype(np.int64) for n in (3000, 0, 10)]
    items = [(cuda.asarray(r), 5000, np.array([0, 2500, 5000], np.int64)) for r in rows]
    started, sizes = cuda.distinct_rows_many_start(items)
    got = cuda.distinct_rows_many_finish(started, host(cuda, sizes))
    want = cpu.distinct_rows_many([(r, 5000, np.array([0, 2500, 5000], np.int64)) for r in rows])
    for (g_rows, g_inverse, g_ranks), (w_rows, w_inverse, w_ranks) in zip(got, want):
        np.testing.assert_array_equal(host(cuda, g_rows), w_rows)
        np.testing.assert_array_equal(host(cuda, g_inverse), w_inverse)
        np.testing.assert_array_equal(g_ranks, w_ranks)


@pytest.mark.parametrize("bound", [64, 5000, 1 << 22])
def test_distinct_rows_of_dense_and_sparse_bitmaps(cuda, rng, bound):
    """Bitmap words with many marked rows and with few (table_groups.cu's for_each_marked_row
    takes them two ways) give the cpu's distinct rows, inverse and ranks."""
    rows = rng.integers(0, bound, size=6000).astype(np.int64)
    rows[:100] = np.arange(100) % bound  # a run of neighbours: some dense words at any bound
    rows[rng.permutation(6000)[:50]] = -1
    boundaries = np.array([0, bound // 3, bound], np.int64)
    (g_rows, g_inverse, g_ranks), = cuda.distinct_rows_many([(cuda.asarray(rows), bound,
                                                              boundaries)])
    (w_rows, w_inverse, w_ranks), = cpu.distinct_rows_many([(rows, bound, boundaries)])
    np.testing.assert_array_equal(host(cuda, g_rows), w_rows)
    np.testing.assert_array_equal(host(cuda, g_inverse), w_inverse)
    np.testing.assert_array_equal(g_ranks, w_ranks)


def test_index_bounds(cuda, rng):
    arrays = [random_keys(rng, 100003, limit=2 ** 40) - 2 ** 39, np.zeros(0, np.int64),
              np.array([5], np.int64), rng.integers(-3, 3, size=77).astype(np.int32)]
    got = cuda.index_bounds([cuda.asarray(a) for a in arrays])
    np.testing.assert_array_equal(got, cpu.index_bounds(arrays))


def test_table_group_ops(cuda, rng):
    """join_keys, join_rows, row_view, local_rows and distinct_rows_many against the cpu's."""
    parts = [rng.integers(0, 1000, size=n).astype(np.int64) for n in (0, 5, 4099, 1, 0, 300)]
    offsets = np.array([0, 10, 2000, 9000, 9500, 123456], np.int64)
    got = cuda.join_keys([cuda.asarray(p) for p in parts], offsets)
    np.testing.assert_array_equal(host(cuda, got), cpu.join_keys(parts, offsets))
    rows = [rng.standard_normal((n, 3)).astype(np.float32) for n in (7, 0, 1000)]
    np.testing.assert_array_equal(host(cuda, cuda.join_rows([cuda.asarray(r) for r in rows])),
                                  cpu.join_rows(rows))
    # rows of 1 to 160 floats, 16 bytes a load where every part starts aligned: a part that is
    # a view one row in (aligned or not as its width has it) and one of [n, 2, 4] rows
    for width in (1, 2, 4, 5, 8, 128, 160):
        shape = (width,) if width != 8 else (2, 4)
        wide = [rng.standard_normal((n,) + shape).astype(np.float32) for n in (7, 0, 1000, 33)]
        parts = [cuda.asarray(r) for r in wide]
        parts[3] = cuda.row_view(parts[3], 1, 33)  # starts 4 * width bytes in
        joined = cuda.join_rows(parts)
        assert joined.shape == (7 + 1000 + 32,) + shape
        np.testing.assert_array_equal(host(cuda, joined),
                                      cpu.join_rows(wide[:3] + [wide[3][1:]]))
    # a width that allows 16 bytes a load, one part starting 4 bytes into its allocation: the
    # join takes 4 bytes a load
    from sok1x.backend.cuda.kernel_launch import ptr, wrap
    words = rng.standard_normal(4 * 20 + 1).astype(np.float32)
    allocation = cuda.asarray(words)
    odd = wrap((20, 4), np.float32, ptr(allocation) + 4, base=allocation)
    whole = rng.standard_normal((9, 4)).astype(np.float32)
    np.testing.assert_array_equal(host(cuda, cuda.join_rows([cuda.asarray(whole), odd])),
                                  np.concatenate([whole, words[1:].reshape(20, 4)]))
    flat = cuda.asarray(rows[2])
    view = cuda.row_view(flat, 10, 20)
    np.testing.assert_array_equal(host(cuda, view), rows[2][10:20])
    cuda.fill_value(view, 2.5)
    np.testing.assert_array_equal(host(cuda, flat)[10:20], 2.5)
    cuts = np.array([0, 0, 3, 3, 700, 1000], np.int64)
    views = cuda.row_views(flat, cuts)
    want = cpu.row_views(host(cuda, flat), cuts)
    assert len(views) == len(want) == 5
    for t, (got, part) in enumerate(zip(views, want)):
        made = cuda.row_view(flat, cuts[t], cuts[t + 1])
        assert (got.shape, got.strides, got.nbytes, got.size) == (
            made.shape, made.strides, made.nbytes, made.size) == (
            part.shape, part.strides, part.nbytes, part.size)
        assert int(got.gpudata) == int(made.gpudata) or not got.size
        np.testing.assert_array_equal(host(cuda, got), part)
    cuda.fill_value(views[3], -1.0)  # a view writes into the array it cuts
    np.testing.assert_array_equal(host(cuda, flat)[3:700], -1.0)
    starts, stops = np.array([0, 5, 5, 900], np.int64), np.array([2, 5, 400, 1000], np.int64)
    spans = cuda.row_views(flat, starts, stops)  # spans with gaps between them
    assert len(spans) == 4
    for got, part, start, stop in zip(spans, cpu.row_views(host(cuda, flat), starts, stops),
                                      starts, stops):
        made = cuda.row_view(flat, start, stop)
        assert (got.shape, got.strides, got.nbytes) == (made.shape, made.strides, made.nbytes)
        assert int(got.gpudata) == int(made.gpudata) or not got.size
        np.testing.assert_array_equal(host(cuda, got), part)
    row_starts = np.array([0, 100, 100, 5000, 70001], np.int64)
    for n, bound in ((0, 70001), (50000, 70001), (3, 70001), (200000, 33)):
        values = rng.integers(0, min(bound, row_starts[-1]), size=n).astype(np.int64)
        bounds = row_starts if bound == 70001 else np.array([0, 10, 33], np.int64)
        (d, i, r), = cuda.distinct_rows_many([(cuda.asarray(values), bound, bounds)])
        (wd, wi, wr), = cpu.distinct_rows_many([(values, bound, bounds)])
        np.testing.assert_array_equal(host(cuda, d), wd)
        np.testing.assert_array_equal(host(cuda, i), wi)
        np.testing.assert_array_equal(r, wr)
        if bound == 70001:
            moves = np.arange(4, dtype=np.int64) * 3
            length = len(wd) + 9
            got = host(cuda, cuda.local_rows(d, row_starts, moves, length))
            want = cpu.local_rows(wd, row_starts, moves, length)
            table = np.searchsorted(row_starts[:-1], wd, side="right") - 1
            places = np.arange(len(wd)) + moves[table]
            np.testing.assert_array_equal(got[places], want[places])


def test_pooling_ops(cuda, rng):
    matrix = rng.integers(0, 1000, size=(5001, 3)).astype(np.int64)
    np.testing.assert_array_equal(host(cuda, cuda.column(cuda.asarray(matrix), 2)),
                                  cpu.column(matrix, 2))
    ids = rng.integers(0, 300, size=5001).astype(np.int64)
    np.testing.assert_array_equal(host(cuda, cuda.segment_counts(cuda.asarray(ids), 400)),
                                  cpu.segment_counts(ids, 400))
    values = rng.standard_normal((300, 16)).astype(np.float32)
    factors = rng.standard_normal(300).astype(np.float32)
    factors[::7] = 0.0
    for divide in (False, True):
        got = host(cuda, cuda.scale_rows(cuda.asarray(values), cuda.asarray(factors), divide))
        np.testing.assert_allclose(got, cpu.scale_rows(values, factors, divide), rtol=1e-6)
    times = np.zeros(1000)
    device_times = cuda.asarray(times)
    rows = rng.choice(1000, size=300, replace=False).astype(np.int64)
    cuda.fill_rows(device_times, cuda.asarray(rows), 1.7e9 + 0.25)
    cpu.fill_rows(times, rows, 1.7e9 + 0.25)
    np.testing.assert_array_equal(host(cuda, device_times), times)


def test_a_stamp_recorded_in_a_graph_writes_each_replays_clock(cuda, rng):
    """fill_rows inside time_given(clock) writes the time the clock holds when it runs: recorded
    once in a graph, each replay stamps the time write_given put into the clock before it, as
    the cpu twin does when it runs the fill again."""
    from sok1x.backend.cuda import captured_graph
    times = np.zeros(500)
    device_times = cuda.asarray(times)
    rows = rng.choice(500, size=120, replace=False).astype(np.int64)
    rows[::9] = -1  # padding, skipped
    device_rows = cuda.asarray(rows)
    given, clock = cuda.zeros((2,), np.float32), cuda.zeros((1,), np.float64)
    host_given, host_clock = np.zeros(2, np.float32), np.zeros(1)

    def stamp():
        with cuda.time_given(clock):
            cuda.fill_rows(device_times, device_rows, -1.0)  # the value passed is not used
    cuda.write_given(given, [0.5, 0.25], clock, 1.7e9 + 0.125)
    stamp()  # once eagerly, then recorded
    work = captured_graph.captured_work(lambda: stamp() or [])
    try:
        for now in (1.8e9 + 0.5, 1.8e9 + 1.75, 1.9e9 + 1e-6):
            cuda.write_given(given, [now / 1e9, 1.0], clock, now)
            work.replay()
            cpu.write_given(host_given, [now / 1e9, 1.0], host_clock, now)
            with cpu.time_given(host_clock):
                cpu.fill_rows(times, rows, -1.0)
            np.testing.assert_array_equal(host(cuda, device_times), times)
            np.testing.assert_array_equal(host(cuda, clock), [now])
            np.testing.assert_array_equal(host(cuda, given), host_given)
    finally:
        work.free()
    assert set(times[rows[rows >= 0]]) == {1.9e9 + 1e-6}
    with pytest.raises(ValueError, match="clock"):
        cuda.write_given(given, [1.0, 2.0], cuda.zeros((3,), np.float64), 1.0)
    with pytest.raises(ValueError, match="clock"):
        cuda.write_given(given, [1.0, 2.0], clock, 1.0, step=4)  # a step needs a clock of two
    with pytest.raises(ValueError, match="clock"):
        with cuda.time_given(cuda.zeros((1,), np.float32)):
            pass


def test_a_step_recorded_in_a_graph_marks_each_replays_step(cuda, rng):
    """stamp_last_step inside step_given(clock) marks rows with the step the clock holds when it
    runs (clock[1], written by write_given's step): recorded once in a graph, each replay marks
    its own step, as the cpu twin does when it runs the stamp again."""
    from sok1x.backend.cuda import captured_graph
    statistics = rng.integers(0, 50, size=(300, 2)).astype(np.int64)
    device_statistics = cuda.asarray(statistics)
    rows = rng.choice(300, size=80, replace=False).astype(np.int64)
    rows[::7] = -1
    device_rows = cuda.asarray(rows)
    given, clock = cuda.zeros((1,), np.float32), cuda.zeros((2,), np.float64)
    host_given, host_clock = np.zeros(1, np.float32), np.zeros(2)

    def stamp():
        with cuda.step_given(clock):
            cuda.stamp_last_step(device_statistics, device_rows, -5)  # the step passed unused
    cuda.write_given(given, [0.0], clock, 1.7e9, step=3)
    stamp()
    work = captured_graph.captured_work(lambda: stamp() or [])
    try:
        for step in (4, 9, 2 ** 40 + 1):
            cuda.write_given(given, [0.0], clock, 1.8e9, step=step)
            work.replay()
            cpu.write_given(host_given, [0.0], host_clock, 1.8e9, step=step)
            with cpu.step_given(host_clock):
                cpu.stamp_last_step(statistics, rows, -5)
            np.testing.assert_array_equal(host(cuda, device_statistics), statistics)
            np.testing.assert_array_equal(host(cuda, clock), [1.8e9, step])
    finally:
        work.free()
    assert set(statistics[rows[rows >= 0], 0]) == {2 ** 40 + 1}
    with pytest.raises(ValueError, match="clock"):
        with cuda.step_given(cuda.zeros((1,), np.float64)):
            pass


@pytest.mark.parametrize("n,distinct,limit", [(0, 1, KEY_LIMIT), (1, 1, KEY_LIMIT),
                                              (7, 7, 10), (1000, 300, KEY_LIMIT),
                                              (1000, 1, KEY_LIMIT), (250000, 60000, KEY_LIMIT),
                                              (250000, 250000, KEY_LIMIT), (100000, 50, 64)])
def test_unique(cuda, rng, n, distinct, limit):
    keys = random_keys(rng, n, distinct, limit)
    unique_keys, inverse = cuda.unique(cuda.asarray(keys))
    want_keys, want_inverse = cpu.unique(keys)
    assert np.array_equal(host(cuda, unique_keys), want_keys)
    assert np.array_equal(host(cuda, inverse), want_inverse)


# ---- rows -------------------------------------------------------------------------------------

ROW_CASES = [((dim,), np.float32) for dim in DIMS] + [
    ((), np.int64), ((3,), np.int32), ((5,), np.uint8), ((2, 4), np.float64)]


@pytest.mark.parametrize("row_shape,dtype", ROW_CASES)
@pytest.mark.parametrize("n", [0, 1, 1000])
def test_take_put_gather(cuda, rng, row_shape, dtype, n):
    table = (rng.standard_normal((257,) + row_shape) * 50).astype(dtype)
    index = rng.integers(0, 257, size=n)
    device_table = cuda.asarray(table)
    assert np.array_equal(host(cuda, cuda.take_rows(device_table, cuda.asarray(index))),
                          cpu.take_rows(table, index))
    with_missing = np.where(rng.random(n) < 0.3, -1, index)
    assert np.array_equal(host(cuda, cuda.gather_rows(device_table, cuda.asarray(with_missing))),
                          cpu.gather_rows(table, with_missing))
    distinct = rng.permutation(257)[:min(n, 257)]
    src = (rng.standard_normal((distinct.shape[0],) + row_shape) * 50).astype(dtype)
    want = table.copy()
    cpu.put_rows(want, distinct, src)
    cuda.put_rows(device_table, cuda.asarray(distinct), cuda.asarray(src))
    assert np.array_equal(host(cuda, device_table), want)


@pytest.mark.parametrize("row_shape,dtype", [((128,), np.float32), ((12,), np.float32),
                                             ((3,), np.float32), ((), np.int64)])
def test_row_copies_longer_than_one_grid(cuda, rng, row_shape, dtype):
    """take_rows and gather_rows (zeros, or nothing written, at -1 and past the end) over more
    words than launch()'s grid has threads, so that each thread walks several positions: rows
    of 32 16-byte words, of 3, of 3 4-byte words, of one 8-byte word; equal to the cpu
    backend's."""
    table = (rng.standard_normal((50000,) + row_shape) * 50).astype(dtype)
    words = {(128,): 32, (12,): 3, (3,): 3, (): 1}[row_shape]
    n = max(300000, 3000000 // words)  # at least 3M words: several turns of the whole grid
    index = rng.integers(0, 50000, size=n)
    device_table = cuda.asarray(table)
    assert np.array_equal(host(cuda, cuda.take_rows(device_table, cuda.asarray(index))),
                          cpu.take_rows(table, index))
    missing = np.where(rng.random(n) < 0.3, -1, np.where(rng.random(n) < 0.1, 50000, index))
    assert np.array_equal(host(cuda, cuda.gather_rows(device_table, cuda.asarray(missing))),
                          cpu.gather_rows(table, missing))
    used = (missing >= 0) & (missing < 50000)  # fill=False writes these places only
    unfilled = host(cuda, cuda.gather_rows(device_table, cuda.asarray(missing), fill=False))
    assert np.array_equal(unfilled[used], table[missing[used]])


@pytest.mark.parametrize("count", [1, 3, 4, 5])
@pytest.mark.parametrize("row_shape,dtype", [((128,), np.float32), ((8,), np.float32),
                                             ((3,), np.float32), ((2,), np.float64)])
@pytest.mark.parametrize("fill", [True, False])
def test_gather_rows_many_equals_a_gather_of_each(cuda, rng, count, row_shape, dtype, fill):
    """gather_rows_many (one launch for up to four arrays whose rows are whole 16-byte words,
    a gather each otherwise) gives each array's gather_rows: the rows, zeros at -1 and past the
    end with fill, and those places left as they were without it."""
    tables = [(rng.standard_normal((300,) + row_shape) * 50).astype(dtype) for _ in range(count)]
    index = np.where(rng.random(2000) < 0.2, -1, rng.integers(0, 300, size=2000))
    index[:3] = [299, 300, 0]  # the last row, one past the end, the first
    got = cuda.gather_rows_many([cuda.asarray(t) for t in tables], cuda.asarray(index), fill)
    assert len(got) == count
    kept = (index >= 0) & (index < 300)
    for table, out in zip(tables, got):
        out = host(cuda, out)
        want = cpu.gather_rows(table, index)
        assert out.shape == want.shape and out.dtype == want.dtype
        if fill:
            assert np.array_equal(out, want)
        else:
            assert np.array_equal(out[kept], want[kept])
    assert cuda.gather_rows_many([], cuda.asarray(index)) == []
    empty = cuda.gather_rows_many([cuda.asarray(t) for t in tables],
                                  cuda.asarray(np.zeros(0, np.int64)), fill)
    assert [host(cuda, e).shape for e in empty] == [(0,) + row_shape] * count


def test_index_dtypes(cuda, rng):
    table = rng.standard_normal((50, 8)).astype(np.float32)
    index = rng.integers(0, 50, size=100).astype(np.int32)
    got = cuda.take_rows(cuda.asarray(table), cuda.asarray(index))  # int32 on the GPU: widened
    assert np.array_equal(host(cuda, got), table[index])
    got = cuda.take_rows(cuda.asarray(table), index)  # NumPy input: copied over
    assert np.array_equal(host(cuda, got), table[index])
    with pytest.raises(TypeError):
        cuda.take_rows(cuda.asarray(table), cuda.asarray(index.astype(np.float32)))


def assert_sums_close(got, want):
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("dim", DIMS + (0,))
@pytest.mark.parametrize("n", [0, 1, 5000])
def test_segment_sum_and_scatter_add(cuda, rng, dim, n):
    values = rng.standard_normal((n, dim)).astype(np.float32)
    ids = rng.integers(0, 97, size=n)
    got = cuda.segment_sum(cuda.asarray(values), cuda.asarray(ids), 100)
    assert got.shape == (100, dim)
    assert_sums_close(host(cuda, got), cpu.segment_sum(values, ids, 100))
    table = rng.standard_normal((97, dim)).astype(np.float32)
    want = table.copy()
    cpu.scatter_add_rows(want, ids, values)
    device_table = cuda.asarray(table)
    cuda.scatter_add_rows(device_table, cuda.asarray(ids), cuda.asarray(values))
    assert_sums_close(host(cuda, device_table), want)


def test_rows_of_four_columns_go_four_to_a_thread(cuda, rng, monkeypatch):
    """segment_sum and scatter_add_rows take add_rows_float32_x4 where the width is a multiple
    of 4 and both arrays are 16-byte aligned (values one element into their block are not), and
    agree with cpu either way, a negative row adding nothing and a hot row many times."""
    chosen, kernel = [], cuda._add_rows_kernel
    monkeypatch.setattr(cuda, "_add_rows_kernel",
                        lambda name: chosen.append(name) or kernel(name))
    for dim, offset in ((12, 0), (12, 1), (6, 0)):
        ids = rng.integers(-1, 40, size=3000)
        ids[::3] = 7
        flat = rng.standard_normal((3000 * dim + offset,)).astype(np.float32)
        values = flat[offset:].reshape(3000, dim)
        with cuda_context.entered():  # PyCUDA makes a view with the context current
            device_values = cuda.asarray(flat)[offset:].reshape(3000, dim)
        used = ids >= 0
        want = cpu.segment_sum(values[used], ids[used], 40)
        got = cuda.segment_sum(device_values, cuda.asarray(ids), 40)
        assert_sums_close(host(cuda, got), want)
        table = rng.standard_normal((40, dim)).astype(np.float32)
        device_table = cuda.asarray(table)
        cuda.scatter_add_rows(device_table, cuda.asarray(ids), device_values)
        assert_sums_close(host(cuda, device_table), table + want)
    assert chosen == ["float32_x4"] * 2 + ["float32"] * 4


@pytest.mark.parametrize("dim", [4, 16, 64, 128, 136])
def test_segment_sum_of_many_ids_sorts_them_by_segment(cuda, rng, monkeypatch, dim):
    """Past segment_rows.SORTED_MIN ids, float32 rows of whole float4s (at least MIN_WIDTH; the
    narrower ones here call it directly) are summed segment by segment (a counting sort, then
    each segment's rows summed in registers and stored, cuda_kernels/segment_rows.cu), without
    add_rows, and agree with cpu: a hot segment spread over hundreds of chunks, empty segments
    written as zeros, ids below 0 or past the segments skipped; unaligned values take add_rows
    and agree too."""
    chosen, kernel = [], cuda._add_rows_kernel
    monkeypatch.setattr(cuda, "_add_rows_kernel",
                        lambda name: chosen.append(name) or kernel(name))
    n = segment_rows.SORTED_MIN * 3 + 17
    segments = n // 2
    ids = rng.integers(0, segments, size=n)
    ids[::5] = 11
    ids[7::97], ids[9::101] = -1, segments + 3
    used = (ids >= 0) & (ids < segments)
    flat = rng.standard_normal((n * dim + 1,)).astype(np.float32)
    values = flat[:-1].reshape(n, dim)
    want = cpu.segment_sum(values[used], ids[used], segments)
    if dim >= segment_rows.MIN_WIDTH:
        got = cuda.segment_sum(cuda.asarray(values), cuda.asarray(ids), segments)
    else:
        with cuda_context.entered():
            got = segment_rows.sorted_segment_sum(cuda.asarray(values), cuda.asarray(ids),
                                                  segments, cuda.empty((segments, dim),
                                                                       np.float32))
    got = host(cuda, got)
    assert_sums_close(got, want)
    assert not got[np.setdiff1d(np.arange(segments), ids[used])].any()
    assert chosen == []
    with cuda_context.entered():  # one element into its block: not 16-byte aligned
        device_values = cuda.asarray(flat)[1:].reshape(n, dim)
    got = cuda.segment_sum(device_values, cuda.asarray(np.where(used, ids, -1)), segments)
    assert_sums_close(host(cuda, got), cpu.segment_sum(flat[1:].reshape(n, dim)[used],
                                                       ids[used], segments))
    assert len(chosen) == 1


def test_sums_by_segment_replay_in_a_graph(cuda, rng):
    """The sorted segment_sum recorded in a CUDA graph sums each replay's values by each
    replay's ids (its counts, order and crossing rows made anew), a hot segment among them."""
    n, segments, dim = segment_rows.SORTED_MIN * 2, 9000, segment_rows.MIN_WIDTH
    with cuda_context.entered():
        ids = cuda.asarray(rng.integers(0, segments, size=n))
        values = cuda.asarray(rng.standard_normal((n, dim)).astype(np.float32))
        cuda.segment_sum(values, ids, segments)  # eagerly first, as the engine does
        work = cuda.captured_work(lambda: [cuda.segment_sum(values, ids, segments)])
        try:
            for step in range(4):
                fresh = rng.standard_normal((n, dim)).astype(np.float32)
                fresh_ids = rng.integers(0, segments // (1 + step), size=n)
                fresh_ids[::3 + step] = step  # hot: over hundreds of chunks
                cuda.write_rows(values, 0, cuda.asarray(fresh))
                cuda.write_rows(ids, 0, cuda.asarray(fresh_ids))
                work.replay()
                assert_sums_close(host(cuda, work.outputs[0]),
                                  cpu.segment_sum(fresh, fresh_ids, segments))
        finally:
            work.free()


@pytest.mark.parametrize("kept", [False, True])
def test_sums_zero_every_padded_row_past_one_grid(cuda, rng, kept):
    """More segments than one launch's grid has threads (zero_unsummed_rows' test runs a thread
    a segment, its warps zeroing the rows they found together, over a grid-stride loop) and a
    count that leaves the last warp part empty: every segment no id falls in reads zero, from an
    output of garbage, with and without marks that say every row may hold a sum."""
    n, segments, dim = segment_rows.SORTED_MIN, (1 << 20) + 13, segment_rows.MIN_WIDTH
    ids = rng.integers(0, segments, size=n)
    ids[::7] = segments - 1  # the last segment, hot: over many chunks
    values = rng.standard_normal((n, dim)).astype(np.float32)
    with cuda_context.entered():
        out = cuda.fill_value(cuda.empty((segments, dim), np.float32), 7.0)
        dirty = cuda.fill_value(cuda.empty((segments,), np.int8), -1) if kept else None
        got = host(cuda, segment_rows.sorted_segment_sum(
            cuda.asarray(values), cuda.asarray(ids), segments, out, dirty))
    assert_sums_close(got, cpu.segment_sum(values, ids, segments))
    assert not got[np.setdiff1d(np.arange(segments), ids)].any()
    if kept:
        assert np.array_equal(host(cuda, dirty) == 0,
                              np.bincount(ids, minlength=segments) == 0)


def test_sums_kept_zero_only_the_rows_an_earlier_replay_wrote(cuda, rng):
    """A sorted segment_sum recorded inside sums_kept(dirty) (a replayed backward's:
    backend/kept_sums.py) equals cpu at every replay while the segments its ids fill shrink and
    grow (a row summed at one replay and empty at the next is zeroed again), from an output of
    garbage at the first replay (dirty all -1); a row dirty marks as zeros is not written (the
    zeros the kernel leaves out), and after dirty is filled with -1 again every empty row is."""
    n, segments, dim = segment_rows.SORTED_MIN * 2, 20011, segment_rows.MIN_WIDTH
    with cuda_context.entered():
        ids = cuda.asarray(rng.integers(0, segments, size=n))
        values = cuda.asarray(rng.standard_normal((n, dim)).astype(np.float32))
        cuda.segment_sum(values, ids, segments)  # eagerly first, as the engine does
        dirty = cuda.fill_value(cuda.empty((segments,), np.int8), -1)

        def run():
            with cuda.sums_kept(dirty):
                return [cuda.segment_sum(values, ids, segments)]
        work = cuda.captured_work(run)
        try:
            cuda.fill_value(work.outputs[0], 7.0)  # garbage the first replay must not keep
            for step, top in enumerate([segments, 3000, segments // 2, 500, segments]):
                fresh = rng.standard_normal((n, dim)).astype(np.float32)
                fresh_ids = rng.integers(0, top, size=n)
                fresh_ids[::3 + step] = step  # hot: over hundreds of chunks
                cuda.write_rows(values, 0, cuda.asarray(fresh))
                cuda.write_rows(ids, 0, cuda.asarray(fresh_ids))
                work.replay()
                got = host(cuda, work.outputs[0])
                assert_sums_close(got, cpu.segment_sum(fresh, fresh_ids, segments))
                marks = host(cuda, dirty)
                assert np.array_equal(marks == 0, np.bincount(fresh_ids, minlength=segments) == 0)
            empty = int(np.flatnonzero(marks == 0)[0])
            cuda.write_rows(work.outputs[0], empty, cuda.asarray(np.full((1, dim), 5.0,
                                                                          np.float32)))
            work.replay()  # the same ids: that row is marked zeros, so it is left as it is
            assert np.all(host(cuda, work.outputs[0])[empty] == 5.0)
            cuda.fill_value(dirty, -1)  # as replayed_step._refill does after writing the sums
            work.replay()
            assert_sums_close(host(cuda, work.outputs[0]),
                              cpu.segment_sum(fresh, fresh_ids, segments))
        finally:
            work.free()
    with pytest.raises(ValueError, match="sums_kept"):
        with cuda.sums_kept(dirty):
            cuda.segment_sum(values, ids, segments + 1)


def test_segment_sum_1d_and_float64(cuda, rng):
    values = rng.standard_normal(3000)
    ids = rng.integers(0, 10, size=3000)
    got = host(cuda, cuda.segment_sum(cuda.asarray(values), cuda.asarray(ids), 12))
    np.testing.assert_allclose(got, cpu.segment_sum(values, ids, 12), rtol=1e-12, atol=1e-10)


# ---- init_rows --------------------------------------------------------------------------------

SPECS = [random_init.make_spec("constant", 0.25), random_init.make_spec("uniform", -0.05, 0.05, 7),
         random_init.make_spec("normal", 0.1, 0.5, 123),
         random_init.make_spec("truncated_normal", 0.0, 1.0, 2 ** 63 + 5)]


@pytest.mark.parametrize("spec", SPECS, ids=[spec.kind for spec in SPECS])
def test_init_rows(cuda, rng, spec):
    worst, differing, total = 0.0, 0, 0
    for dim in DIMS:
        keys = random_keys(rng, 4096)
        keys[:4] = [0, 1, KEY_LIMIT - 1, 2 ** 63 - 1]
        rows = rng.permutation(5000)[:4096]
        table = rng.standard_normal((5000, dim)).astype(np.float32)
        device_table = cuda.asarray(table)
        cpu.init_rows(table, rows, keys, spec, 3)
        cuda.init_rows(device_table, cuda.asarray(rows), cuda.asarray(keys), spec, 3)
        got = host(cuda, device_table)
        diff = np.abs(got.astype(np.float64) - table)
        worst = max(worst, float(diff.max()))
        differing += int(np.count_nonzero(got != table))
        total += table.size
    print("\ninit_rows %-16s max abs diff vs cpu %.3g, %d of %d values not bit-identical" % (
        spec.kind, worst, differing, total))
    assert differing <= max(1, total // 10 ** 6)
    assert worst <= 4.0 * max(abs(spec.a), abs(spec.b), 1.0)


# ---- HashIndex --------------------------------------------------------------------------------

def test_hash_index_agrees_with_cpu(cuda, rng):
    capacity = 6000
    gpu_index, cpu_index = cuda.HashIndex(capacity), cpu.HashIndex(capacity)
    seen = np.zeros(0, dtype=np.int64)
    for _ in range(5):
        fresh = random_keys(rng, 3000, 900)
        keys = np.concatenate([fresh, seen[rng.integers(0, max(seen.shape[0], 1), 500)]]) \
            if seen.shape[0] else fresh
        rng.shuffle(keys)
        device_keys = cuda.asarray(keys)
        assert gpu_index.count_missing(device_keys) == cpu_index.count_missing(keys)
        size_before = gpu_index.size
        rows, new_keys, new_rows = gpu_index.find_or_insert(device_keys)
        want_rows, want_new_keys, _ = cpu_index.find_or_insert(keys)
        rows, new_keys, new_rows = host(cuda, rows), host(cuda, new_keys), host(cuda, new_rows)
        assert np.array_equal(np.sort(new_keys), np.sort(want_new_keys))
        assert np.array_equal(new_rows, np.arange(size_before, gpu_index.size))
        assert gpu_index.size == cpu_index.size
        check_mapping(keys, rows)
        assert np.array_equal(host(cuda, gpu_index.find(device_keys)), rows)
        assert gpu_index.count_missing(device_keys) == 0
        seen = np.concatenate([seen, new_keys])
    export_keys, export_rows = (host(cuda, a) for a in gpu_index.export())
    assert np.array_equal(export_rows, np.arange(gpu_index.size))
    assert np.array_equal(np.sort(export_keys), np.sort(cpu_index.export()[0]))
    assert np.array_equal(host(cuda, gpu_index.find(cuda.asarray(seen))), seen_rows(export_keys,
                                                                                   seen))
    absent = np.setdiff1d(rng.integers(0, KEY_LIMIT, size=1000), seen)
    assert (host(cuda, gpu_index.find(cuda.asarray(absent))) == -1).all()
    empty_rows, empty_new, _ = gpu_index.find_or_insert(cuda.asarray(np.zeros(0, np.int64)))
    assert empty_rows.shape == (0,) and empty_new.shape == (0,)

    too_many = np.setdiff1d(rng.integers(0, KEY_LIMIT, size=capacity), seen)
    too_many = too_many[:capacity - gpu_index.size + 1]
    size_before = gpu_index.size
    with pytest.raises(OverflowError):
        gpu_index.find_or_insert(cuda.asarray(too_many))
    assert gpu_index.size == size_before
    assert (host(cuda, gpu_index.find(cuda.asarray(too_many))) == -1).all()
    assert np.array_equal(host(cuda, gpu_index.export()[0]), export_keys)
    assert gpu_index.count_missing(cuda.asarray(too_many)) == too_many.shape[0]


@pytest.mark.parametrize("dim", [8, 64])
def test_rows_queued_before_the_count_equal_the_cpu(cuda, rng, dim):
    """find_or_insert's queue_first: init_rows and fill_rows bounded by the device count write
    exactly the placed keys' rows, as cpu's unbounded ops do; an overflowing call writes no row
    past the rows it was given."""
    spec = random_init.make_spec("uniform", -0.05, 0.05, 7)
    capacity = 4000
    index = cuda.HashIndex(capacity)
    table = rng.standard_normal((capacity, dim)).astype(np.float32)
    times = np.full(capacity, -1.0)
    device_table, device_times = cuda.asarray(table), cuda.asarray(times)
    queued = []

    def queue(new_keys, new_rows, count, rows):
        queued.append((count is not None, rows.shape[0]))
        cuda.init_rows(device_table, new_rows, new_keys, spec, 5, count)
        cuda.fill_rows(device_times, new_rows, 2.5, count)

    keys = random_keys(rng, 3000, 1500)
    rows, new_keys, new_rows = (host(cuda, a) for a in index.find_or_insert(
        cuda.asarray(keys), queue_first=queue))
    assert queued == [(True, keys.shape[0])] and new_keys.shape[0] == np.unique(keys).shape[0]
    cpu.init_rows(table, new_rows, new_keys, spec, 5)
    cpu.fill_rows(times, new_rows, 2.5)
    np.testing.assert_allclose(host(cuda, device_table), table, rtol=0, atol=1e-8)  # an ulp
    assert np.array_equal(host(cuda, device_times), times)

    too_many = np.setdiff1d(rng.integers(0, KEY_LIMIT, size=3 * capacity), keys)[:capacity]
    pool = np.arange(capacity - 10, capacity, dtype=np.int64)  # 10 rows for thousands of keys
    with pytest.raises(OverflowError):
        index.find_or_insert(cuda.asarray(too_many), row_pool=cuda.asarray(pool),
                             queue_first=queue)
    got, got_times = host(cuda, device_table), host(cuda, device_times)
    assert np.array_equal(got[:capacity - 10], table[:capacity - 10])
    assert (got_times[capacity - 10:] == 2.5).all()
    assert np.array_equal(got_times[:capacity - 10], times[:capacity - 10])


@pytest.mark.parametrize("n,new_n,counted", [(0, 0, None), (5000, 0, None), (0, 700, 300),
                                             (5000, 2000, None), (5000, 2000, 1200),
                                             (300, 2000, 1500), (5000, 2000, 4000)])
def test_touch_rows_counts_and_stamps_as_the_cpu_in_one_launch(cuda, rng, n, new_n, counted):
    """touch_rows: each row's (last step, count) record, repeated rows counted each time and
    negative rows skipped, and with a stamp the new rows' times bounded by the device count,
    all in one launch, as cpu's touch_rows and fill_rows."""
    from sok1x.backend.cuda.kernel_launch import COUNTS
    capacity = 3000
    statistics = rng.integers(0, 50, size=(capacity, 2)).astype(np.int64)
    times = np.full(capacity, -1.0)
    rows = rng.integers(-1, capacity, size=n).astype(np.int64)  # repeats and -1s
    new_rows = rng.permutation(capacity)[:new_n].astype(np.int64)
    new_rows[::9] = -1
    count = None if counted is None else np.array([counted], np.uint64)
    device_statistics, device_times = cuda.asarray(statistics), cuda.asarray(times)
    device_count = None if count is None else cuda.asarray(count)
    stamp = (device_times, cuda.asarray(new_rows), 1.7e9 + 0.5, device_count) if new_n else None
    device_rows = cuda.asarray(rows)
    launches = COUNTS["launches"]
    cuda.touch_rows(device_statistics, device_rows, 77, stamp=stamp)
    assert COUNTS["launches"] - launches == (1 if n or new_n else 0)
    cpu.touch_rows(statistics, rows, 77,
                   stamp=(times, new_rows, 1.7e9 + 0.5, count) if new_n else None)
    assert np.array_equal(host(cuda, device_statistics), statistics)
    assert np.array_equal(host(cuda, device_times), times)


@pytest.mark.parametrize("flag,parts", [(0, None), (1, None), (0, [0, 0, 0]), (0, [0, 3, 0]),
                                        (5, [0, 0, 0]), (0, [0] * 26), (0, [0] * 25 + [1])])
@pytest.mark.parametrize("n", [0, 1, 4099])
def test_drop_rows_if_failed_decides_on_the_device_as_the_cpu(cuda, rng, flag, parts, n):
    """drop_rows_if_failed: every row -1 where the flag is set or some part's count is above
    0, else the rows as they were; the flag and counts read when the kernel runs (written by
    work queued before it), as cpu's twin reads them when called."""
    rows = rng.integers(-1, 1 << 40, size=n).astype(np.int64)
    device_rows = cuda.asarray(rows)
    device_flag = cuda.asarray(np.zeros(1, np.int64))
    device_parts = None if parts is None else cuda.asarray(np.zeros(len(parts), np.int64))
    cuda.drop_rows_if_failed(device_rows, device_flag, device_parts)  # all clear: unchanged
    cuda.write_rows(device_flag, 0, np.array([flag], np.int64))  # queued after that launch
    if parts is not None:
        cuda.write_rows(device_parts, 0, np.array(parts, np.int64))
    cuda.drop_rows_if_failed(device_rows, device_flag, device_parts)
    want = rows.copy()
    cpu.drop_rows_if_failed(want, np.array([0], np.int64),
                            None if parts is None else np.zeros(len(parts), np.int64))
    assert np.array_equal(want, rows)
    cpu.drop_rows_if_failed(want, np.array([flag], np.int64),
                            None if parts is None else np.array(parts, np.int64))
    assert np.array_equal(host(cuda, device_rows), want)
    if n:  # (a random row is -1 once in 2^40)
        assert (want == -1).all() == bool(flag or any(parts or ()))


@pytest.mark.parametrize("way", ["vmm", "thp", "slices", "pinned"])
def test_mapped_host_rows_are_shared_with_the_cpu(cuda, rng, way):
    """Each way of allocating host rows (or the one it falls back to) gives memory whose bytes
    the CPU view and the kernels agree on, zeroed at first."""
    from sok1x.backend.cuda import host_rows as cuda_host_rows
    with cuda_context.entered():
        block = cuda_host_rows.mapped_host_block(3 << 20, first=way)
        print("\n%s: got %s, %d bytes on huge pages" % (way, block.method, block.huge_bytes))
    view = block.host.view(np.float32).reshape(-1, 16)
    device = rows_over(cuda, block, view.shape)
    cuda.synchronize()
    assert not view.any()
    probe = rng.choice(view.shape[0], 100, replace=False)
    view[probe] = rng.standard_normal((100, 16)).astype(np.float32)
    assert np.array_equal(host(cuda, cuda.gather_rows(device, cuda.asarray(probe))), view[probe])
    written = rng.standard_normal((100, 16)).astype(np.float32)
    cuda.put_rows(device, cuda.asarray(probe), cuda.asarray(written))
    cuda.synchronize()
    assert np.array_equal(view[probe], written)


def test_sliced_host_rows_are_one_range(cuda, rng):
    """Host rows registered in 128 MiB pieces ("slices") are one device range: rows on both
    sides of a piece boundary read and write as the CPU view sees them."""
    from sok1x.backend.cuda import host_rows as cuda_host_rows
    with cuda_context.entered():
        block = cuda_host_rows.mapped_host_block((128 << 20) + (1 << 20), first="slices")
    assert block.method == "slices"
    view = block.host.view(np.float32).reshape(-1, 64)
    device = rows_over(cuda, block, view.shape)
    boundary = (128 << 20) // (64 * 4)
    probe = np.concatenate([np.arange(boundary - 50, boundary + 50),
                            rng.choice(view.shape[0], 100, replace=False)])
    probe = np.unique(probe)
    view[probe] = rng.standard_normal((probe.shape[0], 64)).astype(np.float32)
    assert np.array_equal(host(cuda, cuda.gather_rows(device, cuda.asarray(probe))), view[probe])
    written = rng.standard_normal((probe.shape[0], 64)).astype(np.float32)
    cuda.put_rows(device, cuda.asarray(probe), cuda.asarray(written))
    cuda.synchronize()
    assert np.array_equal(view[probe], written)


def test_reserved_rows_grow_in_place_as_on_the_cpu(cuda, rng):
    """Rows that grow in place (backend/cuda/reserved_rows.py), three members of one flat
    array, each doubling, against the cpu twin doing the same: the kernels' writes and reads of
    backed rows agree, no row moves, memory is behind whole granules of the rows held only, a
    failed growth's pieces go back, and a view outlives the array."""
    members, most, dim, granule = 3, 1 << 20, 32, 2 << 20
    got = cuda.reserved_rows((members * most, dim), np.float32)
    want = cpu.reserved_rows((members * most, dim), np.float32)
    address, held = cuda.address_of(got), [0] * members
    for grown in (1000, 30000, 70000):  # each member doubles (or more): new rows, filled
        for t in range(members):
            start = t * most
            for backend, array in ((cuda, got), (cpu, want)):
                backend.back_rows(array, start + held[t], start + grown)
                backend.fill_value(backend.row_view(array, start + held[t], start + grown),
                                   0.5 * t)
            held[t] = grown
        probe = np.concatenate([t * most + rng.choice(grown, 200, replace=False)
                                for t in range(members)])
        values = rng.standard_normal((probe.shape[0], dim)).astype(np.float32)
        cuda.put_rows(got, cuda.asarray(probe), cuda.asarray(values))
        want[probe] = values
        assert cuda.address_of(got) == address
        for t in range(members):  # every held row, as the twin holds it
            np.testing.assert_array_equal(
                host(cuda, cuda.row_view(got, t * most, t * most + grown)),
                want[t * most:t * most + grown])
        held_bytes = members * grown * dim * 4
        assert held_bytes <= cuda.backed_bytes(got) <= held_bytes + 2 * members * granule
    before = cuda.backed_bytes(got)
    pieces = cuda.back_rows(got, 2 * most + held[2], 2 * most + 4 * held[2])
    assert cuda.backed_bytes(got) > before
    cuda.unback_rows(got, pieces)
    assert cuda.backed_bytes(got) == before
    view = cuda.row_view(got, most, most + 10)
    del got
    np.testing.assert_array_equal(host(cuda, view), want[most:most + 10])


@pytest.fixture(params=["native", "python"])
def helper_way(request, monkeypatch):
    """back_rows_ahead's helper makes its driver calls in one call of back_pieces.c ("native",
    which must build here) or one at a time from Python ("python")."""
    import importlib
    module = importlib.import_module("sok1x.backend.cuda.reserved_rows")
    monkeypatch.delitem(module._CLASS, "native", raising=False)
    if request.param == "native":
        with cuda_context.entered():
            assert module._native() is not None, "back_pieces.c could not be had"
    else:
        monkeypatch.setitem(module._CLASS, "native", None)
    return request.param


def test_rows_backed_ahead_hold_their_initial_values_as_on_the_cpu(cuda, helper_way):
    """back_rows_ahead on its helper thread (and stream) backs the rows and writes each
    array's initial value (a float32 slot's 0.1, a float64 array's 0, none for the values);
    once joined, the sok1x stream reads them as the cpu twin holds them."""
    arrays = {}
    for backend in (cuda, cpu):
        slot = backend.reserved_rows((1 << 20, 64), np.float32)
        times = backend.reserved_rows((1 << 20,), np.float64)
        values = backend.reserved_rows((1 << 20, 64), np.float32)
        future = backend.back_rows_ahead([(slot, 1000, 40000, 0.1), (times, 1000, 40000, 0.0),
                                          (values, 1000, 40000, None)])
        done = backend.join_ahead(future)
        assert [array is want for (array, _), want in zip(done, (slot, times, values))] == [
            True] * 3
        arrays[backend] = (slot, times)
    for got, want in zip(arrays[cuda], arrays[cpu]):
        got = host(cuda, cuda.row_view(got, 1000, 40000))
        np.testing.assert_array_equal(got, want[1000:40000])
    assert (arrays[cpu][0][1000:40000] == np.float32(0.1)).all()


def test_one_job_backs_several_members_ranges_once_as_on_the_cpu(cuda, helper_way):
    """One job of back_rows_ahead for three members of two flat arrays (as a group's
    _back_ahead hands it): ranges that share a granule and rows backed already. Every range's
    rows hold its initial value as the cpu twin's do, memory is behind the granules of the
    ranges and of what was backed before only, and every piece goes back when given back."""
    granule = 2 << 20
    rows = 1 << 16  # 64 floats a row: a granule is 8,192 rows
    got = {"slot": cuda.reserved_rows((rows, 64), np.float32),
           "times": cuda.reserved_rows((rows,), np.int64)}
    want = {"slot": cpu.reserved_rows((rows, 64), np.float32),
            "times": cpu.reserved_rows((rows,), np.int64)}
    ranges = [(3000, 10000), (10000, 12000), (30000, 40000)]  # the first two share a granule
    for backend, arrays in ((cuda, got), (cpu, want)):  # backed before, in the first granule
        backend.back_rows(arrays["slot"], 0, 3000)
        backend.fill_value(backend.row_view(arrays["slot"], 0, 3000), 2.5)
    before = cuda.backed_bytes(got["slot"])
    jobs = {}
    for backend, arrays in ((cuda, got), (cpu, want)):
        jobs[backend] = backend.join_ahead(backend.back_rows_ahead(
            [(arrays["slot"], a, b, 0.25) for a, b in ranges]
            + [(arrays["times"], a, b, 0) for a, b in ranges]))
    for name in ("slot", "times"):
        for a, b in [(0, 3000)] + ranges if name == "slot" else ranges:
            np.testing.assert_array_equal(host(cuda, cuda.row_view(got[name], a, b)),
                                          want[name][a:b])
    touched = set()  # granules of 8,192 slot rows: 0 and 1, then 3 and 4 (not 2)
    for a, b in [(0, 3000)] + ranges:
        touched |= set(range(a // 8192, (b - 1) // 8192 + 1))
    assert touched == {0, 1, 3, 4}
    assert cuda.backed_bytes(got["slot"]) == len(touched) * granule
    assert cuda.backed_bytes(got["times"]) == granule  # 320,000 bytes: one granule
    assert [array is got[name] for (array, _), name in zip(
        jobs[cuda], ["slot"] * 3 + ["times"] * 3)] == [True] * 6
    for array, pieces in jobs[cuda]:
        cuda.unback_rows(array, pieces)
    assert cuda.backed_bytes(got["slot"]) == before and cuda.backed_bytes(got["times"]) == 0


def test_a_job_of_no_ranges_backs_nothing(cuda, helper_way):
    assert cuda.join_ahead(cuda.back_rows_ahead([])) == []


def test_a_job_without_room_backs_nothing(cuda, helper_way):
    """A back_rows_ahead job one of whose ranges the GPU has no room for raises
    DeviceMemoryError through its future, and what its other ranges backed goes back."""
    from sok1x.errors import DeviceMemoryError
    free, total = cuda_context_memory()
    rows = (2 * total) // 256  # rows of 256 bytes: twice the GPU's memory
    small = cuda.reserved_rows((1 << 16, 64), np.float32)
    huge = cuda.reserved_rows((rows, 64), np.float32)
    future = cuda.back_rows_ahead([(small, 0, 20000, 0.5), (huge, 0, rows, None)])
    with pytest.raises(DeviceMemoryError, match="no room"):
        cuda.join_ahead(future)
    assert cuda.backed_bytes(small) == 0 and cuda.backed_bytes(huge) == 0


def cuda_context_memory():
    """(free, total) bytes of the GPU of the `cuda` fixture."""
    import pycuda.driver as pycuda_driver
    with cuda_context.entered():
        return pycuda_driver.mem_get_info()


def rows_over(cuda, block, shape):
    """A float32 GPUArray of `shape` over a HostBlock's device address (kept alive with it)."""
    from pycuda import gpuarray
    with cuda_context.entered():
        array = gpuarray.GPUArray(shape, np.float32, gpudata=block.address)
    array.sok1x_host_block = block
    return array


def seen_rows(export_keys, keys):
    """Rows of `keys` given export's keys-by-row table."""
    order = np.argsort(export_keys)
    return order[np.searchsorted(export_keys[order], keys)]


def test_hash_index_assign_and_export(cuda, rng):
    keys = np.unique(rng.integers(0, KEY_LIMIT, size=700))[:600]
    rows = rng.permutation(1000)[:600]
    gpu_index, cpu_index = cuda.HashIndex(1000), cpu.HashIndex(1000)
    gpu_index.assign(cuda.asarray(keys), cuda.asarray(rows))
    cpu_index.assign(keys, rows)
    assert gpu_index.size == 600
    assert np.array_equal(host(cuda, gpu_index.find(cuda.asarray(keys))), rows)
    for got, want in zip(gpu_index.export(), cpu_index.export()):
        assert np.array_equal(host(cuda, got), want)
    with pytest.raises(OverflowError):
        gpu_index.assign(np.arange(401, dtype=np.int64) + KEY_LIMIT, np.arange(401))
    assert gpu_index.size == 600


def _timed(cuda, action, repeats=1):
    best, result = math.inf, None
    for _ in range(repeats):
        cuda.synchronize()
        start = time.perf_counter()
        result = action()
        cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best, result


@pytest.mark.parametrize("load", [0.5, 0.7, 0.9])
def test_hash_stress_10m_keys(cuda, rng, load):
    draws = int(os.environ.get("SOK1X_STRESS_KEYS", str(10 * 1000 * 1000)))
    keys = random_keys(rng, draws, draws * 6 // 10)
    distinct = np.unique(keys)
    capacity = int(math.ceil(distinct.shape[0] / load))
    warm = cuda.HashIndex(1000, max_load=1.0)
    warm.find(warm.find_or_insert(cuda.asarray(keys[:100]))[1])
    index = cuda.HashIndex(capacity, max_load=1.0)
    device_keys = cuda.asarray(keys)
    insert_s, (rows, new_keys, new_rows) = _timed(cuda, lambda: index.find_or_insert(device_keys))
    find_s, found = _timed(cuda, lambda: index.find(device_keys), repeats=3)
    absent = np.setdiff1d(rng.integers(0, KEY_LIMIT, size=draws), distinct)
    device_absent = cuda.asarray(absent)
    miss_s, missing = _timed(cuda, lambda: index.find(device_absent), repeats=3)

    rows = host(cuda, rows)
    assert index.size == distinct.shape[0]
    assert np.array_equal(np.sort(host(cuda, new_keys)), distinct)
    assert np.array_equal(host(cuda, new_rows), np.arange(distinct.shape[0]))
    assert np.array_equal(host(cuda, found), rows)
    export_keys, export_rows = (host(cuda, a) for a in index.export())
    assert np.array_equal(export_rows, np.arange(distinct.shape[0]))
    assert np.array_equal(export_keys[rows], keys)  # find agrees with export, key by key
    assert (host(cuda, missing) == -1).all()
    assert index.count_missing(device_keys) == 0
    print("\nhash stress: %d keys (%d distinct) into capacity %d = %d slots at load %.2f: "
          "find_or_insert %.0f Mkeys/s (%.1f ms), find hit %.0f Mkeys/s (%.1f ms), "
          "find miss %.0f Mkeys/s (%d keys, %.1f ms)" % (
              draws, distinct.shape[0], capacity, index.slot_count,
              distinct.shape[0] / index.slot_count, draws / insert_s / 1e6, insert_s * 1e3,
              draws / find_s / 1e6, find_s * 1e3, absent.shape[0] / miss_s / 1e6,
              absent.shape[0], miss_s * 1e3))
