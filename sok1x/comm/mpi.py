"""Collectives over MPI on NumPy buffers.

Used as the data path of the cpu backend (op headers included) and, on every backend, for what
happens outside a step's path: bringing sok1x up, checkpoints, and the messages of an error every
rank raises together. Counts are in
rows of the leading dimension; every rank calls each collective with the same dtype and row shape.
"""
import numpy as np

from sok1x.comm import wait_watch
from sok1x.errors import CommError

_REDUCE_OPS = ("sum", "max", "min")


def _displacements(counts):
    """Returns the exclusive prefix sum of `counts` (int64)."""
    displs = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=displs[1:])
    return displs


class MpiCommunicator:
    """Collectives on NumPy arrays over an mpi4py communicator (one per ProcessGroup)."""

    def __init__(self, group):
        self.group = group
        self.comm = group.world
        self.rank = group.rank
        self.size = group.size
        self.calls = 0  # collectives made, for the benchmarks' per-step counts

    def _mpi_op(self, op):
        from mpi4py import MPI
        if op not in _REDUCE_OPS:
            raise ValueError("reduce op must be one of %s, got %r" % (_REDUCE_OPS, op))
        return {"sum": MPI.SUM, "max": MPI.MAX, "min": MPI.MIN}[op]

    def _call(self, name, fn, *args):
        self.calls += 1
        try:
            with wait_watch.waiting("MPI " + name):
                return fn(*args)
        except Exception as exc:  # mpi4py raises MPI.Exception; keep the collective's name
            raise CommError("MPI %s failed on rank %d: %s" % (name, self.rank, exc)) from exc

    def all_to_all_counts(self, send_counts):
        """Each rank holds `send_counts[j]` = rows it sends to rank j (int64, one per rank);
        afterwards it holds recv_counts[i] = rows rank i sends to it."""
        send = np.ascontiguousarray(send_counts, dtype=np.int64)
        recv = np.empty_like(send)
        self._call("Alltoall", self.comm.Alltoall, send, recv)
        return recv

    def all_to_all_v(self, send, send_counts, recv_counts):
        """`send` holds rows bucketed by destination rank, `send_counts[j]` of them for rank j;
        returns the rows received, bucketed by source rank, `recv_counts[i]` from rank i."""
        send = np.ascontiguousarray(send)
        row_shape = send.shape[1:]
        row_elems = int(np.prod(row_shape)) if row_shape else 1
        send_counts = np.asarray(send_counts, dtype=np.int64)
        recv_counts = np.asarray(recv_counts, dtype=np.int64)
        recv = np.empty((int(recv_counts.sum()),) + row_shape, dtype=send.dtype)
        sc, rc = send_counts * row_elems, recv_counts * row_elems
        self._call("Alltoallv", self.comm.Alltoallv,
                   [send, (sc, _displacements(sc))], [recv, (rc, _displacements(rc))])
        return recv

    def all_to_all_v_many(self, sends, send_counts, recv_counts):
        """Several all_to_all_v exchanges in one collective: `sends[t]` (any dtype and row shape)
        with `send_counts[t]` / `recv_counts[t]` (int64 [size] each); returns the list of
        received arrays. The pieces for one peer travel together as bytes in one Alltoallv."""
        sends = [np.ascontiguousarray(send) for send in sends]
        row_bytes = [send.dtype.itemsize * int(np.prod(send.shape[1:], dtype=np.int64))
                     for send in sends]
        send_bytes = np.stack([np.asarray(c, np.int64) * b for c, b in zip(send_counts, row_bytes)])
        recv_bytes = np.stack([np.asarray(c, np.int64) * b for c, b in zip(recv_counts, row_bytes)])
        # Peer-major packing: for each peer, the pieces of every array in order.
        send_offsets = [_displacements(np.asarray(c, np.int64) * b)
                        for c, b in zip(send_counts, row_bytes)]
        packed = np.empty(int(send_bytes.sum()), dtype=np.uint8)
        position = 0
        for peer in range(self.size):
            for t, send in enumerate(sends):
                length = int(send_bytes[t, peer])
                start = int(send_offsets[t][peer])
                packed[position:position + length] = send.reshape(-1).view(np.uint8)[
                    start:start + length]
                position += length
        per_peer_send = send_bytes.sum(axis=0)
        per_peer_recv = recv_bytes.sum(axis=0)
        received = np.empty(int(per_peer_recv.sum()), dtype=np.uint8)
        self._call("Alltoallv", self.comm.Alltoallv,
                   [packed, (per_peer_send, _displacements(per_peer_send))],
                   [received, (per_peer_recv, _displacements(per_peer_recv))])
        outs = [np.empty((int(np.sum(c)),) + send.shape[1:], dtype=send.dtype)
                for c, send in zip(recv_counts, sends)]
        out_positions = [0] * len(sends)
        position = 0
        for peer in range(self.size):
            for t, out in enumerate(outs):
                length = int(recv_bytes[t, peer])
                flat = out.reshape(-1).view(np.uint8)
                flat[out_positions[t]:out_positions[t] + length] = received[
                    position:position + length]
                out_positions[t] += length
                position += length
        return outs

    def all_gather_v(self, send):
        """Every rank contributes `send` (any number of rows); returns (rows of all ranks in rank
        order, counts per rank)."""
        send = np.ascontiguousarray(send)
        row_shape = send.shape[1:]
        row_elems = int(np.prod(row_shape)) if row_shape else 1
        counts = np.empty(self.size, dtype=np.int64)
        self._call("Allgather", self.comm.Allgather,
                   np.array([send.shape[0]], dtype=np.int64), counts)
        recv = np.empty((int(counts.sum()),) + row_shape, dtype=send.dtype)
        rc = counts * row_elems
        self._call("Allgatherv", self.comm.Allgatherv, send, [recv, (rc, _displacements(rc))])
        return recv, counts

    def reduce_scatter(self, send, recv_counts, op="sum"):
        """`send` holds sum(recv_counts) rows on every rank; rank i gets the element-wise reduction
        over ranks of rows [displs[i], displs[i] + recv_counts[i])."""
        send = np.ascontiguousarray(send)
        row_shape = send.shape[1:]
        row_elems = int(np.prod(row_shape)) if row_shape else 1
        recv_counts = np.asarray(recv_counts, dtype=np.int64)
        recv = np.empty((int(recv_counts[self.rank]),) + row_shape, dtype=send.dtype)
        self._call("Reduce_scatter", self.comm.Reduce_scatter, send, recv,
                   recv_counts * row_elems, self._mpi_op(op))
        return recv

    def all_reduce(self, array, op="sum"):
        """Returns the element-wise reduction of `array` over all ranks."""
        send = np.ascontiguousarray(array)
        recv = np.empty_like(send)
        self._call("Allreduce", self.comm.Allreduce, send, recv, self._mpi_op(op))
        return recv

    def broadcast(self, array, root=0):
        """Returns rank `root`'s `array` on every rank (same shape and dtype everywhere)."""
        buf = np.array(array, copy=True, order="C")
        self._call("Bcast", self.comm.Bcast, buf, root)
        return buf

    def close(self):
        """Nothing to free: the MPI communicator belongs to the ProcessGroup."""

    def barrier(self):
        """Blocks until every rank has called barrier()."""
        self._call("Barrier", self.comm.Barrier)

    def all_gather_object(self, obj):
        """Returns the list of every rank's picklable `obj`, in rank order."""
        return self._call("allgather", self.comm.allgather, obj)

    def broadcast_object(self, obj, root=0):
        """Returns rank `root`'s picklable `obj` on every rank."""
        return self._call("bcast", self.comm.bcast, obj, root)

    def raise_together(self, local_error, what):
        """Collective: every rank passes the exception it found (or None). If any rank found one,
        every rank raises an exception of the first failing rank's type whose message lists each
        failing rank's message; otherwise returns None. `what` names the step, for the message."""
        mine = None if local_error is None else (type(local_error), str(local_error))
        found = [mine] if self.size == 1 else self.all_gather_object(mine)
        failures = [(r, f) for r, f in enumerate(found) if f is not None]
        if not failures:
            return None
        error_type = failures[0][1][0]
        lines = ["rank %d: %s" % (r, msg) for r, (_, msg) in failures]
        raise error_type("%s failed on %d of %d ranks:\n  %s" % (
            what, len(failures), self.size, "\n  ".join(lines)))
