"""The cuda optimizer update kernels (cuda_kernels/optimizers.cu via sok1x.backend.cuda.optimizers)
against the cpu ones (sok1x.backend.cpu.optimizers, checked against TensorFlow in tests/mpi), kernel
by kernel on random shards, then the engine's whole update (duplicate rows summed, slots created)
on the cuda backend against the cpu backend. Needs a GPU and PyCUDA, not TensorFlow.

SOK1X_TEST_SEED fixes the data (the seed in use is printed); SOK1X_TEST_DEVICE picks the GPU.
"""

import numpy as np
import pytest

pytest.importorskip("pycuda")

from sok1x.backend import cpu  # noqa: E402
from sok1x.backend.cpu import optimizers as cpu_optimizers  # noqa: E402
from sok1x.engine.tables import optimizer_updates  # noqa: E402

RTOL, ATOL = 2e-5, 2e-6
UPDATE_NAMES = ["update_sgd", "update_momentum", "update_keras_momentum", "update_adagrad",
                "update_ftrl", "update_rmsprop", "update_lazy_adam", "update_adam_all_rows",
                "update_keras_rmsprop_all_rows", "update_adamax", "update_adadelta"]


@pytest.fixture(scope="module")
def gpu(cuda):
    """The cuda backend (conftest's, GPU current) and its optimizer kernels."""
    from sok1x.backend.cuda import optimizers as cuda_optimizers
    return cuda, cuda_optimizers


def state(rng, kind, shape):
    """A state array of `kind`: w (any sign), pos (> 0), ms / mg (centered RMSProp's, so that
    ms - mg^2 > 0), none (absent)."""
    if kind == "none":
        return None
    if kind == "w":
        return rng.standard_normal(shape).astype(np.float32)
    low, high = {"pos": (0.05, 1.0), "ms": (1.0, 2.0), "mg": (-0.3, 0.3)}[kind]
    return rng.uniform(low, high, shape).astype(np.float32)


# kernel, kinds of its state arrays (var first), hyper-parameters after (rows, grads)
CASES = {
    "sgd": ("update_sgd", ["w"], (0.3,)),
    "momentum": ("update_momentum", ["w", "w"], (0.1, 0.9, False)),
    "momentum_nesterov": ("update_momentum", ["w", "w"], (0.1, 0.9, True)),
    "keras_momentum": ("update_keras_momentum", ["w", "w"], (0.1, 0.9, False)),
    "keras_momentum_nesterov": ("update_keras_momentum", ["w", "w"], (0.1, 0.9, True)),
    "adagrad_v1": ("update_adagrad", ["w", "pos"], (0.1, 0.0)),
    "adagrad_keras": ("update_adagrad", ["w", "pos"], (0.1, 1e-7)),
    "ftrl": ("update_ftrl", ["w", "pos", "w"], (0.2, -0.5, 0.01, 0.02, 0.0)),
    "ftrl_power_shrinkage": ("update_ftrl", ["w", "pos", "w"], (0.2, -0.7, 0.01, 0.02, 0.05)),
    "rmsprop": ("update_rmsprop", ["w", "pos", "w", "none"], (0.01, 0.9, 0.5, 1e-7)),
    "rmsprop_centered": ("update_rmsprop", ["w", "ms", "w", "mg"], (0.01, 0.9, 0.5, 1e-7)),
    "lazy_adam": ("update_lazy_adam", ["w", "w", "pos"], (0.01, 0.9, 0.999, 1e-7)),
    "adam": ("update_adam_all_rows", ["w", "w", "pos", "none"], (0.01, 0.9, 0.999, 1e-7)),
    "adam_amsgrad": ("update_adam_all_rows", ["w", "w", "pos", "pos"], (0.01, 0.9, 0.999, 1e-7)),
    "keras_rmsprop": ("update_keras_rmsprop_all_rows", ["w", "pos", "none"], (0.01, 0.9, 1e-7)),
    "keras_rmsprop_centered": ("update_keras_rmsprop_all_rows", ["w", "ms", "mg"],
                               (0.01, 0.9, 1e-7)),
    "adamax": ("update_adamax", ["w", "w", "pos"], (0.01, 0.9, 0.999, 1e-7)),
    "adadelta": ("update_adadelta", ["w", "pos", "pos"], (1.0, 0.95, 1e-7)),
}
# the last three: more positions than a row kernel's grid has threads (a thread walks several),
# rows of 16 quads (a shift finds a position's row), of 12 (a division), and of 33 elements
SHAPES = [(50, 8, 20), (1000, 1, 999), (300, 33, 0), (20000, 128, 5000), (200000, 16, 30000),
          (300000, 64, 100000), (200000, 48, 60000), (200000, 33, 60000)]


def test_cuda_backend_exposes_the_update_kernels(gpu):
    cuda, _ = gpu
    missing = [name for name in UPDATE_NAMES if not hasattr(cuda, name) or not hasattr(cpu, name)]
    assert not missing, "add to the backend op set (re-export from *_optimizers): %s" % missing


@pytest.mark.parametrize("capacity,dim,n", SHAPES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_matches_cpu(gpu, rng, case, capacity, dim, n):
    cuda, cuda_optimizers = gpu
    kernel, kinds, hyper = CASES[case]
    host_states = [state(rng, kind, (capacity, dim)) for kind in kinds]
    rows = rng.choice(capacity, size=n, replace=False).astype(np.int64)
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    device_states = [None if s is None else cuda.asarray(s) for s in host_states]
    getattr(cpu_optimizers, kernel)(*host_states, rows, grads, *hyper)
    getattr(cuda_optimizers, kernel)(*device_states, cuda.asarray(rows), cuda.asarray(grads),
                                     *hyper)
    # FTRL's linear state takes the difference of two powf terms (each within 2 ulp of NumPy's
    # pow), which cancels: at lr_power -0.7 one element in millions lands 3e-6 off
    atol = 1e-5 if case.startswith("ftrl") else ATOL
    for index, (want, got) in enumerate(zip(host_states, device_states)):
        if want is not None:
            np.testing.assert_allclose(cuda.to_host(got), want, rtol=RTOL, atol=atol,
                                       err_msg="%s: state %d" % (case, index))


def test_int32_host_rows_and_grads_are_accepted(gpu, rng):
    cuda, cuda_optimizers = gpu
    var = rng.standard_normal((10, 4)).astype(np.float32)
    rows = np.array([7, 2, 5], dtype=np.int32)
    grads = rng.standard_normal((3, 4)).astype(np.float32)
    device_var = cuda.asarray(var)
    cuda_optimizers.update_sgd(device_var, rows, grads, 0.5)
    cpu_optimizers.update_sgd(var, rows.astype(np.int64), grads, 0.5)
    np.testing.assert_allclose(cuda.to_host(device_var), var, rtol=RTOL, atol=ATOL)


def test_rows_of_four_go_four_elements_to_a_thread(gpu, rng, monkeypatch):
    """LazyAdam and Adagrad take the *_x4 kernels where dim % 4 == 0 and every array is 16-byte
    aligned (a gradient one element into its block is not), and agree with cpu either way,
    padded rows included."""
    from sok1x.backend.cuda import context as cuda_context
    cuda, cuda_optimizers = gpu
    chosen, kernel = [], cuda_optimizers._kernel
    monkeypatch.setattr(cuda_optimizers, "_kernel",
                        lambda name, formats: chosen.append(name) or kernel(name, formats))
    for dim, offset in ((12, 0), (12, 1), (6, 0)):
        for name, kinds, hyper in (CASES["lazy_adam"], CASES["adagrad_keras"]):
            host_states = [state(rng, kind, (500, dim)) for kind in kinds]
            rows = rng.choice(500, size=300, replace=False).astype(np.int64)
            rows[::7] = -1
            grads = rng.standard_normal((300 * dim + offset,)).astype(np.float32)
            with cuda_context.entered():  # PyCUDA makes a view with the context current
                device_grads = cuda.asarray(grads)[offset:].reshape(300, dim)
            device_states = [cuda.asarray(s) for s in host_states]
            getattr(cpu_optimizers, name)(*host_states, rows, grads[offset:].reshape(300, dim),
                                          *hyper)
            getattr(cuda_optimizers, name)(*device_states, cuda.asarray(rows), device_grads,
                                           *hyper)
            for want, got in zip(host_states, device_states):
                np.testing.assert_allclose(cuda.to_host(got), want, rtol=RTOL, atol=ATOL)
    assert chosen == ["update_lazy_adam_x4", "update_adagrad_x4", "update_lazy_adam",
                      "update_adagrad", "update_lazy_adam", "update_adagrad"]


def test_given_hyper_parameters_are_written_by_one_launch(gpu):
    """write_given puts the values where a replayed update reads them (optimizers.cu's
    write_hyper), or refuses values that do not fit the array and writes nothing."""
    cuda, cuda_optimizers = gpu
    given = cuda.asarray(np.zeros(6, np.float32))
    values = np.float32([0.5, 0.9, 0.999, 1e-8, -3.0, 7.25])
    cuda_optimizers.write_given(given, values)
    for wrong in ([1.0] * 5, [1.0] * 7):
        with pytest.raises(ValueError, match="write_given"):
            cuda_optimizers.write_given(given, wrong)
    np.testing.assert_array_equal(cuda.to_host(given), values)
    with pytest.raises(TypeError, match="GPUArray"):
        cuda_optimizers.write_given(np.zeros(6, np.float32), values)


def test_state_on_the_host_or_misshaped_is_refused(gpu):
    cuda, cuda_optimizers = gpu
    var = cuda.zeros((4, 2), np.float32)
    rows, grads = np.array([1], np.int64), np.ones((1, 2), np.float32)
    with pytest.raises(TypeError, match="GPUArray"):
        cuda_optimizers.update_sgd(np.zeros((4, 2), np.float32), rows, grads, 0.1)
    with pytest.raises(ValueError, match="accum"):
        cuda_optimizers.update_adagrad(var, cuda.zeros((3, 2), np.float32), rows, grads, 0.1, 0.0)
    with pytest.raises(ValueError, match="grads"):
        cuda_optimizers.update_sgd(var, rows, np.ones((1, 3), np.float32), 0.1)


# ---- the engine's update on each backend ------------------------------------------------------

class Shard:
    """The part of EmbeddingTable an update uses: name, dim, capacity, values, slot(),
    apply_update() and stamp()."""

    def __init__(self, backend, values):
        self.backend = backend
        self.name = "shard"
        self.capacity, self.dim = values.shape
        self.values = backend.asarray(values.copy())
        self.slots = {}

    def slot(self, name, initial_value=0.0):
        if name not in self.slots:
            self.slots[name] = self.backend.asarray(
                np.full((self.capacity, self.dim), initial_value, np.float32))
        return self.slots[name]

    def apply_update(self, update, slots, rows, grads, hyper, options):
        update(self.backend, self.values, slots, rows, grads, hyper, options)

    def stamp(self, rows):
        """Update times are not what these tests check."""


RULES = {
    "sgd": ({"lr": 0.2}, {}),
    "momentum": ({"lr": 0.1, "momentum": 0.9}, {"nesterov": True}),
    "keras_momentum": ({"lr": 0.1, "momentum": 0.9}, {"nesterov": False}),
    "adagrad": ({"lr": 0.1, "epsilon": 1e-7}, {"initial_accumulator": 0.1}),
    "ftrl": ({"lr": 0.2, "lr_power": -0.5, "l1": 0.01, "l2": 0.01, "l2_shrinkage": 0.0},
             {"initial_accumulator": 0.1}),
    "rmsprop": ({"lr": 0.01, "rho": 0.9, "momentum": 0.5, "epsilon": 1e-7},
                {"initial_rms": 1.0, "centered": True}),
    "keras_rmsprop": ({"lr": 0.01, "rho": 0.9, "epsilon": 1e-7}, {"centered": False}),
    "adam": ({"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}, {"amsgrad": True}),
    "lazy_adam": ({"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}, {}),
    "adamax": ({"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}, {}),
    "adadelta": ({"lr": 1.0, "rho": 0.95, "epsilon": 1e-7}, {}),
    # TF 2.11+ Keras SGD (momentum), Adamax, Adadelta and Ftrl: the rules on every row
    "keras_momentum_all_rows": ({"lr": 0.1, "momentum": 0.9}, {"nesterov": True}),
    "adamax_all_rows": ({"lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7}, {}),
    "adadelta_all_rows": ({"lr": 1.0, "rho": 0.5, "epsilon": 1e-7}, {}),
    "ftrl_all_rows": ({"lr": 0.2, "lr_power": -0.5, "l1": 0.01, "l2": 0.01,
                       "l2_shrinkage": 0.1}, {"initial_accumulator": 0.1}),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_engine_update_on_cuda_matches_cpu(gpu, rng, rule):
    cuda, _ = gpu
    hyper, options = RULES[rule]
    initial = rng.standard_normal((5000, 16)).astype(np.float32)
    want, got = Shard(cpu, initial), Shard(cuda, initial)
    for _ in range(3):
        rows = rng.integers(0, 5000, size=4000).astype(np.int64)  # many repeats
        values = rng.standard_normal((4000, 16)).astype(np.float32)
        counts = [optimizer_updates.apply_update(shard.backend, shard, rule, "Opt", options,
                                                 hyper, values, rows) for shard in (want, got)]
        assert counts == [np.unique(rows).shape[0]] * 2
    np.testing.assert_allclose(cuda.to_host(got.values), want.values, rtol=1e-4, atol=1e-5)
    assert sorted(got.slots) == sorted(want.slots) == sorted(
        "Opt/" + name for name in optimizer_updates.slot_names(rule, options))
    for name in want.slots:
        np.testing.assert_allclose(cuda.to_host(got.slots[name]), want.slots[name], rtol=1e-4,
                                   atol=1e-5, err_msg=name)


# ---- padded rows (DESIGN D14: a step's buffers sized by its keys, not its rows) -------------

PADDED_HYPER = {"lr": 0.1, "lr_t": 0.01, "beta1": 0.9, "beta2": 0.999, "epsilon": 1e-7,
                "momentum": 0.9, "rho": 0.9, "lr_power": -0.5, "l1": 0.01, "l2": 0.02,
                "l2_shrinkage": 0.05}
PADDED_OPTIONS = {"nesterov": True, "initial_accumulator": 0.1, "initial_rms": 1.0,
                  "centered": True, "amsgrad": True}


# (capacity, dim, rows, padded length): the last two make every thread of a row kernel's grid
# (at most 21 blocks of 256 a multiprocessor) walk several positions, the row of the next read
# ahead, a power-of-two row of quads (dim 128) and one of 12 quads (dim 48, found by division)
PADDED_SHAPES = [(3000, 16, 700, 1024), (300000, 128, 90000, 250000),
                 (200000, 48, 150000, 400000)]


@pytest.mark.parametrize("capacity,dim,n,padded", PADDED_SHAPES)
@pytest.mark.parametrize("rule", sorted(optimizer_updates.RULES))
def test_padded_rows_are_skipped(gpu, rng, rule, capacity, dim, n, padded):
    """Each rule's update over rows padded with -1 (junk gradients beside them) equals, bit for
    bit on the GPU, its update over the rows alone; the shard's last row is never written."""
    cuda, _ = gpu
    update = optimizer_updates.RULES[rule].update
    rows = rng.choice(capacity - 1, size=n, replace=False).astype(np.int64)
    grads = rng.standard_normal((n, dim)).astype(np.float32)
    places = np.sort(rng.choice(padded, size=n, replace=False))
    padded_rows = np.full(padded, -1, np.int64)
    padded_grads = rng.standard_normal((padded, dim)).astype(np.float32) * 1e3
    padded_rows[places], padded_grads[places] = rows, grads
    var = rng.standard_normal((capacity, dim)).astype(np.float32)
    slots = {name: rng.uniform(1.0, 2.0, (capacity, dim)).astype(np.float32)
             for name, _ in optimizer_updates.RULES[rule].slots(PADDED_OPTIONS)}
    results = []
    for update_rows, update_grads in ((rows, grads), (padded_rows, padded_grads)):
        device_var = cuda.asarray(var)
        device_slots = {name: cuda.asarray(s) for name, s in slots.items()}
        update(cuda, device_var, device_slots, cuda.asarray(update_rows),
               cuda.asarray(update_grads), PADDED_HYPER, PADDED_OPTIONS)
        results.append([cuda.to_host(device_var)] + [cuda.to_host(device_slots[name])
                                                     for name in sorted(slots)])
    for index, (want, got) in enumerate(zip(*results)):
        assert got.tobytes() == want.tobytes(), "%s: state %d" % (rule, index)
    if not rule.endswith("_all_rows") and rule != "adam" and rule != "keras_rmsprop":
        assert results[1][0][-1].tobytes() == var[-1].tobytes()
