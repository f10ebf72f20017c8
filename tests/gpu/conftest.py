"""Fixtures the GPU tests share: the engine (one Runtime per test module), the cuda backend on
its own, and per-test random generators.

SOK1X_TEST_SEED fixes the random data (default: from the clock; the seed in use is printed);
SOK1X_TEST_DEVICE picks the GPU of the `cuda` fixture (the engine picks one GPU per rank).
"""
import os
import time
import zlib

import numpy as np
import pytest

SEED = int(os.environ.get("SOK1X_TEST_SEED", str(int(time.time()) % 100000)))


def skip_without_gpu():
    """Skips the calling test (or module, from a module fixture) where no GPU can be used."""
    from sok1x.backend import cuda_available
    ok, reason = cuda_available()
    if not ok:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def engine(request):
    """The engine's Runtime on the backend the test module names in BACKEND (default "cuda"),
    one rank per process of the job; skips the module where that is cuda and no GPU is seen."""
    from sok1x.engine import runtime
    backend = getattr(request.module, "BACKEND", "cuda")
    if backend == "cuda":
        skip_without_gpu()
    rt = runtime.init(backend=backend)
    assert rt.backend.NAME == backend
    return rt


@pytest.fixture(scope="module")
def cuda():
    """The cuda backend module with GPU $SOK1X_TEST_DEVICE (default 0) current, no engine."""
    skip_without_gpu()
    from sok1x.backend import cuda as backend
    from sok1x.backend.cuda import context as cuda_context
    cuda_context.activate(int(os.environ.get("SOK1X_TEST_DEVICE", "0")))
    print("\nsok1x GPU tests: seed %d, GPU %d" % (SEED, cuda_context.device_ordinal()))
    return backend


@pytest.fixture
def rng(request):
    """A NumPy generator seeded by SEED and the test's name."""
    return np.random.default_rng([SEED, zlib.crc32(request.node.name.encode())])
