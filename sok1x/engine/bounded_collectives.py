"""Host collectives of rows of any count, for what moves whole tables outside a step's path
(incremental_model_dump, export, load_embedding_values): MPI's counts and displacements are C
ints, so one call moves fewer than 2**31 elements. These split a transfer into rounds that each
move at most elements_per_call() elements over all ranks together, and put the rounds' pieces
where one call would have. Collective: every rank calls them in the same order, with rows of the
same dtype and row shape.
"""
import os

import numpy as np

from sok1x.backend.cuts import cut_points

CHUNK_ENV = "SOK1X_MPI_CHUNK_ELEMENTS"
DEFAULT_ELEMENTS = 1 << 30


def elements_per_call():
    """The most elements one MPI call of these helpers moves over all ranks together
    (SOK1X_MPI_CHUNK_ELEMENTS, default 2**30)."""
    return max(1, int(os.environ.get(CHUNK_ENV, DEFAULT_ELEMENTS)))


def _rows_per_round(rows, size):
    """Rows each rank may send (to each peer) in one round: the round's call then moves at most
    elements_per_call() elements."""
    row_elements = int(np.prod(rows.shape[1:], dtype=np.int64)) if rows.ndim > 1 else 1
    return max(1, elements_per_call() // (max(1, row_elements) * size))


def all_gather_rows(host, rows):
    """Every rank contributes `rows` (host array, any number of rows); returns (the rows of all
    ranks in rank order, int64 counts per rank) on every rank, as host.all_gather_v does, in as
    many calls as the size needs."""
    rows = np.ascontiguousarray(rows)
    counts = np.asarray(host.all_gather_object(int(rows.shape[0])), np.int64)
    step = _rows_per_round(rows, host.size)
    starts = cut_points(counts)
    out = np.empty((int(starts[-1]),) + rows.shape[1:], rows.dtype)
    for done in range(0, int(counts.max()) if counts.size else 0, step):
        got, got_counts = host.all_gather_v(rows[done:done + step])
        got_starts = cut_points(got_counts)
        for rank in range(host.size):
            place = int(starts[rank]) + done
            out[place:place + int(got_counts[rank])] = got[got_starts[rank]:got_starts[rank + 1]]
    return out, counts


def all_to_all_rows(host, rows, send_counts, recv_counts):
    """`rows` holds rows bucketed by destination rank, send_counts[j] of them for rank j; returns
    the rows received, bucketed by source rank, recv_counts[i] from rank i, as
    host.all_to_all_v does, in as many calls as the largest bucket needs."""
    rows = np.ascontiguousarray(rows)
    send_counts = np.asarray(send_counts, np.int64)
    recv_counts = np.asarray(recv_counts, np.int64)
    step = _rows_per_round(rows, host.size)
    send_starts, recv_starts = cut_points(send_counts), cut_points(recv_counts)
    out = np.empty((int(recv_starts[-1]),) + rows.shape[1:], rows.dtype)
    largest = int(np.asarray(host.all_gather_object(
        int(max(send_counts.max(), recv_counts.max())) if send_counts.size else 0)).max())
    for done in range(0, largest, step):
        sending = np.clip(send_counts - done, 0, step)
        receiving = np.clip(recv_counts - done, 0, step)
        piece = np.concatenate([rows[send_starts[j] + done:send_starts[j] + done + sending[j]]
                                for j in range(host.size)])
        got = host.all_to_all_v(piece, sending, receiving)
        got_starts = cut_points(receiving)
        for rank in range(host.size):
            place = int(recv_starts[rank]) + done
            out[place:place + int(receiving[rank])] = got[got_starts[rank]:got_starts[rank + 1]]
    return out
