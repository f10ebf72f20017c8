"""The Python half of sok1x's TensorFlow kernels on a GPU (sok1x/engine/kernel_calls.py, DESIGN
D1), with PyTorch standing in for TensorFlow: kernel_calls.invoke() hands on_call() what the
compiled kernel hands it (PyTorch's device pointers, shapes, dtypes, and PyTorch's current CUDA
stream as the op's stream), and PyTorch takes the lent outputs as its tensors, without a copy.
A training step through it equals the engine's own step bit for bit, also when PyTorch's stream
is still writing the keys when the call is made. No TensorFlow needed.

    python3 -m pytest -q tests/gpu/test_kernel_calls_cuda.py
"""
import gc

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pycuda")

from sok1x.backend import random_init  # noqa: E402
from sok1x.engine import api, kernel_calls, runtime  # noqa: E402
from sok1x.engine.lookup import bounded_step, replayed_step  # noqa: E402

pytestmark = pytest.mark.timeout(300, method="thread")
SPEC = random_init.make_spec("uniform", -1.0, 1.0, seed=17)
SLEEP_CYCLES = 400_000_000  # ~0.2 s of a spinning kernel: far longer than the host's calls
DIM, SLOTS, NNZ, BATCH = 16, 3, 4, 512
ROWS = 1 << 18  # a table without a hash table: a key's row is the key (one rank), the same in
# every run (a hash table's rows follow the order concurrent inserts claim them in)
_TORCH_DTYPES = {torch.int64: np.int64, torch.int32: np.int32, torch.float32: np.float32}


@pytest.fixture(scope="module")
def cuda(engine):
    torch.cuda.set_device(engine.device_ordinal)
    return engine.backend


class Lent:
    """An output the engine lent, as PyTorch takes it (no copy): gives the memory back to the
    engine when PyTorch drops the tensor, as TensorFlow's tensor does through the kernel."""

    def __init__(self, output):
        self.keep = output.keep
        self.__cuda_array_interface__ = {
            "data": (output.address, False), "shape": output.shape, "version": 2,
            "typestr": output.dtype.str, "strides": None}

    def __del__(self):
        kernel_calls.release(self.keep)


def as_torch(output):
    """A kernel output as a torch tensor: the lent memory itself, or the host bytes."""
    if output.keep:
        return torch.as_tensor(Lent(output), device="cuda")
    return torch.from_numpy(output.host)


def call(number, device_tensors, host_arrays=(), stream=None):
    """One kernel call, as the compiled kernel makes it, on PyTorch's current stream."""
    inputs = [(t.data_ptr(), _TORCH_DTYPES[t.dtype], tuple(t.shape)) for t in device_tensors]
    inputs += [(a.__array_interface__["data"][0], a.dtype, a.shape) for a in host_arrays]
    if stream is None:
        stream = torch.cuda.current_stream().cuda_stream
    return [as_torch(o) for o in kernel_calls.invoke(number, inputs, True, stream)]


class KernelStep:
    """A dense lookup, its gradient and a LazyAdam update of one table, as three kernel ops
    (check: with the first-step check's flag, the ops' last output)."""

    def __init__(self, table, check=False, replay=False, detach=False):
        self.table, self.check, self.replay, self.detach = table, check, replay, detach
        self.keep = [
            kernel_calls.KernelCall(self._forward, ["device"], ["device", "host"],
                                    [np.float32, np.int64], "forward", check=check),
            kernel_calls.KernelCall(self._backward, ["host", "device"], ["device", "device"],
                                    [np.float32, np.int64], "backward", check=check),
            kernel_calls.KernelCall(self._update, ["device", "device", "host"], ["host"],
                                    np.int64, "update", check=check)]
        self.numbers = [kernel_calls.register(c) for c in self.keep]
        self.flags = []  # per call, its first-step flag (check=True)

    def _forward(self, keys):
        return api.dense_lookup(self.table, "kc_fwd", keys, True, (SLOTS, NNZ),
                                replay=self.replay, detach=self.detach)

    def _backward(self, token, grads):
        return api.dense_lookup_grad(self.table, "kc_bwd", int(token), grads,
                                     detach=self.detach)

    def _update(self, values, rows, hyper):
        return np.int64(update(self.table, values, rows, hyper))

    def step(self, keys, step, stream=None, held=None):
        """One step; held: a list that gets, per op, TensorFlow's side of the first-step
        check (host copies of what the op read and gave, as the py_func gets them)."""
        forward, backward, update_number = self.numbers
        vectors, token = self._op(forward, [keys], [], stream, held)
        top = vectors * 2.0  # PyTorch computes the top gradient on its stream
        values, rows = self._op(backward, [top], [token.numpy()], None, held)
        self._op(update_number, [values, rows], [hyper_array(step)], None, held)
        return vectors, values, rows

    def _op(self, number, tensors, hosts, stream, held):
        outputs = call(number, tensors, hosts, stream)
        if self.check:
            self.flags.append(bool(outputs.pop()))
        if held is not None:
            torch.cuda.synchronize()
            read = [t.cpu().numpy() for t in tensors] + [np.array(a) for a in hosts]
            if number == self.numbers[1]:  # the backward reads its token first
                read = read[::-1]
            held.append((number, read + [o.cpu().numpy() for o in outputs]))
        return outputs


def update(table, values, rows, hyper):
    names = ("lr_t", "beta1", "beta2", "epsilon")
    return api.apply_optimizer_update(table, "lazy_adam", "Adam", {},
                                      dict(zip(names, (float(h) for h in hyper))), values, rows)


def hyper_array(step):
    """LazyAdam's hyper-parameters at 1-based `step` (TensorFlow's lr_t), float32 as they cross."""
    lr_t = 0.01 * (1.0 - 0.999 ** step) ** 0.5 / (1.0 - 0.9 ** step)
    return np.array([lr_t, 0.9, 0.999, 1e-7], np.float32)


def engine_step(cuda, table, keys, step):
    """The same step on engine arrays, with no framework at all."""
    with runtime.entered():  # PyCUDA makes arrays (vectors * 2.0) only with its context
        vectors, token = api.dense_lookup(table, "kc_fwd", cuda.asarray(keys), True,
                                          (SLOTS, NNZ))
        values, rows = api.dense_lookup_grad(table, "kc_bwd", token, vectors * 2.0)
        update(table, values, rows, hyper_array(step))
        return cuda.to_host(vectors), cuda.to_host(values), cuda.to_host(rows)


def assert_equal(tensors, arrays):
    """Each torch tensor equals its NumPy array, bit for bit (no tensor kept here after)."""
    for tensor, expected in zip(tensors, arrays):
        np.testing.assert_array_equal(tensor.cpu().numpy(), expected)


def batches(rng, count):
    size = runtime.get().size
    return [rng.integers(0, ROWS * size, size=(BATCH, SLOTS, NNZ), dtype=np.int64)
            for _ in range(count)]


def new_table(name):
    api.create_table(name, DIM, ROWS, False, SPEC, replace=True)


def table_rows(cuda, table, keys):
    with runtime.entered():
        return cuda.to_host(api.read_rows(table, "kc_read", cuda.asarray(keys.reshape(-1))))


def test_a_step_through_the_kernel_half_equals_the_engines_step(cuda, rng):
    data = batches(rng, 6)
    new_table("kc_table")
    want = [engine_step(cuda, "kc_table", keys, s + 1) for s, keys in enumerate(data)]
    want_rows = table_rows(cuda, "kc_table", np.concatenate(data))
    new_table("kc_table")  # the same start
    kernels = KernelStep("kc_table")
    before = kernel_calls.lent_count()
    for s, keys in enumerate(data):
        assert_equal(kernels.step(torch.from_numpy(keys).cuda(), s + 1), want[s])
    np.testing.assert_array_equal(table_rows(cuda, "kc_table", np.concatenate(data)), want_rows)
    gc.collect()
    assert kernel_calls.lent_count() == before, "an output PyTorch dropped was not given back"


def bounded_reference(cuda, rng, monkeypatch, table, steps):
    """With the bounded step on: `steps` batches, the engine's own steps' outputs on them and
    the rows they leave (data, want, want_rows), the table `table` made anew after."""
    monkeypatch.setenv(bounded_step.ENV, "1")
    data = batches(rng, steps)
    new_table(table)
    want = [engine_step(cuda, table, keys, s + 1) for s, keys in enumerate(data)]
    want_rows = table_rows(cuda, table, np.concatenate(data))
    new_table(table)
    return data, want, want_rows


@pytest.mark.parametrize("detach", [False, True, api.DETACH_HELD])
def test_a_replayed_step_through_the_kernel_half_equals_the_engines_step(cuda, rng,
                                                                         monkeypatch, detach):
    """A session's bounded step replayed through the kernels (graph_ops' dense lookup passes
    replay=True and detach=DETACH_HELD: its output and gradient the class's own arrays while
    nothing holds them past a step; detach=True: copies of their own): the forward and backward
    replay, and the update, handed the backward's lent gradient as PyTorch's tensors (other
    arrays over the same memory), replays too; every output and row equals the uncaptured
    bounded step's."""
    data, want, want_rows = bounded_reference(cuda, rng, monkeypatch, "kc_replayed", 8)
    replayed = []
    original = replayed_step.update
    monkeypatch.setattr(replayed_step, "update", lambda *args: replayed.append(
        original(*args)) or replayed[-1])
    kernels = KernelStep("kc_replayed", replay=True, detach=detach)
    for s, keys in enumerate(data):
        assert_equal(kernels.step(torch.from_numpy(keys).cuda(), s + 1), want[s])
    np.testing.assert_array_equal(table_rows(cuda, "kc_replayed", np.concatenate(data)),
                                  want_rows)
    # the forward's first sight and recording, the backward's recording, then the update's
    # first sight (recorded) and replays
    assert sum(r is not None for r in replayed) >= len(data) - 3
    with runtime.entered() as rt:
        replayed_step.free(rt)


def test_outputs_the_framework_holds_past_a_step_are_never_written(cuda, rng, monkeypatch):
    """detach=DETACH_HELD, what graph_ops passes through the kernels: PyTorch holds each step's
    output and gradient tensors (the engine's own memory, lent) until the next step is done, as
    a queue of one would. Read then, each still holds its own step's values: a replay that
    finds an array of its class held runs uncaptured, the class hands out copies from then on
    and replays again, its update too; the table ends as the engine's own step leaves it."""
    data, want, want_rows = bounded_reference(cuda, rng, monkeypatch, "kc_held", 10)
    counted = {"held": 0, "update": 0}

    def counting(original, what):
        def counted_call(*args):
            result = original(*args)
            counted[what] += result if what == "held" else result is not None
            return result
        return counted_call
    monkeypatch.setattr(replayed_step, "_found_held", counting(replayed_step._found_held, "held"))
    monkeypatch.setattr(replayed_step, "update", counting(replayed_step.update, "update"))
    kernels = KernelStep("kc_held", replay=True, detach=api.DETACH_HELD)
    before = kernel_calls.lent_count()
    held = None
    for s, keys in enumerate(data):
        got = kernels.step(torch.from_numpy(keys).cuda(), s + 1)
        if held is not None:  # the step before's tensors, read after this step ran
            assert_equal(held, want[s - 1])
        held = got
        if s == 3:
            updates_before_held = counted["update"]
    assert_equal(held, want[-1])
    del held, got
    np.testing.assert_array_equal(table_rows(cuda, "kc_held", np.concatenate(data)), want_rows)
    assert counted["held"] >= 2  # the forward's output, then the backward's
    assert counted["update"] > updates_before_held  # copies, handed back, replay the update
    gc.collect()
    assert kernel_calls.lent_count() == before
    with runtime.entered() as rt:
        replayed_step.free(rt)


def _late_keys(stream, keys):
    """Keys that `stream` writes only after a long spinning kernel."""
    with torch.cuda.stream(stream):
        late = torch.zeros_like(keys)
        torch.cuda._sleep(SLEEP_CYCLES)
        late.copy_(keys)
    return late


def test_keys_the_framework_stream_is_still_writing_are_waited_for(cuda, rng):
    keys = batches(rng, 1)[0]
    new_table("kc_late")
    want = engine_step(cuda, "kc_late", keys, 1)
    new_table("kc_late")
    kernels = KernelStep("kc_late")
    side = torch.cuda.Stream()  # PyTorch's side streams do not wait for the default stream
    source = torch.from_numpy(keys).cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        got = kernels.step(_late_keys(side, source), 1)
        side.synchronize()
    assert_equal(got, want)


def test_without_the_op_stream_the_engine_would_read_too_early(cuda, rng):
    # The control for the test above: handed the default stream instead of the one writing the
    # keys, the engine reads them before they are written, so the test above can fail.
    keys = batches(rng, 1)[0] + 1  # no zero key: a key read too early is zero
    new_table("kc_early")
    kernels = KernelStep("kc_early")
    side = torch.cuda.Stream()
    source = torch.from_numpy(keys).cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        late = _late_keys(side, source)
        forward = kernels.numbers[0]
        vectors, _ = call(forward, [late], stream=0)
    torch.cuda.synchronize()
    new_table("kc_early")
    zeros = engine_step(cuda, "kc_early", np.zeros_like(keys), 1)[0]
    assert (vectors.cpu().numpy().reshape(-1, DIM) == zeros.reshape(-1, DIM)[0]).all(
        axis=1).any()


def test_outputs_are_the_engines_memory_and_inputs_are_read_in_place(cuda):
    seen = {}
    made = cuda.asarray(np.arange(64 * 4, dtype=np.float32).reshape(64, 4))

    def function(values):
        seen["input"] = int(values.gpudata)
        return made

    kept = kernel_calls.KernelCall(function, ["device"], ["device"], np.float32, "lend")
    number = kernel_calls.register(kept)
    source = torch.ones(10, device="cuda")
    out, = call(number, [source])
    assert seen["input"] == source.data_ptr()
    assert out.data_ptr() == int(made.gpudata), "the output was copied"
    np.testing.assert_array_equal(out.cpu().numpy(), np.arange(256).reshape(64, 4))


def test_host_outputs_come_back_as_bytes_in_host_memory(cuda):
    kept = kernel_calls.KernelCall(lambda: (np.int64(42), np.arange(3, dtype=np.int64)), [],
                                   ["host", "host"], [np.int64, np.int64], "host_values")
    token, counts = call(kernel_calls.register(kept), [])
    assert not token.is_cuda and int(token) == 42 and counts.tolist() == [0, 1, 2]


def test_a_host_pointer_given_as_a_device_input_is_refused(cuda):
    kept = kernel_calls.KernelCall(lambda keys: keys, ["device"], ["device"], np.int64,
                                   "misplaced")
    host = np.arange(8, dtype=np.int64)
    with pytest.raises(RuntimeError, match="not in the memory of sok1x's GPU"):
        kernel_calls.invoke(kernel_calls.register(kept),
                            [(host.__array_interface__["data"][0], host.dtype, host.shape)],
                            True, 0)


def test_the_first_step_check_on_a_gpu(cuda, rng, monkeypatch):
    for key, value in (("fallback", False), ("asked", None), ("said", False)):
        monkeypatch.setitem(kernel_calls._seam, key, value)
    data = batches(rng, 3)
    new_table("kc_check")
    want = [engine_step(cuda, "kc_check", keys, s + 1) for s, keys in enumerate(data)]
    new_table("kc_check")
    kernels = KernelStep("kc_check", check=True)
    held = []
    assert_equal(kernels.step(torch.from_numpy(data[0]).cuda(), 1, held=held), want[0])
    assert kernels.flags == [True, True, True]  # each op's first call
    for number, values in held:  # TensorFlow's copies equal what the kernel half kept
        assert kernel_calls.compare_first_step(number, values) is None
    assert not kernel_calls.fallen_back()
    # A difference (here made on purpose) falls back to host staging, which gives the same.
    kept = kernels.keep[0]
    kept.first_done, kept.first_seen = False, None
    assert_equal(kernels.step(torch.from_numpy(data[1]).cuda(), 2, held=held), want[1])
    number, values = held[3]
    values[0] = values[0] + 1
    with pytest.warns(RuntimeWarning, match="first-step check"):
        assert "input 0 holds other bytes" in kernel_calls.compare_first_step(number, values)
    assert kernel_calls.fallen_back()
    side = torch.cuda.Stream()
    source = torch.from_numpy(data[2]).cuda()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):  # staging waits for the whole device: any stream is safe
        got = kernels.step(_late_keys(side, source), 3, stream=0)
        side.synchronize()
    assert_equal(got, want[2])
