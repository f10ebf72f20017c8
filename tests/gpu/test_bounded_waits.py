"""Every place the cuda backend and the engine wait on the host ends within SOK1X_NCCL_TIMEOUT_S
when the stream never gets there, with CommError naming the wait and the collective in flight.

A rank whose peer never joins sees its stream stop inside an NCCL collective. One process
reproduces that on one GPU: a kernel spins on sok1x's stream until a flag in host-mapped memory is
set, and an all-to-all is queued behind it. Each test then makes one kind of wait (a synchronize,
a download, a staged copy, a stream event, a strided copy for DLPack, the engine's waits for its
exchange sizes) and must see it give up; the flag is set only after the limit, so a wait that is
not bounded would end by the kernel finishing instead, with no error, and fail the test. Uploads
must not wait at all. Run with one rank (`python3 -m pytest`, or mpiexec -n 1): each test aborts
its communicator, and the next one brings the engine up again.
"""
import gc
import threading
import time

import numpy as np
import pytest

pytest.importorskip("pycuda")

from conftest import skip_without_gpu  # noqa: E402
from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.errors import CommError  # noqa: E402

pytestmark = pytest.mark.timeout(120, method="thread")
TIMEOUT_S = 2.0
# The limit, NCCL's abort of the stalled communicator (which waits for the spinning kernel, set
# free one second after the limit) and start-up noise.
BOUND_S = TIMEOUT_S + 1.0 + 10.0
SPIN_SOURCE = r"""
extern "C" __global__ void spin_until_set(volatile const int* flag) {
    while (*flag == 0) {
        __nanosleep(2000);
    }
}
"""


def _spin_kernel():
    """Returns (module, the spinning kernel). Whoever launches it keeps the module until the
    kernel has ended: unloading a module whose kernel runs blocks inside the driver holding the
    GIL, so the timer that would set the flag never runs (the fixture hung so on one H100 and on
    2 H200s when the module went with Stall.__init__'s local variable)."""
    import pycuda.driver as driver
    from sok1x.cuda_kernels import compiler
    major, minor = driver.Context.get_device().compute_capability()
    cubin = compiler.compile_text(SPIN_SOURCE, "spin_until_set.cu", "sm_%d%d" % (major, minor))
    module = driver.module_from_buffer(cubin)
    return module, module.get_function("spin_until_set")


class Stall:
    """sok1x's stream held by a spinning kernel and an all-to-all queued behind it. The flag is
    set `release_after_s` after the stall starts, by a timer started first: a call that blocks
    inside the driver (where no limit reaches) then returns late, and its test fails, not hangs."""

    def __init__(self, rt, release_after_s):
        from sok1x.backend.cuda import context as cuda_context
        self.rt = rt
        self.flag = rt.backend.host_mapped_zeros((1,), np.int32)
        self.module, kernel = _spin_kernel()
        counts = np.full(rt.size, 4, dtype=np.int64)
        send = rt.backend.asarray(np.ones((4 * rt.size, 2), np.float32))
        rt.backend.synchronize()
        self.started = time.monotonic()
        self.timer = threading.Timer(release_after_s, self.release)
        self.timer.start()
        kernel(np.intp(int(self.flag.gpudata)), block=(1, 1, 1), grid=(1, 1),
               stream=cuda_context.stream())
        self.received = rt.data.all_to_all_v(send, counts, counts)

    def release(self):
        self.flag.sok1x_host_memory[0] = 1

    def elapsed(self):
        return time.monotonic() - self.started


def warm_staging(rt):
    """Makes the staging pool hold the page-locked blocks the tests use while stalled, several
    of each size at once, so that none of them needs a new one: that is a bounded wait of its
    own (see test_a_new_staging_block_gives_up). Uploads made to warm it could each find the
    previous one's block already free (its copy done) and leave one block where two are used."""
    from sok1x.backend.cuda import staging as cuda_staging
    rt.backend.synchronize()
    cuda_staging.reserve([16 * 4] * 8 + [100000 * 4] * 2)


@pytest.fixture
def stalled(monkeypatch):
    """Brings the engine up with a TIMEOUT_S limit and stalls its stream; afterwards lets the
    stream run out and shuts the engine down (its communicator is aborted by then)."""
    skip_without_gpu()
    monkeypatch.setenv("SOK1X_NCCL_TIMEOUT_S", str(TIMEOUT_S))
    rt = runtime.init(backend="cuda")
    assert rt.data.timeout_s == TIMEOUT_S
    with runtime.entered():
        _spin_kernel()  # compiled before the stall
        warm_staging(rt)
        # No collection while the stream is stalled: freeing page-locked memory or a module
        # (an earlier test's Stall, which its timer keeps in a reference cycle) waits for the
        # device inside the driver, holding the GIL, so the timer could never end the stall.
        gc.collect()
        gc.disable()
        stall = Stall(rt, TIMEOUT_S + 1.0)
    try:
        yield stall
    finally:
        stall.timer.join()
        runtime.shutdown()
        from sok1x.backend.cuda import context as cuda_context
        with cuda_context.entered():
            cuda_context.wait_stream()  # unbounded now, and the kernel has ended
        gc.enable()
        stall.timer = None  # the cycle goes, and the collection frees its memory now
        gc.collect()


def assert_timed_out(stall, wait, what):
    """Runs wait() inside the engine's context and checks it raised CommError within the
    bound, after the limit (not before), naming `what` (when given) and the all-to-all in
    flight."""
    with pytest.raises(CommError) as raised:
        with runtime.entered():
            wait()
    seconds = stall.elapsed()
    message = str(raised.value)
    assert "timed out" in message and "all_to_all_v" in message, message
    assert what is None or what in message, message
    assert TIMEOUT_S * 0.9 <= seconds < BOUND_S, "gave up after %.1f s: %s" % (seconds, message)


def test_synchronize_gives_up(stalled):
    assert_timed_out(stalled, stalled.rt.backend.synchronize, "sok1x stream")


def test_a_copy_to_the_host_gives_up(stalled):
    """The stalled-peer job's wait: to_host of the all-to-all's output (a copy to pageable
    memory blocked inside the driver before it was staged)."""
    assert_timed_out(stalled, lambda: stalled.rt.backend.to_host(stalled.received),
                     "a copy to the host")


def test_a_staged_download_gives_up(stalled):
    assert_timed_out(stalled, lambda: stalled.rt.backend.download_staged(stalled.received),
                     "a staged copy to the host")


def test_a_strided_array_for_dlpack_gives_up(stalled):
    """A non-contiguous array is made contiguous through the host (was PyCUDA's .get())."""
    def export():
        matrix = stalled.rt.backend.zeros((8, 4), np.float32)
        stalled.rt.backend.to_dlpack(matrix[:, 1:3])
    assert_timed_out(stalled, export, "strided array")


def test_a_stream_event_wait_gives_up(stalled):
    import pycuda.driver as driver
    from sok1x.backend.cuda import context as cuda_context

    def wait():
        event = driver.Event(flags=driver.event_flags.DISABLE_TIMING)
        event.record(cuda_context.stream())
        cuda_context.wait_event(event, "the test's event")
    assert_timed_out(stalled, wait, "the test's event")


def test_the_engine_waits_for_exchange_sizes_give_up(stalled):
    """An engine lookup behind the stall: its first host wait (the per-owner counts) gives up."""
    spec = random_init.make_spec("uniform", -1.0, 1.0, seed=3)
    api.create_table("stalled_table", 4, 1000, True, spec)
    keys = np.arange(16, dtype=np.int64).reshape(8, 2)
    assert_timed_out(stalled, lambda: api.dense_lookup("stalled_table", "fwd", keys, True), None)


def test_a_new_staging_block_gives_up(stalled):
    """Page-locked memory is allocated only after a bounded wait for the stream (the driver may
    wait for the device there): an upload of a size no block has yet gives up like any wait."""
    from sok1x.backend.cuda import staging as cuda_staging
    # Larger than any block the process holds (other tests in it may have taken big ones).
    size = max(3 << 20, 2 * cuda_staging.pinned_bytes())
    assert_timed_out(stalled, lambda: stalled.rt.backend.asarray(np.zeros(size, np.uint8)),
                     "allocating page-locked host memory")


def test_uploads_do_not_wait_for_the_stream(stalled):
    """A copy from host memory, pageable or staged, is queued without a host wait (the driver
    waits for the stream before a copy from pageable memory: staging avoids it)."""
    rt = stalled.rt
    values = np.arange(100000, dtype=np.float32)
    with runtime.entered():
        started = time.monotonic()
        uploaded = rt.backend.asarray(values)
        staged = rt.backend.upload_staged(values * 2)
        seconds = time.monotonic() - started
    assert seconds < TIMEOUT_S / 2, "an upload waited %.1f s for the stalled stream" % seconds
    stalled.timer.join()
    stalled.release()
    with runtime.entered():
        from sok1x.backend.cuda import context as cuda_context
        cuda_context.wait_stream()  # the kernel ended: the wait ends too
        np.testing.assert_array_equal(rt.backend.to_host(uploaded), values)
        np.testing.assert_array_equal(rt.backend.to_host(staged), values * 2)
