"""NCCL collectives checked against the MPI reference, one GPU per rank.

    mpiexec --allow-run-as-root -n 2 python3 -m pytest -q tests/gpu/test_nccl_collectives.py

Rank-agnostic: each rank's data comes from (seed, rank) and the expected result from
MpiCommunicator on the same host data, so the tests pass at any -n. Every test makes the same
collective calls on every rank and then `agree()`s, so a failed assertion on one rank fails the
test on all of them and the ranks stay in step. A rank stuck in a collective is ended by
pytest-timeout (method="thread" exits the process, and mpiexec then ends the job). The library
discovery tests need no GPU and run anywhere.
"""
import faulthandler
import sys
import threading
import time
import types

import numpy as np
import pytest

from sok1x.comm import nccl_library
from sok1x.errors import CommError, InitError

pytestmark = pytest.mark.timeout(120, method="thread")

DTYPES = [np.float32, np.int64]
ROW_SHAPES = [(), (3,), (2, 4)]


# -- fixtures and helpers -------------------------------------------------------------------

@pytest.fixture(scope="module")
def group():
    from sok1x.comm.process_group import ProcessGroup
    return ProcessGroup()


@pytest.fixture(scope="module")
def mpi(group):
    from sok1x.comm.mpi import MpiCommunicator
    return MpiCommunicator(group)


@pytest.fixture(scope="module")
def gpu(group):
    """PyCUDA with this rank's device's primary context current on the test thread."""
    driver = pytest.importorskip("pycuda.driver")
    gpuarray = pytest.importorskip("pycuda.gpuarray")
    driver.init()
    count = driver.Device.count()
    if count == 0:
        pytest.skip("no CUDA device")
    ordinal = group.device_for_local_rank(count)
    context = driver.Device(ordinal).retain_primary_context()
    context.push()
    yield types.SimpleNamespace(driver=driver, gpuarray=gpuarray, ordinal=ordinal)
    driver.Context.pop()


@pytest.fixture(scope="module")
def nccl(group, gpu):
    from sok1x.comm.nccl import NcclCommunicator
    comm = NcclCommunicator(group, gpu.ordinal)
    comm.timeout_s = 60.0  # below pytest-timeout, so a stuck collective reports itself
    yield comm
    comm.close()


def agree(mpi, check):
    """Runs `check()` (this rank's assertions); fails on every rank if it failed on any."""
    try:
        check()
        message = None
    except AssertionError as exc:
        message = str(exc) or repr(exc)
    failed = ["rank %d: %s" % (r, m) for r, m in enumerate(mpi.all_gather_object(message))
              if m is not None]
    assert not failed, "\n".join(failed)


def host_rows(rank, rows, row_shape, dtype, seed):
    """Rows of random data that depend only on (seed, rank)."""
    rng = np.random.default_rng([seed, rank])
    shape = (rows,) + tuple(row_shape)
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-1000, 1000, size=shape).astype(dtype)


def assert_same(got, want, exact=True):
    assert got.shape == want.shape, "shape %s, expected %s" % (got.shape, want.shape)
    assert got.dtype == want.dtype, "dtype %s, expected %s" % (got.dtype, want.dtype)
    if exact:
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- library discovery (no GPU needed) ------------------------------------------------------

def test_env_var_naming_a_missing_file_is_an_init_error(monkeypatch, tmp_path):
    missing = str(tmp_path / "libnccl.so.2")
    monkeypatch.setenv(nccl_library.ENV_LIBRARY, missing)
    with pytest.raises(InitError, match=nccl_library.ENV_LIBRARY):
        nccl_library.find_nccl_library()


def test_env_var_wins(monkeypatch, tmp_path):
    chosen = tmp_path / "libnccl.so.2"
    chosen.write_bytes(b"")
    monkeypatch.setenv(nccl_library.ENV_LIBRARY, str(chosen))
    assert nccl_library.find_nccl_library() == str(chosen)


def test_wheel_found_in_any_portion_of_a_namespace_package(monkeypatch, tmp_path):
    namespace = "sok1x_fake_nvidia"
    (tmp_path / "a" / namespace).mkdir(parents=True)  # a portion without nccl
    library = tmp_path / "b" / namespace / "nccl" / "lib" / "libnccl.so.2"
    library.parent.mkdir(parents=True)
    library.write_bytes(b"")
    monkeypatch.delenv(nccl_library.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(nccl_library, "WHEEL_NAMESPACE", namespace)
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    for name in list(sys.modules):
        if name == namespace or name.startswith(namespace + "."):
            monkeypatch.delitem(sys.modules, name)
    assert nccl_library.find_nccl_library() == str(library)


def test_nothing_found_says_where_it_looked_and_how_to_fix(monkeypatch):
    monkeypatch.delenv(nccl_library.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(nccl_library, "WHEEL_NAMESPACE", "sok1x_no_such_namespace")
    monkeypatch.setattr(nccl_library, "NCCL_SONAME", "libsok1x-no-such-nccl.so.2")
    with pytest.raises(InitError) as caught:
        nccl_library.find_nccl_library()
    message = str(caught.value)
    for words in (nccl_library.ENV_LIBRARY, "libsok1x-no-such-nccl.so.2", "pip install",
                  "LD_LIBRARY_PATH"):
        assert words in message


# -- the real library (GPU machines) -------------------------------------------------------

def test_real_library_is_found_bound_once_and_checked(monkeypatch, gpu):
    monkeypatch.delenv(nccl_library.ENV_LIBRARY, raising=False)
    path = nccl_library.find_nccl_library()
    library = nccl_library.load_nccl_library()
    assert nccl_library.load_nccl_library(path) is library
    assert library.version >= nccl_library.MIN_VERSION
    print("NCCL %s from %s" % (library.version_text, path))
    with pytest.raises(CommError, match="ncclCommGetAsyncError failed: "):
        library.comm_get_async_error(None)  # NULL communicator: ncclInvalidArgument


# -- collectives against MPI ----------------------------------------------------------------

@pytest.mark.parametrize("pattern", ["no_zeros", "one_empty_piece", "rank0_sends_nothing"])
@pytest.mark.parametrize("row_shape", ROW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_to_all_v_matches_mpi(group, mpi, nccl, gpu, dtype, row_shape, pattern):
    rng = np.random.default_rng([11, group.rank])
    send_counts = rng.integers(1, 6, size=group.size).astype(np.int64)
    if group.rank == 0 and pattern == "one_empty_piece":
        send_counts[1 % group.size] = 0
    if group.rank == 0 and pattern == "rank0_sends_nothing":
        send_counts[:] = 0
    recv_counts = mpi.all_to_all_counts(send_counts)
    host = host_rows(group.rank, int(send_counts.sum()), row_shape, dtype, seed=12)
    want = mpi.all_to_all_v(host, send_counts, recv_counts)
    got = nccl.all_to_all_v(gpu.gpuarray.to_gpu(host), send_counts, recv_counts)
    nccl.synchronize()
    got = got.get()
    agree(mpi, lambda: assert_same(got, want))


def test_all_to_all_v_many_matches_mpi(group, mpi, nccl, gpu):
    # Three arrays of different dtypes and row shapes in one group, as a fused lookup sends them.
    rng = np.random.default_rng([13, group.rank])
    shapes = [((), np.int64), ((16,), np.float32), ((2, 64), np.float32)]
    sends, send_counts, recv_counts = [], [], []
    for t, (row_shape, dtype) in enumerate(shapes):
        counts = rng.integers(0, 5, size=group.size).astype(np.int64)
        send_counts.append(counts)
        recv_counts.append(mpi.all_to_all_counts(counts))
        sends.append(host_rows(group.rank, int(counts.sum()), row_shape, dtype, seed=14 + t))
    want = mpi.all_to_all_v_many(sends, send_counts, recv_counts)
    got = nccl.all_to_all_v_many([gpu.gpuarray.to_gpu(a) for a in sends], send_counts,
                                 recv_counts)
    nccl.synchronize()
    got = [a.get() for a in got]
    agree(mpi, lambda: [assert_same(g, w) for g, w in zip(got, want)])
    singles = [mpi.all_to_all_v(a, sc, rc) for a, sc, rc in zip(sends, send_counts, recv_counts)]
    agree(mpi, lambda: [assert_same(g, w) for g, w in zip(want, singles)])


@pytest.mark.parametrize("pattern", ["uneven_with_zero", "equal"])
@pytest.mark.parametrize("row_shape", ROW_SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_v_matches_mpi(group, mpi, nccl, gpu, dtype, row_shape, pattern):
    rows = (2 * group.rank) % 5 if pattern == "uneven_with_zero" else 4
    host = host_rows(group.rank, rows, row_shape, dtype, seed=21)
    want, want_counts = mpi.all_gather_v(host)
    got, got_counts = nccl.all_gather_v(gpu.gpuarray.to_gpu(host))
    nccl.synchronize()
    got = got.get()

    def check():
        np.testing.assert_array_equal(got_counts, want_counts)
        assert got_counts.dtype == np.int64
        assert_same(got, want)
    agree(mpi, check)


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("pattern", ["uneven_with_zero", "equal"])
@pytest.mark.parametrize("row_shape", [(), (2, 4)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_matches_mpi(group, mpi, nccl, gpu, dtype, row_shape, pattern, op):
    if pattern == "equal":
        recv_counts = np.full(group.size, 3, dtype=np.int64)
    else:  # the same counts on every rank: seeded without the rank
        recv_counts = np.random.default_rng(31).integers(1, 6, size=group.size).astype(np.int64)
        recv_counts[0] = 0
    host = host_rows(group.rank, int(recv_counts.sum()), row_shape, dtype, seed=32)
    want = mpi.reduce_scatter(host, recv_counts, op)
    got = nccl.reduce_scatter(gpu.gpuarray.to_gpu(host), recv_counts, op)
    nccl.synchronize()
    got = got.get()
    exact = op != "sum" or np.dtype(dtype).kind != "f"
    agree(mpi, lambda: assert_same(got, want, exact))


@pytest.mark.parametrize("op", ["sum", "max", "min"])
@pytest.mark.parametrize("shape", [(7,), (3, 5), (0,)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_matches_mpi(group, mpi, nccl, gpu, dtype, shape, op):
    host = host_rows(group.rank, shape[0], shape[1:], dtype, seed=41)
    want = mpi.all_reduce(host, op)
    got = nccl.all_reduce(gpu.gpuarray.to_gpu(host), op)
    nccl.synchronize()
    got = got.get()
    exact = op != "sum" or np.dtype(dtype).kind != "f"
    agree(mpi, lambda: assert_same(got, want, exact))


def test_all_reduce_prod(group, mpi, nccl, gpu):
    host = (np.arange(6, dtype=np.int64) % 3) + group.rank
    every_rank = mpi.all_gather_object(host)
    got = nccl.all_reduce(gpu.gpuarray.to_gpu(host), "prod")
    nccl.synchronize()
    got = got.get()
    agree(mpi, lambda: assert_same(got, np.prod(np.stack(every_rank), axis=0)))


@pytest.mark.parametrize("root", ["first", "last"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_broadcast_matches_mpi(group, mpi, nccl, gpu, dtype, root):
    root_rank = 0 if root == "first" else group.size - 1
    host = host_rows(group.rank, 9, (2,), dtype, seed=51)
    want = mpi.broadcast(host, root_rank)
    got = nccl.broadcast(gpu.gpuarray.to_gpu(host), root_rank)
    nccl.synchronize()
    got = got.get()
    agree(mpi, lambda: assert_same(got, want))


def test_barrier_returns_on_every_rank(mpi, nccl):
    assert nccl.barrier() is None
    assert nccl.barrier() is None
    agree(mpi, lambda: None)


def test_calls_from_a_thread_with_no_current_context(group, mpi, nccl, gpu):
    array = gpu.gpuarray.to_gpu(np.full(5, group.rank + 1, dtype=np.float32))
    seen = {}

    def work():
        try:
            result = nccl.all_reduce(array)
            nccl.synchronize()
            seen["result"] = result
            seen["context_after"] = gpu.driver.Context.get_current()
        except Exception as exc:  # reported below, on every rank
            seen["error"] = exc

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    want = np.full(5, group.size * (group.size + 1) / 2, dtype=np.float32)

    def check():
        assert "error" not in seen, repr(seen.get("error"))
        assert seen["context_after"] is None, "the thread was left with a current context"
        assert_same(seen["result"].get(), want)
    agree(mpi, check)


def test_shares_the_cuda_backend_context_when_active(group, mpi, gpu):
    from sok1x.backend.cuda import context as cuda_context
    from sok1x.comm.nccl import NcclCommunicator
    cuda_context.activate(gpu.ordinal)
    comm = NcclCommunicator(group, gpu.ordinal, cuda_context.stream())
    host = np.arange(6, dtype=np.float32) + group.rank
    try:
        got = comm.all_reduce(gpu.gpuarray.to_gpu(host))
        comm.synchronize()
        got = got.get()
    finally:
        comm.close()
    want = mpi.all_reduce(host)

    def check():
        assert comm.context is cuda_context.context()
        assert comm.stream is cuda_context.stream()
        assert_same(got, want)
    agree(mpi, check)


# -- errors name the call -------------------------------------------------------------------

def test_bad_arguments_raise_before_any_collective(group, mpi, nccl, gpu):
    complex_array = gpu.gpuarray.to_gpu(np.zeros(4, dtype=np.complex64))
    rows = gpu.gpuarray.to_gpu(np.zeros((3, 2), dtype=np.float32))
    counts = np.zeros(group.size, dtype=np.int64)
    with pytest.raises(CommError, match=r"all_reduce: dtype complex64 is not supported"):
        nccl.all_reduce(complex_array)
    with pytest.raises(CommError, match=r"reduce_scatter: reduce op must be one of"):
        nccl.reduce_scatter(rows, np.full(group.size, 0, dtype=np.int64), op="avg")
    with pytest.raises(CommError, match=r"all_to_all_v on rank \d+: the array has 3 rows"):
        nccl.all_to_all_v(rows, counts, counts)
    with pytest.raises(CommError, match=r"broadcast expects a pycuda GPUArray"):
        nccl.broadcast(np.zeros(3, dtype=np.float32))
    nccl.barrier()  # nothing reached NCCL: the communicator still works
    agree(mpi, lambda: None)


# -- a missing peer (keep last: it aborts a communicator of its own) --------------------------

@pytest.mark.timeout(90, method="thread")
def test_a_missing_peer_times_out_instead_of_hanging(group, mpi, gpu):
    """Rank 0 enters an all-reduce alone while the others sit in an MPI barrier: rank 0 must
    raise (timed out, communicator aborted) within timeout + abort wait, never hang. Within a host
    NCCL's abort waits for the peers to abort too; they do after the barrier."""
    if group.size < 2:
        pytest.skip("needs two ranks")
    from sok1x.comm.nccl import NcclCommunicator
    faulthandler.dump_traceback_later(60)  # if anything hangs, show where before the timeout
    comm = NcclCommunicator(group, gpu.ordinal)
    array = gpu.gpuarray.to_gpu(np.ones(256, dtype=np.float32))
    comm.all_reduce(array)  # together once, so connections are set up before rank 0 is alone
    comm.synchronize()
    comm.timeout_s = 3.0
    message, waited = None, 0.0
    if group.rank == 0:
        started = time.monotonic()
        comm.all_reduce(array)
        try:
            comm.synchronize()
        except CommError as exc:
            message = str(exc)
        waited = time.monotonic() - started
    mpi.barrier()
    if group.rank == 0:
        with pytest.raises(CommError, match="aborted"):
            comm.barrier()
    finished = comm.abort()
    comm.close()
    faulthandler.cancel_dump_traceback_later()
    print("rank %d: waited %.1f s, abort finished: %s, error: %s" % (
        group.rank, waited, finished, message))

    def check():
        if group.rank == 0:
            assert message is not None, "rank 0 waited alone and did not time out"
            assert "all_reduce" in message and "timed out" in message, message
            assert waited < 3.0 + 15.0, "rank 0 took %.1f s to give up" % waited
    agree(mpi, check)
