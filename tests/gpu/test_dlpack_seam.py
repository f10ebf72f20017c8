"""The zero-copy seam on a GPU, with PyTorch standing in for TensorFlow (DESIGN D1): the same
backend calls graph_ops/boundary.py makes (from_dlpack, wait_for_framework, release_to_framework,
to_dlpack), fed torch's capsules (torch.utils.dlpack.to_dlpack, like tf.experimental.dlpack: a
capsule, no stream handshake). No TensorFlow needed.

    python3 -m pytest -q tests/gpu/test_dlpack_seam.py               (one GPU)
    mpiexec -n 2 python3 -m pytest -q tests/gpu/test_dlpack_seam.py  (the lookup on 2 GPUs)
"""
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pycuda")

from torch.utils import dlpack as torch_dlpack  # noqa: E402

from sok1x.backend import dlpack, random_init  # noqa: E402
from sok1x.backend.cpu import random_rows as cpu_random  # noqa: E402
from sok1x.engine import api, runtime  # noqa: E402
from sok1x.engine.op_keys import name_key  # noqa: E402

pytestmark = pytest.mark.timeout(300, method="thread")
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=11)
SLEEP_CYCLES = 400_000_000  # ~0.2 s of a spinning kernel: far longer than the host's calls


@pytest.fixture(scope="module")
def cuda(engine):
    """The engine's cuda backend (conftest's engine), with PyTorch on the engine's GPU."""
    torch.cuda.set_device(engine.device_ordinal)
    return engine.backend


def to_engine(backend, tensor):
    """What boundary._tensor_to_engine does for a GPU tensor."""
    return backend.from_dlpack(torch_dlpack.to_dlpack(tensor))


def to_torch(backend, array):
    """What boundary._result_to_tensor does for a device array."""
    return torch_dlpack.from_dlpack(backend.to_dlpack(array))


def test_engine_reads_a_torch_tensor_in_place(cuda):
    tensor = torch.arange(1000, dtype=torch.int64, device="cuda")
    array = to_engine(cuda, tensor)
    assert int(array.gpudata) == tensor.data_ptr()
    assert array.shape == (1000,) and array.dtype == np.int64
    torch.cuda.synchronize()
    np.testing.assert_array_equal(cuda.to_host(array), np.arange(1000))


def test_engine_output_becomes_a_torch_tensor_without_a_copy(cuda):
    array = cuda.asarray(np.arange(24, dtype=np.float32).reshape(4, 6))
    address = int(array.gpudata)
    tensor = to_torch(cuda, array)
    assert tensor.data_ptr() == address and tuple(tensor.shape) == (4, 6)
    cuda.release_to_framework()
    assert tensor.sum().item() == float(sum(range(24)))


def test_a_capsule_is_consumed_once(cuda):
    capsule = torch_dlpack.to_dlpack(torch.ones(3, device="cuda"))
    cuda.from_dlpack(capsule)
    with pytest.raises(TypeError, match="consumed once"):
        cuda.from_dlpack(capsule)


def test_a_host_tensor_is_refused_with_advice(cuda):
    with pytest.raises(TypeError, match="place the op on this rank's GPU"):
        cuda.from_dlpack(torch_dlpack.to_dlpack(torch.ones(3)))


def test_a_strided_tensor_is_refused(cuda):
    strided = torch.ones((4, 4), device="cuda").t()
    with pytest.raises(TypeError, match="C-contiguous"):
        cuda.from_dlpack(torch_dlpack.to_dlpack(strided))


def _framework_stream():
    """A blocking stream that is not the default one, as TensorFlow's compute streams are (torch's
    own side streams are non-blocking, its default stream is the legacy one): torch runs on it
    through ExternalStream."""
    import pycuda.driver as driver
    from sok1x.backend.cuda import context as cuda_context
    with cuda_context.entered():
        stream = driver.Stream()  # flags 0: a blocking stream
    return stream, torch.cuda.ExternalStream(stream.handle)


def _late_producer(framework_stream):
    """A tensor that the framework's stream fills only after a long spinning kernel."""
    with torch.cuda.stream(framework_stream):
        tensor = torch.zeros(1 << 20, dtype=torch.int64, device="cuda")
        torch.cuda._sleep(SLEEP_CYCLES)
        tensor.fill_(7)
    return tensor


def _engine_reads(cuda, array):
    index = cuda.asarray(np.arange(0, 1 << 20, 4099))  # a pageable copy: before the stream waits
    return cuda.to_host(cuda.take_rows(array, index))


def test_a_producer_still_running_on_the_framework_stream_is_waited_for(cuda):
    keep, framework = _framework_stream()
    tensor = _late_producer(framework)
    array = to_engine(cuda, tensor)
    cuda.wait_for_framework()
    seen = _engine_reads(cuda, array)
    assert (seen == 7).all(), "the engine read the tensor before the framework's kernel wrote it"


def test_without_the_wait_the_engine_would_read_too_early(cuda):
    # The control for the test above: the same reads with no ordering see the zeros, so the test
    # above can fail, and the wait is what makes it pass.
    keep, framework = _framework_stream()
    tensor = _late_producer(framework)
    array = to_engine(cuda, tensor)
    seen = _engine_reads(cuda, array)
    torch.cuda.synchronize()
    assert (seen == 0).any()


def _spin_on_engine_stream(cuda):
    """Queues a long spinning kernel on sok1x's stream."""
    from pycuda.compiler import SourceModule
    from sok1x.backend.cuda import context as cuda_context
    with cuda_context.entered():
        module = SourceModule("""
            extern "C" __global__ void spin(long long cycles) {
              long long start = clock64();
              while (clock64() - start < cycles) { }
            }""", no_extern_c=True)
        module.get_function("spin")(np.int64(SLEEP_CYCLES), block=(1, 1, 1), grid=(1, 1),
                                    stream=cuda_context.stream())


def _framework_sum_of_late_output(cuda, release):
    from sok1x.backend.cuda.kernel_launch import fill_bytes
    keep, framework = _framework_stream()
    out = fill_bytes(cuda.empty((1 << 20,), np.uint8), 0)
    with torch.cuda.stream(framework):  # warm torch's allocator: a cudaMalloc would sync all
        torch.zeros(1 << 20, dtype=torch.uint8, device="cuda").to(torch.int64).sum().item()
    cuda.synchronize()
    _spin_on_engine_stream(cuda)
    fill_bytes(out, 5)  # queued behind the spin on sok1x's stream
    if release:
        cuda.release_to_framework()
    tensor = to_torch(cuda, out)
    with torch.cuda.stream(framework):
        total = tensor.to(torch.int64).sum()
    framework.synchronize()
    return int(total.item())


# No control for this direction: on the H200s of 2026-11-22 the framework's blocking stream read
# the late output correctly even without release_to_framework() (the cause was not found), so
# a test expecting it to read too early could not be made to fail reliably.
def test_the_framework_reads_engine_outputs_after_the_engine_wrote_them(cuda):
    assert _framework_sum_of_late_output(cuda, release=True) == 5 << 20, (
        "the framework read the output before the engine wrote it")


def test_memory_freed_by_torch_after_the_step_does_not_break_the_engine(cuda):
    before = dlpack.live_exports()
    exported = to_torch(cuda, cuda.asarray(np.full(4096, 3.0, np.float32)))
    assert dlpack.live_exports() == before + 1
    del exported
    gc.collect()
    assert dlpack.live_exports() == before
    # An engine array over torch memory keeps it alive after torch lets go of its tensor.
    tensor = torch.full((4096,), 9.0, device="cuda")
    array = to_engine(cuda, tensor)
    del tensor
    gc.collect()
    torch.cuda.empty_cache()
    filler = torch.zeros(1 << 24, device="cuda")  # would reuse the block if it were free
    np.testing.assert_array_equal(cuda.to_host(array), 9.0)
    del filler, array
    # The pool and the engine go on working.
    np.testing.assert_array_equal(cuda.to_host(cuda.asarray(np.ones(8))), 1.0)


def test_lookup_and_gradient_through_the_seam(cuda):
    rt = runtime.get()
    dim = 16
    api.create_table("seam_table", dim, 1 << 16, True, SPEC)
    keys = torch.randint(0, 1 << 40, (256, 10, 5), device="cuda", generator=None)
    arrays = to_engine(cuda, keys)
    cuda.wait_for_framework()
    out, token = api.dense_lookup("seam_table", "seam_fwd", arrays, True, (10, 5))
    cuda.release_to_framework()
    vectors = to_torch(cuda, out)
    want = cpu_random.initial_values(SPEC, name_key("table:seam_table"),
                                     keys.cpu().numpy().reshape(-1), dim)
    np.testing.assert_array_equal(vectors.cpu().numpy().reshape(-1, dim), want)
    top = vectors * 2.0  # torch computes the top gradient on its stream
    grads = to_engine(cuda, top)
    cuda.wait_for_framework()
    values, rows = api.dense_lookup_grad("seam_table", "seam_bwd", token, grads)
    total = rt.host.all_reduce(np.array([cuda.to_host(values).sum()]))[0]
    everyone = rt.host.all_reduce(np.array([float(want.sum()) * 2.0]))[0]
    assert total == pytest.approx(everyone, rel=1e-4)


def test_host_staging_reuses_page_locked_buffers(cuda):
    from sok1x.backend.cuda import staging as cuda_staging
    array = cuda.asarray(np.arange(10000, dtype=np.float32))
    first = cuda.download_staged(array)
    np.testing.assert_array_equal(first, np.arange(10000))
    second = cuda.download_staged(array)  # `first` is alive: another block
    assert abs(first.ctypes.data - second.ctypes.data) >= first.nbytes
    np.testing.assert_array_equal(first, np.arange(10000))
    del first, second
    before = cuda_staging.pinned_bytes()

    def step():
        np.testing.assert_array_equal(cuda.to_host(cuda.upload_staged(np.arange(10000.0))),
                                      np.arange(10000.0))
        cuda.download_staged(array)

    for _ in range(50):
        step()
    # Three uses a step (an 80 KB upload, an 80 KB and a 40 KB download) need at most a block
    # each (128, 128 and 64 KiB), however the copies race (whether the download after an upload
    # finds the upload's block already free depends on whether its copy has run); 50 steps
    # without reuse would take 50 times that.
    assert cuda_staging.pinned_bytes() - before <= 2 * 131072 + 65536


def test_a_misaligned_output_is_copied_into_an_aligned_one(cuda):
    from sok1x.backend.cuda import context as cuda_context
    with cuda_context.entered():
        whole = cuda.asarray(np.arange(100, dtype=np.float32))
        view = whole[3:]  # 12 bytes past an aligned block: TensorFlow would refuse it
    assert int(view.gpudata) % 64
    tensor = to_torch(cuda, view)
    assert tensor.data_ptr() % 64 == 0
    cuda.release_to_framework()
    np.testing.assert_array_equal(tensor.cpu().numpy(), np.arange(3, 100))
