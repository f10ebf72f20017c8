"""The job's process group, read from MPI COMM_WORLD: rank, size, local rank, node count.

UCX memory events are off unless the job sets UCX_MEM_EVENTS itself. UCX (which MPICH's ch4:ucx
device and Open MPI's ucx pml load) hooks mmap, munmap and brk to keep its cache of registered
RDMA buffers valid, and its bookkeeping grows with every unmap a framework's allocator makes:
measured on MPICH 5 with UCX, resident memory grew 0.85 KiB per TensorFlow training step on the
zero-copy seam (0.44 KiB on host staging, 0.2 KiB per py_function op with no sok1x code in it),
and not at all with the hooks off. sok1x's host exchanges are small control messages that need
no registration cache. UCX reads the variable when MPI loads it, so it is set when sok1x.comm is
imported (before sok1x touches mpi4py); a program that loads MPI before importing sok1x (mpi4py,
Horovod) should set UCX_MEM_EVENTS=no in its own environment.
"""
import os
import socket

from sok1x.errors import InitError

UCX_MEMORY_EVENTS = "UCX_MEM_EVENTS"


def keep_ucx_memory_events_off():
    """Sets UCX_MEM_EVENTS=no unless the environment sets it (see the module's docstring)."""
    os.environ.setdefault(UCX_MEMORY_EVENTS, "no")


def import_mpi():
    """Returns mpi4py's MPI module (UCX memory events off unless the environment says otherwise),
    or raises InitError saying how to install it."""
    keep_ucx_memory_events_off()
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise InitError(
            "sok1x needs mpi4py and an MPI library: `pip install mpich mpi4py` (or mpi4py built "
            "against the system's Open MPI / MPICH). Import failed: %s" % exc
        ) from exc
    return MPI


# Launchers that start the job's processes themselves, and the variable each sets to their count.
LAUNCHER_SIZES = (("horovodrun (Gloo)", "HOROVOD_SIZE"),)


def launcher_mismatch(size, environ=None):
    """Returns an InitError when a launcher's environment says the job has more processes than
    MPI's COMM_WORLD (`size`) holds, else None: `horovodrun --gloo` starts processes that are
    each an MPI job of one, and training there would give every process every key."""
    environ = os.environ if environ is None else environ
    for launcher, variable in LAUNCHER_SIZES:
        value = environ.get(variable, "")
        if size == 1 and value.isdigit() and int(value) > 1:
            return InitError(
                "this process is an MPI job of one, but %s=%s says %s started %s processes: each "
                "would hold and train every table alone. sok1x takes its ranks from MPI: launch "
                "with `mpiexec -n %s python ...`, `sok1x-run -np %s ...` or `horovodrun --mpi`."
                % (variable, value, launcher, value, value, value))
    return None


class ProcessGroup:
    """Facts about this process's place in the job.

    Attributes: rank, size (COMM_WORLD), local_rank, local_size (ranks on this host, from the
    shared-memory split), node_count (hosts in the job), hostname, and `world`, the mpi4py
    communicator (a duplicate of COMM_WORLD, so user traffic on COMM_WORLD never matches ours).
    """

    def __init__(self, world=None):
        MPI = import_mpi()
        base = world if world is not None else MPI.COMM_WORLD
        self.world = base.Dup()
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        mismatch = launcher_mismatch(self.size)
        if mismatch is not None:
            raise mismatch
        local = self.world.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = local.Get_rank()
        self.local_size = local.Get_size()
        local.Free()
        self.hostname = socket.gethostname()
        leaders = self.world.allreduce(1 if self.local_rank == 0 else 0)
        self.node_count = int(leaders)

    def __repr__(self):
        return "ProcessGroup(rank=%d, size=%d, local_rank=%d, local_size=%d, nodes=%d)" % (
            self.rank, self.size, self.local_rank, self.local_size, self.node_count)

    def device_for_local_rank(self, visible_device_count):
        """Returns the CUDA device ordinal this rank uses: its local rank, or 0 when the launcher
        already narrowed each rank to one visible device. Raises InitError when there are fewer
        visible devices than local ranks."""
        if visible_device_count == 1:
            return 0
        if self.local_rank < visible_device_count:
            return self.local_rank
        raise InitError(
            "rank %d (local rank %d of %d on %s) has no GPU: %d visible (CUDA_VISIBLE_DEVICES=%r). "
            "Start one process per GPU, or let each rank see its own GPU." % (
                self.rank, self.local_rank, self.local_size, self.hostname, visible_device_count,
                os.environ.get("CUDA_VISIBLE_DEVICES")))
