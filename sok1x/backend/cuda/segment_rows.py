"""segment_sum's rows written once per segment, for many ids (cuda_kernels/segment_rows.cu).

The plain segment_sum (rows.cu's add_rows) fills the output with zeros and adds each id's row into
it with an atomic reduction: for n rows of w bytes it moves about 4 n w bytes (the fill, each row
read, and each sum read back and written again). Here the ids are sorted by segment (a counting
sort: one count, or the caller's (a bounded backward's, counted as its places were found), one scan,
one placement; an atomic a warp for each segment its lanes share) and each segment's rows summed in
registers and stored once: about 2 n w bytes, and about 160 more an id where its indices are
scattered (the placement's writes, the counts' atomics). It pays for wide rows (at least MIN_WIDTH
floats: dlrm's 128) and many ids (a bounded backward's hundreds of thousands of keys); below
SORTED_MIN ids the plain one runs, whose two launches cost the host less. Everything is sized by n
and the segments, so it can be recorded in a CUDA graph (nothing is read back).

Memory: int64 counts and starts per segment and an int64 order and its ids per id, from the
pool.
"""
import numpy as np

from sok1x.backend.cuda.kernel_launch import (
    empty,
    exclusive_scan,
    launch,
    memoised_per_context,
    prepared,
    ptr,
    zeros_and_scan_scratch,
)

SORTED_MIN = 1 << 14
MIN_WIDTH = 64
CHUNK = 32  # segment_rows.cu's CHUNK: positions of the order a group of lanes sums
LANES_PER_BLOCK = 256  # segment_rows.cu's: the blocks of sum_segment_chunks


@memoised_per_context
def _kernels():
    source = "segment_rows.cu"
    return {"count": prepared(source, "count_segments", "PqqP"),
            "place": prepared(source, "place_by_segment", "PqqPPPP"),
            "zero": prepared(source, "zero_unsummed_rows", "PqqPP"),
            "sum": prepared(source, "sum_segment_chunks", "PPPqqqqPP")}


def applies(values, n, width):
    """True when segment_sum of float32 `values` (n rows of `width` elements, a GPUArray)
    takes this path: at least SORTED_MIN ids, rows of whole float4s, at least MIN_WIDTH,
    16-byte aligned."""
    return (n >= SORTED_MIN and values.dtype == np.float32 and width % 4 == 0
            and width >= MIN_WIDTH and ptr(values) % 16 == 0)


def lanes_for(quads):
    """Lanes that sum one chunk of rows of `quads` float4s: the smallest power of two >= quads,
    at least 8 (segment_rows.cu's MIN_LANES, which sizes its shared memory), at most 32 (a group
    never spans two warps)."""
    lanes = 8
    while lanes < min(quads, 32):
        lanes *= 2
    return lanes


def sorted_segment_sum(values, ids, num_segments, out, dirty=None, counts=None):
    """Writes into float32 `out` [num_segments, width] (16-byte aligned) the sums of float32
    `values` [n, width] rows (16-byte aligned, width a multiple of 4: applies() asks more) per
    int64 segment id `ids` [n] (ids outside [0, num_segments) are skipped); every row of `out`
    is written, zeros where no id falls. dirty: None, or int8 [num_segments] kept with `out`
    from run to run (backend/kept_sums.py): a row no id falls in is then written only where
    dirty says an earlier run stored a sum in it (-1). counts: None, or (int64 [num_segments]
    of the ids of each segment, the zeroed scratch of their scan or None) where the caller
    counted exactly these ids (groups.distinct_rows_padded's counted), so that they are not
    counted again; consumed (the placement counts them down to zero, the scan dirties its
    scratch). Queued (call with the device context current); returns out."""
    kernels = _kernels()
    n = int(ids.shape[0])
    segments = int(num_segments)
    quads = int(values.size // max(n, 1)) // 4
    if not segments:
        return out
    if counts is None:
        counts, scratch = zeros_and_scan_scratch(segments, np.int64, segments)
        launch(kernels["count"], n, ptr(ids), n, segments, ptr(counts))
    else:
        counts, scratch = counts
        if tuple(counts.shape) != (segments,) or counts.dtype != np.int64:
            raise ValueError("sorted_segment_sum: counts of %d segments must be int64 [%d], "
                             "got %s %s" % (segments, segments, counts.dtype,
                                            list(counts.shape)))
    starts = exclusive_scan(counts, segments, scratch)
    order, order_ids = empty((n,), np.int64), empty((n,), np.int64)
    launch(kernels["place"], n, ptr(ids), n, segments, ptr(starts), ptr(counts), ptr(order),
           ptr(order_ids))
    launch(kernels["zero"], segments, ptr(starts), segments, quads, ptr(out),
           0 if dirty is None else ptr(dirty))  # a thread a row's test, whole warps
    lanes = lanes_for(quads)
    threads = -(-n // CHUNK) * lanes
    launch(kernels["sum"], 0, ptr(order), ptr(order_ids), ptr(starts), segments, n, quads, lanes,
           ptr(values), ptr(out), block=LANES_PER_BLOCK,
           blocks=max(1, -(-threads // LANES_PER_BLOCK)))
    return out
