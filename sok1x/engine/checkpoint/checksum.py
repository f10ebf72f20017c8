"""The crc32 of checkpoint shard files (DESIGN D8), and the small pools of threads that shard
bytes move and are checksummed on: one thread's zlib.crc32 (1 to 6 GB/s, by zlib's version), or
one thread's copies out of the page cache, are slower than a disk or /dev/shm, and a save or
load streams every byte through them (engine/checkpoint/storage.py: the one writer thread writes a
file's buffers in order, the I/O threads read the pieces() of a buffer at once, and each block's
crc32 is taken on the checksum threads while the writer or reader moves the next).

A large buffer is cut into pieces whose crc32s are taken at once on a small thread pool
(zlib.crc32 releases the GIL) and joined as zlib's crc32_combine joins them: the crc32 of A + B
is crc32(A) carried through len(B) zero bytes, XOR crc32(B). Carrying a crc through n zero bytes
is a 32 x 32 matrix over GF(2), made once per length (pieces mostly share one). The result is
zlib.crc32's, bit for bit. SOK1X_CHECKPOINT_THREADS=1 reads and checksums on the caller's
thread alone; writes still go to the one writer thread, whose crc32s are then its own. These
threads need cores of their own: a process bound to one core is told so once (crc_threads).
"""
import functools
import logging
import os
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor

THREADS_ENV = "SOK1X_CHECKPOINT_THREADS"
DEFAULT_THREADS = 4
CRC_THREADS_ENV = "SOK1X_CHECKPOINT_CRC_THREADS"
PIECE_BYTES = 16 << 20  # below this a buffer is one piece: a thread costs more than it saves
_POLYNOMIAL = 0xEDB88320  # crc32's, bit-reflected
_pools = {}  # kind: (threads, executor)
_pool_lock = threading.Lock()


def threads():
    """Threads that read (and checksum) one buffer (SOK1X_CHECKPOINT_THREADS, default 4); a file
    is written on one."""
    return max(1, int(os.environ.get(THREADS_ENV, DEFAULT_THREADS)))


def crc_threads():
    """Threads that checksum the blocks the I/O threads move (SOK1X_CHECKPOINT_CRC_THREADS):
    by default twice threads(), at most one less than the cores this process may run on (a
    thread's crc32 may be slower than its copy, and the writer is one thread: its crc32 must run
    beside it), 0 on one core or with SOK1X_CHECKPOINT_THREADS=1: the I/O thread checksums its
    own blocks."""
    if threads() == 1:
        return 0
    cores = usable_cores()
    if cores == 1:
        _warn_one_core()
    default = max(0, min(2 * threads(), cores - 1))
    return max(0, int(os.environ.get(CRC_THREADS_ENV, default)))


def usable_cores():
    """How many CPU cores this process may run on (its affinity, which an MPI launcher sets)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def _warn_one_core():
    """Says once per process that a checkpoint's threads share one core (what Open MPI's mpiexec
    gives each rank of a job of one or two ranks by default)."""
    if _warned_one_core:
        return
    _warned_one_core.append(True)
    logging.getLogger("sok1x").warning(
        "sok1x: this process may run on 1 CPU core (its launcher bound it there), so a "
        "checkpoint's file and checksum threads share it and dump and load at about half the "
        "disk's rate (one H200 host, 10M x 128 rows: dump 47% and load 43% of a plain write "
        "and read on one core, 109% and 70% with the host's cores). Give each rank several "
        "cores: mpiexec --bind-to none (Open MPI, as Horovod advises), or --map-by "
        "slot:PE=N.")


_warned_one_core = []


def _times(matrix, vector):
    """matrix (32 columns, ints) times vector (an int), over GF(2)."""
    total, column = 0, 0
    while vector:
        if vector & 1:
            total ^= matrix[column]
        vector >>= 1
        column += 1
    return total


def _compose(first, second):
    """The matrix of applying `second`, then `first`."""
    return [_times(first, column) for column in second]


@functools.lru_cache(maxsize=64)
def _zero_bytes(count):
    """The matrix that carries a crc32 register through `count` zero bytes."""
    bit = [_POLYNOMIAL] + [1 << n for n in range(31)]  # one zero bit
    step = bit
    for _ in range(3):
        step = _compose(step, step)  # one zero byte: eight bits
    result = [1 << n for n in range(32)]
    while count:
        if count & 1:
            result = _compose(step, result)
        step = _compose(step, step)
        count >>= 1
    return result


def combine(crc_first, crc_second, second_bytes):
    """The crc32 of A + B from crc32(A), crc32(B) and len(B), as zlib's crc32_combine."""
    return _times(_zero_bytes(int(second_bytes)), crc_first) ^ crc_second


def _executor(kind, count):
    with _pool_lock:
        held, executor = _pools.get(kind, (0, None))
        if held != count:
            if executor is not None:
                executor.shutdown(wait=False)
            executor = ThreadPoolExecutor(count, thread_name_prefix="sok1x-shard-" + kind)
            _pools[kind] = (count, executor)
        return executor


def pieces(view):
    """[(offset, piece)] of uint8 memoryview `view`: itself alone when small, else threads()
    pieces of about equal size (at least PIECE_BYTES each)."""
    count = threads()
    if count == 1 or view.nbytes < 2 * PIECE_BYTES:
        return [(0, view)]
    size = max(PIECE_BYTES, -(-view.nbytes // count))
    return [(start, view[start:start + size]) for start in range(0, view.nbytes, size)]


def submit(function, *args):
    """A Future of function(*args) run on the pool of threads() I/O threads (on this thread,
    done already, with one thread or when no thread can start, as at interpreter exit)."""
    return _submit("io", threads(), function, args)


def submit_write(function, *args):
    """A Future of function(*args) run on the one writer thread, after every function submitted
    before it (on this thread, done already, when no thread can start, as at interpreter
    exit)."""
    return _submit("write", 1, function, args)


def submit_crc(data):
    """A Future of zlib.crc32(data) run on the crc_threads() checksum threads, a pool apart
    from the I/O threads, which wait for it (with none: done already, on this thread)."""
    return _submit("crc", crc_threads(), zlib.crc32, (data,))


def _submit(kind, count, function, args):
    if count > 1 or (kind != "io" and count == 1):
        try:
            return _executor(kind, count).submit(function, *args)
        except RuntimeError:
            pass
    done = Future()
    try:
        done.set_result(function(*args))
    except Exception as exc:  # handed to whoever waits on the Future, as the pool would
        done.set_exception(exc)
    return done


def joined(running, piece_crcs):
    """The crc32 of running's bytes followed by pieces whose (crc32, length) are
    `piece_crcs`."""
    for piece_crc, length in piece_crcs:
        running = combine(running, piece_crc, length)
    return running


def crc32(data, running=0):
    """zlib.crc32(data, running) of a bytes-like `data`, its pieces on threads() threads when it
    is large."""
    view = memoryview(data).cast("B")
    parts = pieces(view)
    if len(parts) == 1:
        return zlib.crc32(view, running)
    futures = [submit(zlib.crc32, piece) for _, piece in parts]
    return joined(running, [(f.result(), piece.nbytes) for f, (_, piece) in zip(futures, parts)])
