"""Backends: one op set, two devices. `cpu` runs on NumPy arrays, `cuda` on PyCUDA GPUArrays.

Every backend module exposes the same names, and the engine's algorithms call only these:

    NAME                                   "cpu" or "cuda"
    asarray(host_array) -> array           copy a NumPy array to the device
    to_host(array) -> np.ndarray           copy back (blocking)
    to_host_many(arrays) -> [np.ndarray]   copy several back with one wait
    download_staged_many(arrays) -> [np.ndarray]   the same as views of reused page-locked
                                           buffers (no host copy; read them, then drop them)
    counts() -> dict                       what this process queued and waited for; "host_waits"
                                           (cpu counts the calls at which cuda would wait)
    empty(shape, dtype) / zeros(shape, dtype)
    fill_value(array, value)               every element = value (float32; 0 for any dtype, -1
                                           for signed integers)
    host_mapped_zeros(shape, dtype)        zeros in page-locked host memory the device's kernels
                                           read and write in place (cpu: an ordinary array)
    split_zeros(shape, dtype, hbm_rows) -> ([device part, host part], whole)
        a row array split at row hbm_rows (engine/hybrid_rows.SplitRows wraps it); gather_rows,
        take_rows, put_rows, init_rows and the update_* ops take the wrapper and read each row in
        its part (cuda: on the device, from both parts' bases; cpu: whole, which both parts view)
    synchronize()                          wait for queued device work
    release_unused()                       give the device memory pool's unused blocks back
    device_context()                       context manager: device arrays may be made inside
    bucket_by_owner(keys, world_size, owner_rule, fixed_rank) -> (perm, counts)
        perm: int64 array, keys[perm] grouped by owner (ascending owner, stable inside an
        owner); counts: host int64 array [world_size], keys per owner. owner_rule
        (owner_rules.py): OWNER_MOD (key % world_size), OWNER_FIXED (fixed_rank), OWNER_HASH
        (scramble(key) % world_size)
    owners_of(keys, world_size, owner_rule, fixed_rank) -> int64 owner of each key
    bucket_by_owner_many(keys_list, world_size, owner_rules), unique_many(keys_list, ordered)
        the same for several arrays at once, with one wait for all their sizes
    index_bounds(arrays) -> host int64 [len(arrays), 2]   (min, max) of each, one wait for all
    join_keys(arrays, offsets) -> int64        the int arrays plus an offset each, joined (one
                                               launch on cuda: a table group's keys; negative
                                               elements, padding -1, stay as they are)
    join_rows(arrays) -> float32               float32 arrays joined along axis 0 (one launch)
    distinct_rows_many(items) -> [(distinct, inverse, ranks)]   per (rows in [0, bound), bound,
        boundaries ending at bound): distinct rows ascending, each row's place among them (-1
        for a row -1: a padded slot), and how many lie below each boundary; one wait for all
    Arrays holding several tables' parts one after the other (cut at host cuts [P + 1]):
    part_bounds(arrays, cuts) -> host int64 [len(arrays) * P, 2]   (min, max) of each part, one
        wait; part_bounds_deferred(arrays, cuts) leaves them on the device
    offset_parts(array, cuts, offsets) -> int64    part t plus offsets[t] (one launch on cuda)
    offset_parts_many(arrays, cuts, offsets) -> [int64]   the same of several arrays of one
        length, array j with offsets[j] (one launch for all on cuda)
    rotate_parts(out, before, cuts, back, back_cuts, counts)   each part t of `before` less its
        first counts[t] rows (a device count), then as many of part t of `back`, into `out`
    local_rows(rows, row_starts, moves, length) -> int64   distinct rows ascending, less the
        start of the range t holding each, table t's moved by moves[t] (to an aligned place)
    distinct_rows_padded(rows, bound, row_starts, piece_starts, counted=False)
        -> (flat, local, inverse), no wait: the distinct rows of range t ascending in piece t
        (from piece_starts[t]), each row and its offset in its range, -1 where no row is;
        inverse -1 for a row outside [0, bound) or past its piece
        (engine/lookup/bounded_step.py); counted: and the places' counts for segment_sum (cuda:
        counted as the places are found; cpu: None)
    Sizes left on the device for an op header to carry and read (engine/lookup/exchange_header.py):
    bucket_by_owner_many_deferred(keys_list, world_size, owner_rules, valid_counts=None)
        -> (perms, counts [tables, world_size]), no wait; valid_counts: device counts of the
        leading keys to bucket (unique_many_padded's output)
    index_bounds_deferred(arrays) -> int64 [len(arrays), 2]                      no wait
    read_later(array) -> collect()   queues array's copy to the host now; collect() waits for
        that copy alone and returns it (a flag read once later work is queued), the same copy
        at every call
    read_many_later(arrays) -> collect()   the same of several device arrays (their copies
        queued one after the other), collect() -> [np.ndarray], one wait
    sums_kept(dirty)                 a context: a segment_sum into len(dirty) rows zeros only the
        rows dirty (int8, -1) says may hold an earlier sum, and keeps it (a replayed backward's
        fixed sums: backend/kept_sums.py)
    copy_array(dst, src)             dst = src, two device arrays of one dtype and size (any
        shapes): one queued copy (a replayed step's keys into its fixed array)
    unique_many_start(keys_list, ordered) -> (started, counts); unique_many_finish(started,
        host_counts) -> [(unique_keys, inverse)]; distinct_rows_many_start(items) -> (started,
        sizes); distinct_rows_many_finish(started, host_sizes): the two halves around the wait;
        unique_many_padded(started): the second half without the counts (keys-long outputs)
    header_records(fields, size, counts, flag, width, shared=None, shared_at=0) -> int64
        [size, width]   an op header's records (op, tower, call, place, error | flag[0], tables,
        counts[t, peer]..., from shared_at the values every peer is told alike)
    flag_outside(bounds, ranges) -> int64 [1]          1 if a (min, max) row leaves its range
    peer_slots_many(counts, caps, lengths, flag, bit) -> (slots, flag_out)   per table the slot
        of each bucketed key in a per-peer buffer of caps[t, o] slots for owner o (-1 past its
        cap or the keys), and flag[0] with `bit` set where a count exceeds its cap
        (engine/lookup/peer_capacity.py)
    move_rows(src, src_index, dst, dst_index)   dst[dst_index[i]] = src[src_index[i]] where both
        are >= 0, in place (packing rows into per-peer buffers and out)
    column(matrix, index) -> [n]                       one column of an int64 [n, k] matrix
    segment_counts(segment_ids, n) -> float32 [n]      ids per segment
    scale_rows(values, factors, divide) -> values * (or /, 0 where 0) factors per row
    fill_rows(array, rows, value, count=None)          array[rows] = value (float64 1-D)
    drop_rows_if_failed(rows, flag, parts=None)        rows[:] = -1 where flag[0] != 0 or some
        parts[t] > 0, decided when the work runs (a replayed update's predicate)
    floor_divide(keys, divisor) -> keys // divisor     int64, rows of a table without hash table
    row_view(array, start, stop)                       rows [start, stop) sharing array's memory
    row_views(array, cuts, stops=None) -> [views]      row_view of [cuts[t], cuts[t + 1]) each t
                                                       (with stops: [cuts[t], stops[t])), one call
    reshape(array, shape) -> array                     the same elements in `shape` (one -1
                                                       allowed), sharing a C-contiguous array's
                                                       memory
    take_rows(array, index) -> array[index]            gather along axis 0
    put_rows(dst, index, src)                          dst[index] = src (index has no repeats)
    unique(keys, ordered) -> (unique_keys, inverse)    first-occurrence order, like tf.unique
                                                       (ordered=False: any order)
    segment_sum(values, segment_ids, num_segments, counts=None)   like
        tf.math.unsorted_segment_sum (a negative id adds nothing); counts: what
        distinct_rows_padded(counted=True) returned beside these ids, so cuda does not count
        them again
    gather_rows(table, rows, fill=True) -> [n, dim]    row -1 gives a zero vector (fill=False:
                                                       unwritten, for places no one reads)
    gather_rows_many(tables, rows, fill=True) -> list  gather_rows of several tables of one
                                                       row shape by the same rows (cuda: one
                                                       launch for up to 4 in device memory)
    scatter_add_rows(table, rows, values)              table[rows] += values, repeats summed
    init_rows(table, rows, keys, spec, table_id, count=None)   initial values (random_init.py)
    touch_rows(statistics, rows, step, stamp=None)     a lookup's access statistics: int64 [n, 2]
        records (last step, count) of rows >= 0; stamp (times, new_rows, now, count): also
        fill_rows(times, new_rows, now, count), in the same launch on cuda
    stamp_last_step(statistics, rows, step)            records' last step = step (rows >= 0)
    count_evictable(indexes, statistics, row_starts, found, step) -> int64 [T]: each member's
        held keys a lookup may evict (last step below `step`, not found by it), no wait
    count_new_keys(parts, keys, tags, found) -> int64 [2, parts]: a hash group's distinct new
        keys and all its keys per member, no wait and no sort
    pick_victims(indexes, statistics, row_starts, keys, tags, found, counts, bits, step, lfu)
        -> (keys, rows, records): the victims of a table group's full shards for a lookup's
        new keys, per bucket by score (cpu/eviction.py), no wait and no sort
    HashIndex(capacity)                                key -> row index of a shard (cpu/hash.py):
        find, count_missing, find_or_insert(keys, row_pool, missing, next_row, queue_first),
        find_or_insert_values(keys, values, spec, table_id, ...) (also initialises the new
        rows and returns every key's vector), erase, assign, export
    A hash group's members (lookup/table_group.py's HashGroup), keys tagged with their member:
    part_tags(cuts) -> int64 [cuts[-1]]                the part of each position (one launch)
    row_sequence(first, stop) -> int64 [stop - first]  first, first + 1, ... (on the device)
    unique_many_start(..., tags_list)                  de-duplicates a tagged array per (tag, key)
    hash_erase_many(indexes, keys, tags, counts)       erases held tagged keys (counts[t] of
                                                       member t's), one launch;
        hash_erase_counted(indexes, counts, erased) counts a recorded erase's keys (cuda)
    hash_insert_many(indexes, keys, tags, row_starts, pools=None) -> (rows, new_keys, new_rows,
        new_tags, count, placed)   find_or_insert in every member's index in one launch, no
        wait (pools: per member (row_pool, next_row), a hybrid table's freed rows): flat rows,
        the placed keys (count [1] of them), placed [T] per member on the device;
        hash_insert_many_done(indexes, found, host placed, keep) ends the call (keep=False
        erases its keys again)
    hash_insert_members(indexes, row_starts, into, sizes) -> the list a replayed insert reads
        (cuda; cpu: None), hash_members_advance(members, placed) moves it past a call's keys
    hash_sizes(indexes) -> host int64 [T]              the indexes' sizes (cuda: a group's
                                                       pending counts read once for all);
        hash_settle_sizes(indexes, counts, host counts) hands a read count copy (or several:
                                                       lists) to them all
    hash_tombstones(indexes) -> host int64 [T]         their tombstones (cuda: erased counts
                                                       still pending by their bounds)
    hash_find_many(indexes, keys, tags, row_starts) -> flat rows, -1 where not held
    hash_rehash_many(indexes) -> indexes               each rebuilt without tombstones (cuda:
                                                       in place, two launches for all)
    init_rows_tagged(table, rows, keys, tags, spec, table_ids, count=None, slots=())   init_rows
        with the table id of each key's member; slots: (array, value) pairs whose same rows take
        the constant value (cuda: in the same pass, up to two unsplit ones)

The seam to a framework (graph_ops/boundary.py, DESIGN D1):
    from_dlpack(capsule) -> array       read a framework's tensor in place (consumes the capsule)
    to_dlpack(array) -> capsule         hand an array to a framework without a copy
    exportable(array) -> array          the array as to_dlpack hands it over uncopied (aligned)
    wait_for_framework(stream=0)        order sok1x's work after the framework's queued work (on
                                        `stream`, a framework's CUstream; cpu: nothing to order)
    release_to_framework(stream=0)      order the framework's later work after sok1x's
    framework_orders() -> (wait, release)   the two as functions of a stream, to call inside
                                        engine.runtime.entered() (a kernel call's, looked up once)
    borrow(address, shape, dtype, owner)   an array over a framework's memory at an address (its
                                        TensorFlow kernel's inputs), `owner` kept alive with it
    address_of(array) -> int            where an array's first element lies
    memory_device(address) -> int or None   the GPU whose memory an address is (cpu: None)
    device_ordinal() -> int or None     the GPU sok1x runs on (cpu: None)
    synchronize_device()                the host waits for all the GPU's streams (cuda)
    upload_staged(host) / download_staged(array)   host staging (page-locked buffers on cuda)

Bulk host <-> device moves (checkpoints, engine/checkpoint*.py):
    host_buffer(nbytes) -> uint8 np.ndarray     host memory that write_rows uploads from without
                                                a host copy (a reused page-locked block on cuda)
    write_rows(dst, first, src)                 dst[first:first + len(src)] = src, src a host or
                                                backend array (one queued copy)
    free_device_memory() -> int or None         bytes new device arrays can take now (cuda, after
                                                giving the pool's unused blocks back); None on cpu,
                                                whose arrays are host memory

The cpu backend is the reference the cuda backend is tested against.
"""
from sok1x.errors import InitError

BACKEND_NAMES = ("auto", "cpu", "cuda")


def cuda_available():
    """Returns (True, None) if PyCUDA imports and a GPU is visible, else (False, reason)."""
    try:
        import pycuda.driver as cuda_driver
    except ImportError as exc:
        return False, "PyCUDA is not installed (pip install sok1x[gpu]): %s" % exc
    try:
        cuda_driver.init()
        count = cuda_driver.Device.count()
    except Exception as exc:  # the driver raises its own error types
        return False, "the CUDA driver did not start: %s" % exc
    if count == 0:
        return False, "no GPU is visible (CUDA_VISIBLE_DEVICES hides them all?)"
    return True, None


def load_backend(name):
    """Returns the backend module for `name` ("auto", "cpu" or "cuda"); raises InitError."""
    if name not in BACKEND_NAMES:
        raise InitError("backend must be one of %s, got %r" % (BACKEND_NAMES, name))
    if name == "auto":
        name = "cuda" if cuda_available()[0] else "cpu"
    if name == "cpu":
        from sok1x.backend import cpu
        return cpu
    ok, reason = cuda_available()
    if not ok:
        raise InitError("backend='cuda' asked for, but %s. Use backend='cpu' or 'auto'." % reason)
    from sok1x.backend import cuda
    return cuda
